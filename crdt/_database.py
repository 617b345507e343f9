"""The trio face of a replica: group commit, worker threads, change notification.

Every blocking step (log writes and their fsync, SQLite) runs in a worker
thread; writes are serialised. Appends are group-committed: appends that
arrive while a write is in progress wait, then go to disk together in one
batch with one fsync, so many concurrent writers pay for few fsyncs and each
``append`` still returns only once its entry is durable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from p2p.keys import KeyPair

from ._base import ApplyReport, Base, WriterChange, WriterStatus
from ._entries import EntryId
from ._log import FsyncPolicy, Head
from ._metrics import DatabaseMetrics
from ._view import View

__all__ = ["Database"]

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Entries committed together at most; the rest wait for the next commit.
MAX_GROUP = 4096


@dataclass(eq=False)
class _PendingAppend:
    ops: Sequence[Sequence[Any]]
    done: bool = False
    result: EntryId | None = None
    error: BaseException | None = None


class Database:
    """A replica of the shared database, for trio code. Build with :meth:`open`."""

    def __init__(self, base: Base) -> None:
        self.base = base
        self._write_lock = trio.Lock()
        self._queue: list[_PendingAppend] = []
        self._changed = trio.Event()
        self._committed = trio.Event()  # set (and replaced) after every write
        self._closed = False
        #: Replicated state, refreshed after every write: read from any task
        #: without touching the base while a worker thread changes it.
        self.lengths: dict[bytes, int] = base.lengths()
        self.wanted: frozenset[bytes] = frozenset(base.wanted())
        self.peer_count = 0
        self.metrics = DatabaseMetrics(
            count_writers=lambda: sum(w.admitted for w in self._writers_snapshot),
            count_entries=lambda: sum(self.lengths.values()),
            count_waiting=lambda: self.base.gate.waiting,
            count_peers=lambda: self.peer_count,
        )
        self._writers_snapshot: list[WriterStatus] = base.writers()
        self._refused_seen = 0
        self._rebuilds_seen = base.rebuilds

    @classmethod
    async def open(cls, storage: str | os.PathLike[str], keypair: KeyPair, *,
                   bootstrap: bytes | None = None,
                   fsync: FsyncPolicy = FsyncPolicy.ALWAYS) -> Database:
        """Open (or create) the replica in ``storage``; see :meth:`Base.open`."""
        base = await trio.to_thread.run_sync(
            lambda: Base.open(storage, keypair, bootstrap=bootstrap, fsync=fsync))
        return cls(base)

    # -- identity -----------------------------------------------------------------------

    @property
    def bootstrap(self) -> bytes:
        return self.base.bootstrap

    @property
    def key(self) -> bytes:
        return self.base.key

    @property
    def is_writer(self) -> bool:
        return self.base.admission.is_writer(self.key)

    @property
    def is_admin(self) -> bool:
        return self.base.admission.is_admin(self.key)

    def writers(self) -> list[WriterStatus]:
        return list(self._writers_snapshot)

    # -- writing ------------------------------------------------------------------------

    async def append(self, ops: Sequence[Sequence[Any]]) -> EntryId:
        """Append one entry holding ``ops``; return once it is durable and in the view.

        Raises:
            WriteRefused: this replica may not write these ops (see
                :meth:`Base.append`); nothing was written.
        """
        self.base.check_writable([ops])  # refuse one caller's bad ops, not the whole group
        item = _PendingAppend(ops)
        self._queue.append(item)
        try:
            while not item.done:
                if self._write_lock.locked():
                    # A write is on disk's way; the next commit takes us along. One
                    # event for all waiters, not a lock hand-off per waiter.
                    await self._committed.wait()
                    continue
                async with self._write_lock:
                    if not item.done:
                        # Let the tasks the last commit woke queue their next
                        # appends first: they join this group, not the next.
                        await trio.lowlevel.checkpoint()
                        await self._commit_pending()
        except trio.Cancelled:
            if not item.done and item in self._queue:
                self._queue.remove(item)  # never written: cancelling it is clean
            raise
        if item.error is not None:
            raise item.error
        assert item.result is not None
        return item.result

    async def _commit_pending(self) -> None:
        group = self._queue[:MAX_GROUP]
        del self._queue[:MAX_GROUP]
        try:
            ids = await trio.to_thread.run_sync(
                lambda: self.base.append([i.ops for i in group], validated=True))
        except BaseException as exc:
            for item in group:
                item.done, item.error = True, exc
            if not isinstance(exc, Exception):
                raise
        else:
            for item, where in zip(group, ids, strict=True):
                item.done, item.result = True, where
            self.metrics.appended.inc(len(group))
            self.metrics.append_batches.inc()
        finally:
            self._after_write()

    async def append_many(self, batch: Sequence[Sequence[Sequence[Any]]]) -> list[EntryId]:
        """Append one entry per element of ``batch``, all in one durable write."""
        self.base.check_writable(batch)
        async with self._write_lock:
            try:
                ids = await trio.to_thread.run_sync(self.base.append, batch)
            finally:
                self._after_write()
        self.metrics.appended.inc(len(ids))
        self.metrics.append_batches.inc()
        return ids

    async def change_writer(self, action: str, writer: bytes, *,
                            admin: bool = False) -> WriterChange:
        """Add or remove a writer as this admin (see :meth:`Base.change_writer`)."""
        async with self._write_lock:
            try:
                change = await trio.to_thread.run_sync(
                    lambda: self.base.change_writer(action, writer, admin=admin))
            finally:
                self._after_write()
        if change.entry is not None:
            self.metrics.appended.inc()
            self.metrics.append_batches.inc()
        return change

    async def ingest(self, writer: bytes, start: int, payloads: Sequence[bytes],
                     head: Head) -> ApplyReport:
        """Store and apply entries a peer sent (see :meth:`Base.ingest`)."""
        async with self._write_lock:
            before = self.lengths.get(writer, 0)
            try:
                report = await trio.to_thread.run_sync(
                    self.base.ingest, writer, start, payloads, head)
            except Exception as exc:
                self.metrics.refused.labels(getattr(exc, "code", "ERROR")).inc(len(payloads))
                raise
            finally:
                self._after_write()
        self.metrics.ingested.inc(max(0, self.lengths.get(writer, 0) - before))
        return report

    def _after_write(self) -> None:
        base = self.base
        self.lengths = base.lengths()
        self.wanted = frozenset(base.wanted())
        self._writers_snapshot = base.writers()
        refused = base.gate.refused
        if refused > self._refused_seen:
            self.metrics.refused.labels("INVALID_ENTRY").inc(refused - self._refused_seen)
            self._refused_seen = refused
        if base.rebuilds > self._rebuilds_seen:
            self.metrics.rebuilds.inc(base.rebuilds - self._rebuilds_seen)
            self._rebuilds_seen = base.rebuilds
        self._changed.set()
        self._changed = trio.Event()
        self._committed.set()
        self._committed = trio.Event()

    # -- reading ------------------------------------------------------------------------

    async def segment(self, writer: bytes, start: int,
                      max_bytes: int) -> tuple[list[bytes], Head | None]:
        """Entries of ``writer``'s log from ``start`` for a peer (see :meth:`Base.segment`)."""
        return await trio.to_thread.run_sync(self.base.segment, writer, start, max_bytes)

    async def read(self, query: Callable[[View], T]) -> T:
        """Run ``query(view)`` in a worker thread, e.g. ``await db.read(lambda v: v.models())``."""
        return await trio.to_thread.run_sync(self.base.read_view, query)

    async def wait_changed(self, known: dict[bytes, int], timeout_s: float) -> dict[bytes, int]:
        """Our lengths, as soon as they differ from ``known`` or after ``timeout_s``."""
        with trio.move_on_after(timeout_s):
            while self.lengths == known:
                await self._changed.wait()
        return self.lengths

    async def rebuild(self) -> int:
        async with self._write_lock:
            try:
                return await trio.to_thread.run_sync(self.base.rebuild)
            finally:
                self._after_write()

    # -- closing ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the logs and the view once the write in progress (if any) ends."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            async with self._write_lock:
                await trio.to_thread.run_sync(self.base.close)

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
