"""API keys in memory: no SQLite query on the request path, revocations seen within a second.

Theory of operation
-------------------
The shared database stores only a hash of each secret (``crdt.hash_secret``),
so the cache is keyed by that hash: a request hashes its bearer secret
(BLAKE2b, about a microsecond) and looks it up in a dict. A miss asks the
replica once (``Database.api_key_by_secret``, in a worker thread, at most
``MAX_LOOKUPS`` at a time) and remembers the answer, found or not; requests
with the same secret that arrive meanwhile wait for that one lookup.

Freshness: :meth:`KeyCache.run` waits for the replica's logs to change
(``Database.wait_changed``). A change by any writer other than the proxy
itself (app-node put or revoked a key; the proxy's own usage appends change
nothing here) clears the negative answers and re-reads every cached key by
id in one worker-thread call, then swaps the new table in. So a revocation is
refused as soon as it has replicated and that one read has run (milliseconds);
requests in between see the old table, never a half-updated one. A lookup
that started before a change does not store its (possibly stale) answer.

Bounds: at most ``max_entries`` answers (positive and negative together);
beyond it the oldest are forgotten (a miss costs one query, nothing else).
"""

from __future__ import annotations

import hmac
import logging
from collections import OrderedDict

import trio

from crdt import ApiKey, Database, hash_secret

__all__ = ["KeyCache"]

log = logging.getLogger(__name__)

#: Database lookups for unknown secrets at once; more wait (a flood of bad
#: keys queues here instead of filling the thread pool).
MAX_LOOKUPS = 4
#: Longest wait for the database to change before looking again (the loop
#: also wakes on every change).
WATCH_S = 30.0


class KeyCache:
    """The API keys requests present, cached by secret hash (see the module doc).

    Args:
        db: the proxy's replica of the shared database.
        max_entries: answers kept at most.
    """

    def __init__(self, db: Database, *, max_entries: int = 65_536) -> None:
        self.db = db
        self.max_entries = max_entries
        #: secret hash → the key (revoked ones included) or None (unknown).
        self._answers: OrderedDict[bytes, ApiKey | None] = OrderedDict()
        self._inflight: dict[bytes, trio.Event] = {}
        self._limiter = trio.CapacityLimiter(MAX_LOOKUPS)
        #: Bumped on every refresh; a lookup that began under an older one is not stored.
        self.generation = 0
        self.hits = 0
        self.misses = 0
        self.refreshes = 0

    def lookup_nowait(self, secret: str) -> ApiKey | None:
        """The cached answer for ``secret``.

        Raises:
            trio.WouldBlock: nothing cached; call :meth:`lookup`.
        """
        digest = hash_secret(secret)
        try:
            key = self._answers[digest]
        except KeyError:
            raise trio.WouldBlock from None
        if key is not None and not hmac.compare_digest(key.secret_hash, digest):
            raise trio.WouldBlock  # pragma: no cover - a dict hit is an equal digest
        self.hits += 1
        return key

    async def lookup(self, secret: str) -> ApiKey | None:
        """The key whose secret this is (revoked or not: the caller refuses revoked
        keys), or None; from the cache when it can."""
        try:
            key = self.lookup_nowait(secret)
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.checkpoint()
            return key
        digest = hash_secret(secret)
        while (pending := self._inflight.get(digest)) is not None:
            await pending.wait()
            if digest in self._answers:
                self.hits += 1
                return self._answers[digest]
        self.misses += 1
        done = self._inflight[digest] = trio.Event()
        generation = self.generation
        try:
            async with self._limiter:
                key = await self.db.api_key_by_secret(secret)
            if generation == self.generation:
                self._store(digest, key)
            return key
        finally:
            del self._inflight[digest]
            done.set()

    def _store(self, digest: bytes, key: ApiKey | None) -> None:
        self._answers[digest] = key
        self._answers.move_to_end(digest)
        while len(self._answers) > self.max_entries:
            self._answers.popitem(last=False)

    def __len__(self) -> int:
        return len(self._answers)

    async def refresh(self) -> None:
        """Re-read every cached key by id and forget unknown secrets (one thread call)."""
        self.generation += 1
        generation = self.generation
        cached = [(digest, key.id) for digest, key in self._answers.items() if key is not None]
        ids = sorted({key_id for _, key_id in cached})

        def read(view) -> dict[str, ApiKey | None]:
            return {key_id: view.key(key_id) for key_id in ids}

        fresh = await self.db.read(read) if ids else {}
        if generation != self.generation:
            return  # a newer refresh is under way and will swap its own table in
        table: OrderedDict[bytes, ApiKey | None] = OrderedDict()
        for digest, key_id in cached:
            key = fresh.get(key_id)
            # Same id, another secret now: the old secret is unknown (looked up again).
            if key is not None and hmac.compare_digest(key.secret_hash, digest):
                table[digest] = key
        self._answers = table
        self.refreshes += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Refresh whenever another writer's entries arrive; until cancelled."""
        me = self.db.key
        known = dict(self.db.lengths)
        task_status.started()
        while True:
            lengths = await self.db.wait_changed(known, WATCH_S)
            others_changed = ({w: n for w, n in lengths.items() if w != me}
                              != {w: n for w, n in known.items() if w != me})
            known = dict(lengths)
            if others_changed:
                try:
                    await self.refresh()
                except Exception:  # a closed or failing view: keep serving what we have
                    log.exception("proxy.keys_refresh_failed")
                    await trio.sleep(1.0)
