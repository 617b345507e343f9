"""The trio face of a replica: group commit, worker threads, change notification, queries.

Every blocking step (log writes and their fsync, SQLite) runs in a worker
thread; writes are serialised. Appends are group-committed: appends that
arrive while a write is in progress wait, then go to disk together in one
batch with one fsync, so many concurrent writers pay for few fsyncs and each
``append`` still returns only once its entry is durable.
"""

from __future__ import annotations

import logging
import os
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from p2p.keys import KeyPair
from p2p.log import FsyncPolicy, Head

from ._base import ApplyReport, Base, WriterChange, WriterStatus
from ._checkpoint import Checkpoint, CheckpointHeader, CheckpointState
from ._entries import EntryId
from ._metrics import DatabaseMetrics
from ._operations import OP_TYPES, Op, PutModelMaster, wire_batch, wire_ops
from ._view import ApiKey, ModelMaster, Usage, View

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
    """A replica of the shared database, for trio code. Build with :meth:`open`.

    Write with :meth:`append` / :meth:`append_many` (typed operations such as
    :class:`~._operations.PutApiKey`, :class:`~._operations.AddTokenUsage`);
    read with the queries (:meth:`api_key`, :meth:`api_key_by_secret`,
    :meth:`api_keys_of_team`, :meth:`model_master`, :meth:`model_masters`,
    :meth:`usage`, :meth:`last_used`), which return the typed rows
    :class:`~._view.ApiKey`, :class:`~._view.ModelMaster` and
    :class:`~._view.Usage`. Every query reads the view as last committed, in a
    worker thread, and sees every entry this replica has applied.
    """

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
        #: Entries of each writer the view holds (refreshed after every write).
        self.applied: dict[bytes, int] = dict(base._applied)
        #: The last checkpoint this admin made, and the one before (whose pages a
        #: peer may still be fetching); see :meth:`make_checkpoint`.
        self.checkpoint: Checkpoint | None = None
        self.previous_checkpoint: Checkpoint | None = None

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

    async def append(self, ops: Sequence[Op | Sequence[Any]]) -> EntryId:
        """Append one entry holding ``ops``; return once it is durable and in the view.

        Args:
            ops: typed operations (``[AddTokenUsage(...), MarkKeyUsed(...)]``);
                their wire arrays are accepted too. At most 1,024, and the
                entry at most 192 KiB encoded.

        Returns:
            Where the entry sits: this replica's writer key and its index.

        Raises:
            WriteRefused: this replica may not write these ops: ``NOT_A_WRITER``
                (no admin added it yet), ``NOT_AN_ADMIN`` (writer ops need an
                admin), ``BAD_OP``, ``TOO_LARGE`` or ``READ_ONLY``; nothing
                was written.
        """
        checked = _checked_when_built(ops)
        ops = wire_ops(ops)
        # Refuse one caller's bad ops, not the whole group.
        self.base.check_writable([ops], validated=checked)
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

    async def append_many(self, batch: Sequence[Sequence[Op | Sequence[Any]]]) -> list[EntryId]:
        """Append one entry per element of ``batch`` (each a list of ops), in one durable write.

        Raises:
            WriteRefused: as :meth:`append`; nothing of the batch was written.
        """
        checked = all(_checked_when_built(ops) for ops in batch)
        batch = wire_batch(batch)
        self.base.check_writable(batch, validated=checked)
        async with self._write_lock:
            try:
                ids = await trio.to_thread.run_sync(
                    lambda: self.base.append(batch, validated=True))
            finally:
                self._after_write()
        self.metrics.appended.inc(len(ids))
        self.metrics.append_batches.inc()
        return ids

    async def change_writer(self, action: str, writer: bytes, *,
                            admin: bool = False) -> WriterChange:
        """Add (``"add_writer"``) or remove (``"remove_writer"``) a writer, as this admin.

        A removal keeps the entries of ``writer`` this replica holds (every
        replica ignores the rest, whenever they arrive).

        Raises:
            WriteRefused: ``NOT_AN_ADMIN``, ``REMOVED`` (a removed key is never
                admitted again), ``UNKNOWN_WRITER`` (removing a key never
                admitted), ``LAST_ADMIN`` (removing the only admin left).
        """
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

    async def make_checkpoint(self, made_ms: int) -> Checkpoint:
        """Make a signed checkpoint of this admin's state and serve it from now on
        (see :mod:`._checkpoint`). Between writes, so it is one consistent state.

        Raises:
            WriteRefused: ``NOT_AN_ADMIN``.
            CheckpointRefused: ``NOT_READY`` (our logs do not cover what a
                checkpoint we installed released, yet).
        """
        async with self._write_lock:  # a copy of one state; encoding it waits for no one
            try:
                build = await trio.to_thread.run_sync(self.base.checkpoint_state, made_ms)
            finally:
                # An append that found the lock taken waits for the end of a
                # write: without this, one with no write after it waited forever.
                self._wake_appenders()
        checkpoint = await trio.to_thread.run_sync(build)
        self.previous_checkpoint, self.checkpoint = self.checkpoint, checkpoint
        return checkpoint

    def served_checkpoint(self, checkpoint_id: bytes) -> Checkpoint | None:
        """The checkpoint served under ``checkpoint_id``, if it is still kept."""
        for checkpoint in (self.checkpoint, self.previous_checkpoint):
            if checkpoint is not None and checkpoint.id == checkpoint_id:
                return checkpoint
        return None

    async def install_checkpoint(
        self, header: CheckpointHeader, state: CheckpointState,
        fetch_clocks: Callable[[], Awaitable[dict[bytes, array]]],
    ) -> int:
        """Install a checked checkpoint: its view first (queries see it as soon as
        it is in), then its clocks, fetched meanwhile with ``fetch_clocks()``
        (see :meth:`Base.install_checkpoint_state`). Writes wait until both are
        in; if fetching the clocks fails, the install is undone and the error raised.
        """
        async with self._write_lock:
            try:
                await trio.to_thread.run_sync(self.base.install_checkpoint_state, header, state)
                self._after_write()
                try:
                    clocks = await fetch_clocks()
                except BaseException:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(self.base.abort_checkpoint)
                    raise
                return await trio.to_thread.run_sync(self.base.install_checkpoint_clocks,
                                                     header, state, clocks)
            finally:
                self._after_write()

    def _after_write(self) -> None:
        base = self.base
        self.applied = dict(base._applied)
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
        self._wake_appenders()

    def _wake_appenders(self) -> None:
        """Wake the appends waiting for the write lock's holder to finish."""
        self._committed.set()
        self._committed = trio.Event()

    # -- reading ------------------------------------------------------------------------

    async def segment(self, writer: bytes, start: int,
                      max_bytes: int) -> tuple[list[bytes], Head | None]:
        """Entries of ``writer``'s log from ``start`` for a peer (see :meth:`Base.segment`)."""
        return await trio.to_thread.run_sync(self.base.segment, writer, start, max_bytes)

    async def read(self, query: Callable[[View], T]) -> T:
        """Run ``query(view)`` in a worker thread, e.g. ``await db.read(lambda v: v.models())``.

        The queries below cover what the platform asks; this runs several in
        one go (the view's methods have the same names as in ``View``).
        """
        return await trio.to_thread.run_sync(self.base.read_view, query)

    async def api_key(self, id: str) -> ApiKey | None:
        """The API key ``id`` (revoked or not); None if it was never put."""
        return await self.read(lambda view: view.key(id))

    async def api_key_by_secret(self, secret: str) -> ApiKey | None:
        """The key whose secret this is, revoked or not: the caller refuses a revoked one.

        Only hashes are stored and compared (in constant time); should two
        keys share a secret, a revoked one is returned first.
        """
        return await self.read(lambda view: view.key_by_secret(secret))

    async def api_keys_of_team(self, team: str) -> list[ApiKey]:
        """The team's API keys, revoked ones included, by id."""
        return await self.read(lambda view: view.keys_of_team(team))

    async def model_master(self, name: str) -> ModelMaster | None:
        """The model master ``name``; None if unknown or deleted."""
        return await self.read(lambda view: view.model(name))

    async def model_masters(self) -> list[ModelMaster]:
        """Every model master not deleted, by name."""
        return await self.read(lambda view: view.models())

    async def usage(self, key_id: str, *, model: str | None = None, day_from: str | None = None,
                    day_to: str | None = None) -> list[Usage]:
        """A key's usage rows (sums per model and UTC day), by day then model.

        Args:
            key_id: the API key's id.
            model: only this model's rows.
            day_from, day_to: only days in ``[day_from, day_to]`` (``YYYY-MM-DD``).
        """
        return await self.read(lambda view: view.usage(key_id, model, day_from, day_to))

    async def last_used(self, key_id: str) -> int | None:
        """When the key was last used (ms since the epoch), the latest any replica
        reported; None if never."""
        return await self.read(lambda view: view.last_used(key_id))

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
                try:
                    await trio.to_thread.run_sync(self.base.close)
                finally:
                    self._wake_appenders()  # they fail on the closed logs, not hang

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


#: Typed operations validated when built and immutable since; PutModelMaster is
#: left out because its ``defaults`` map, though copied, can still be mutated.
_IMMUTABLE_OPS = tuple(t for t in OP_TYPES if t is not PutModelMaster)


def _checked_when_built(ops: Sequence[Any]) -> bool:
    """True if every op is a typed operation whose construction already ran
    :func:`~._ops.validate_op` (checking again would only cost time)."""
    return bool(ops) and all(isinstance(op, _IMMUTABLE_OPS) for op in ops)
