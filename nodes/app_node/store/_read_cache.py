"""Answers of the hot reads, kept while the store is unchanged since they were read.

A listing's session check (the token, its user), the caller's role and the
page of job records were a trip to a worker thread per request (a tenth of a
listing's CPU, and the wait for the thread). They are cached here and served
from the event loop (:func:`cache_only`), never older than the store.

Why it is never stale: every change goes through
:meth:`~._connection.Connection.write`, which bumps the connection's
``generation`` as it begins (before any statement) and again as it ends.
Answers are put under the connection's lock (no change in progress) tagged
with the generation then, and are served only while the generation is still
that one: once a change has begun (a token revoked, a role changed, a user
disabled, a job added or deleted) every answer kept before it is a miss, so
the next read goes to SQLite. One process owns the file (app-node's daemon);
nothing else writes it while it runs.

A token's expiry is the one thing that changes without a write: a kept token
is served only while ``now`` is before its ``expires_at``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["MISS", "NotCached", "ReadCache", "cache_only"]

#: What :meth:`ReadCache.get` answers for a key it does not hold (None is an answer).
MISS: Any = object()

_cache_only: ContextVar[bool] = ContextVar("app_node_store_cache_only", default=False)


class NotCached(Exception):
    """Inside :func:`cache_only`: the store would have to read SQLite (or write)."""


@contextmanager
def cache_only() -> Iterator[None]:
    """Store calls inside answer from the :class:`ReadCache` or raise :class:`NotCached`
    before touching SQLite (the event loop may call them: nothing blocks). Only
    around synchronous code: a trip to a thread inside would carry the flag."""
    token = _cache_only.set(True)
    try:
        yield
    finally:
        _cache_only.reset(token)


def check_may_block() -> None:
    """Raises :class:`NotCached` inside :func:`cache_only` (before SQLite is touched)."""
    if _cache_only.get():
        raise NotCached


class ReadCache:
    """Kept answers of one connection's generation (see the module doc).

    Args:
        db: the connection whose ``generation`` says whether answers are current.
        max_entries: answers kept at most (all forgotten past it: a new
            generation refills them in a request each).
    """

    def __init__(self, db: Connection, *, max_entries: int = 20_000) -> None:
        self._db = db
        self.max_entries = max_entries
        self._generation = -1
        self._entries: dict[Hashable, Any] = {}

    def get(self, key: Hashable) -> Any:
        """The answer kept for ``key`` if the store is unchanged since; else :data:`MISS`."""
        if self._generation != self._db.generation:
            return MISS
        return self._entries.get(key, MISS)

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` (frozen: it is shared) as ``key``'s answer. Call it under the
        connection's lock, right after reading ``value``; inside a change it is not
        kept (the change may not commit)."""
        if self._db.writing:
            return
        generation = self._db.generation
        if generation != self._generation or len(self._entries) >= self.max_entries:
            # A new dict, then the generation: get() never pairs the new generation with
            # the old answers.
            self._entries = {}
            self._generation = generation
        self._entries[key] = value

    def __len__(self) -> int:
        return len(self._entries) if self._generation == self._db.generation else 0
