"""One end of a durable queue between us and one peer (the HyperMQ analogue).

Each end owns a directory::

    out.log     our signed log of what we publish to the peer (p2p.log WriterLog,
                heads in the namespace bound to the peer: see head_namespace)
    in.log      our verified copy of the peer's log to us
    acked       the consumer's cursor: how far we acked the peer's log (fsynced)
    peer-acked  how far the peer acked ours, as it last told us (not fsynced:
                a stale value only makes ``pending`` look higher until the peer
                reconnects and says again)
    lock        flock: one process per directory

A position is a log length: the entry at index i has position i + 1, so 0
means "nothing". Publishing appends to out.log and returns once the append is
durable; many publishers share one append and one fsync (group commit: a
publish that finds no append under way signs everything queued as one batch
and hands it to the queue's writer thread; when the thread reports it
durable, everything queued meanwhile goes the same way at once).
Replication (see :mod:`._service`) pushes out.log to the peer as it grows,
and the peer's consumer cursor comes back as STATUS messages: an ack is a
position, not an entry, so acking costs no signed append and the logs hold
only operations.

Durability: a publish returns once its entry is fsynced in out.log, and
the sender sends only what is durable (a publisher that crashed after
sending something it then lost would fork its log under the peer). The
peer's entries are verified and written to in.log, delivered at once, and
fsynced with the next cursor write (just before it): an entry is applied
before our copy of it is durable, which costs nothing in safety, since the
publisher keeps its log and a consumer that loses the tail of its copy (power
loss) reopens with the cursor cut back to the copy and fetches the rest
again: at-least-once holds, and every redelivered entry was applied at most
since the last durable ack. It saves an fsync on the path from publish to
applied.

Blocking file I/O: out.log only on its writer thread (:mod:`._writer`;
appends and the sender's reads from disk, in order); in.log and the cursor as
:mod:`._inbox` says.

This module is the end itself and its publishing half: it opens the files,
publishes into out.log, serves the sender and the replication channels, and
exposes the consuming half, :class:`~._inbox.Inbox` (the peer's log to us:
ingest, deliveries, acks), as its own methods.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import outcome
import trio

from p2p.files import private_folder
from p2p.keys import KeyPair, format_key
from p2p.log import FsyncPolicy, Head, PreparedBatch, WriterLog

from ._config import QueueConfig
from ._cursor import PositionFile
from ._errors import (
    BadQueueMessage,
    PayloadTooLarge,
    PublishFailed,
    QueueClosed,
    QueueInUse,
)
from ._inbox import Inbox, _Deliveries, _event_set_and_renew
from ._messages import encode_entry, head_namespace
from ._writer import FileThread

__all__ = ["DurableQueue", "QueueStatistics"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    #: Positions we published (durable).
    published: int
    #: The highest position the peer has acked (as it last told us).
    peer_acked: int
    #: published - peer_acked: what the peer has yet to apply.
    pending: int
    #: Positions of the peer's log we store (verified; durable with the next ack).
    received: int
    #: The highest position handed to our consumer.
    delivered: int
    #: Our durable cursor: the highest position we acked.
    acked: int
    #: A replication channel with the peer is open.
    connected: bool
    #: trio time of the last message from the peer, or None.
    last_heard: float | None


class DurableQueue:
    """One end of the queue between ``keypair`` and ``peer``; build with :meth:`open`."""

    def __init__(self, directory: Path, keypair: KeyPair, peer: bytes, config: QueueConfig,
                 lock_fd: int, out: WriterLog, inbound: WriterLog, cursor: PositionFile,
                 peer_acked: PositionFile) -> None:
        self.directory = directory
        self.keypair = keypair
        self.peer = peer
        self.config = config
        self._lock_fd = lock_fd
        self._out = out
        self._peer_acked_file = peer_acked
        self.closed = False
        # publishing (group commit)
        self._writer = FileThread(f"queue-out-{format_key(peer)[:12]}")
        self._idle_event = trio.Event()  # set after every batch written
        self._queued: list[bytes] = []
        self._assigned = out.length
        self._published = out.length
        self._in_flight = False  # a batch is with the writer thread
        # publishers waiting for their batch, in position order: (position, task)
        self._waiters: collections.deque[tuple[int, trio.lowlevel.Task]] = collections.deque()
        self._room_lot = trio.lowlevel.ParkingLot()
        self._generation = 0
        self._failures: collections.OrderedDict[int, BaseException] = collections.OrderedDict()
        self._out_grew = trio.Event()
        # recent batches we appended: start -> (entries, head), for the sender
        self._out_cache: collections.OrderedDict[int, tuple[list[bytes], Head]] = \
            collections.OrderedDict()
        self._out_cache_bytes = 0
        # the peer's acks of our log
        self._peer_acked = min(peer_acked.position, out.length)
        self._peer_event = trio.Event()
        # the peer's log to us, and consuming it
        self._inbox = Inbox(peer, config, inbound, cursor)
        # replication channels: role -> (cancel scope, done event)
        self._channels: dict[str, tuple[trio.CancelScope, trio.Event]] = {}
        self._last_heard: float | None = None

    # -- opening and closing -----------------------------------------------------------

    @classmethod
    async def open(cls, directory: str | os.PathLike[str], keypair: KeyPair, peer: bytes, *,
                   config: QueueConfig | None = None) -> DurableQueue:
        """Open (creating) the end of the queue with ``peer`` whose files are in ``directory``.

        Raises:
            QueueInUse: another handle or process has ``directory`` open.
            p2p.log.LogCorrupted: a log is damaged (a torn tail is cut, not an error).
            ValueError: ``peer`` is not a 32-byte key, or is our own key.
        """
        config = config or QueueConfig()
        peer = bytes(peer)
        if len(peer) != 32 or peer == keypair.public_key:
            raise ValueError("peer must be another node's 32-byte public key")
        return await trio.to_thread.run_sync(cls._open_blocking, Path(directory), keypair,
                                             peer, config)

    @classmethod
    def _open_blocking(cls, directory: Path, keypair: KeyPair, peer: bytes,
                       config: QueueConfig) -> DurableQueue:
        private_folder(directory)
        lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        opened: list[WriterLog | PositionFile] = []
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise QueueInUse(f"{directory} is open in another handle or process") from None
            out = WriterLog.open(directory / "out.log", keypair.public_key, keypair,
                                 fsync=config.fsync, namespace=head_namespace(peer))
            opened.append(out)
            # Not fsynced per append: see "Durability" in the module docstring.
            inbound = WriterLog.open(directory / "in.log", peer, None, fsync=FsyncPolicy.NEVER,
                                     namespace=head_namespace(keypair.public_key))
            opened.append(inbound)
            cursor = PositionFile(directory / "acked",
                                  fsync=config.fsync is FsyncPolicy.ALWAYS)
            opened.append(cursor)
            peer_acked = PositionFile(directory / "peer-acked", fsync=False)
        except BaseException:
            for handle in opened:
                handle.close()
            os.close(lock_fd)
            raise
        for name, handle in (("out.log", out), ("in.log", inbound)):
            if handle.recovery is not None:
                log.warning("queue.log_recovered peer=%s file=%s dropped_entries=%d reason=%s",
                            format_key(peer)[:12], name, handle.recovery.dropped_entries,
                            handle.recovery.reason)
        return cls(directory, keypair, peer, config, lock_fd, out, inbound, cursor, peer_acked)

    @property
    def public_key(self) -> bytes:
        return self.keypair.public_key

    async def aclose(self) -> None:
        """Stop replication, fail waiting publishers (QueueClosed), close the files.

        An append under way finishes first (its publishers get their positions).
        """
        if self.closed:
            return
        self.closed = True
        self._inbox.close()
        for scope, _ in list(self._channels.values()):
            scope.cancel()
        with trio.CancelScope(shield=True):
            while self._in_flight:  # its publishers get their positions
                self._idle_event = trio.Event()
                await self._idle_event.wait()
            self._wake_all()
            for _, done in list(self._channels.values()):
                await done.wait()
            await self._writer.aclose()
            self._out.close()
            await self._inbox.aclose()  # once an ingest or a cursor flush under way is done
            self._peer_acked_file.close()
            os.close(self._lock_fd)

    def _wake_all(self) -> None:
        self._wake_publishers(None)
        self._room_lot.unpark_all()
        self._out_grew = _event_set_and_renew(self._out_grew)
        self._peer_event = _event_set_and_renew(self._peer_event)
        self._inbox.wake_all()

    def _check_open(self) -> None:
        if self.closed:
            raise QueueClosed(f"the queue with {format_key(self.peer)[:12]} is closed")

    async def __aenter__(self) -> DurableQueue:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- publishing --------------------------------------------------------------------

    async def publish(self, key: str, payload: bytes) -> int:
        """Publish ``payload`` under ordering key ``key``; its position once durable.

        Publishes are appended in the order they are called. If more than
        ``max_queued_publishes`` wait for an append, this waits for room. A
        publish cancelled while waiting may still be published (with the next
        append); one that returned is in the log for good.

        Raises:
            PayloadTooLarge: the key or payload is over the configured limit.
            PublishFailed: the append failed (every publish waiting on it fails).
            QueueClosed: the queue was closed before the entry was appended.
        """
        self._check_open()
        if len(key.encode()) > self.config.max_key_bytes:
            raise PayloadTooLarge(f"a key is at most {self.config.max_key_bytes} bytes")
        if len(payload) > self.config.max_payload_bytes:
            raise PayloadTooLarge(f"a payload is at most {self.config.max_payload_bytes} "
                                  f"bytes, this one is {len(payload)}")
        entry = encode_entry(key, bytes(payload))
        while len(self._queued) >= self.config.max_queued_publishes:
            await self._room_lot.park()
            self._check_open()
        self._assigned += 1
        position = self._assigned
        generation = self._generation
        self._queued.append(entry)
        self._kick()
        while self._published < position:
            if generation != self._generation:
                raise PublishFailed("the append carrying this publish failed") \
                    from self._failures.get(generation)
            self._check_open()
            await self._wait_published(position)
        return position

    async def _wait_published(self, position: int) -> None:
        """Sleep until ``position`` is durable, its append failed or the queue
        closes. Not a ParkingLot: an append would wake every publisher and
        those not in it (about half, at a steady rate) park again; here it
        wakes exactly its own (they wait in position order)."""
        waiter = (position, trio.lowlevel.current_task())
        self._waiters.append(waiter)

        def abort(_: object) -> trio.lowlevel.Abort:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    def _wake_publishers(self, published: int | None) -> None:
        """Wake the publishers of positions up to ``published`` (None: all of them)."""
        waiters = self._waiters
        while waiters and (published is None or waiters[0][0] <= published):
            trio.lowlevel.reschedule(waiters.popleft()[1])

    def _kick(self) -> None:
        """Hand what is queued (up to the batch limits) to the writer thread as
        one batch, unless one is being written: :meth:`_written` then hands
        over the next the moment that one is durable. (Two at a time, the next
        signed while one is written, measured slower: smaller batches, more
        GIL hand-offs.) Encoding, chaining and signing run here, on the trio
        thread, so the writer thread needs the GIL only to return from the
        write and the fsync (each wait for it can last up to the switch
        interval while this thread is busy)."""
        if self._in_flight or self.closed or not self._queued:
            return
        batch, size = [], 0
        for entry in self._queued:
            if batch and (len(batch) >= self.config.max_batch_entries
                          or size + len(entry) > self.config.max_batch_bytes):
                break
            batch.append(entry)
            size += len(entry)
        try:
            prepared = self._out.prepare_batch(batch)
        except Exception as exc:
            self._append_failed(exc)
            return
        self._in_flight = True
        self._writer.call_soon(functools.partial(self._out.write_prepared, prepared),
                               functools.partial(self._written, batch, size, prepared))

    def _written(self, batch: list[bytes], size: int, prepared: PreparedBatch,
                 result: outcome.Outcome) -> None:
        """The writer thread wrote (or failed to write) ``batch``: on the trio thread."""
        self._in_flight = False
        try:
            if isinstance(result, outcome.Error):
                self._append_failed(result.error)
                return
            head = prepared.head
            assert head is not None
            del self._queued[:len(batch)]
            self._room_lot.unpark(count=len(batch))
            start = self._published
            self._published = head.length
            self._cache_out(start, batch, head, size)
            self._out_grew = _event_set_and_renew(self._out_grew)
        finally:
            self._wake_publishers(self._published)
            self._idle_event.set()
            self._kick()

    def _append_failed(self, exc: BaseException) -> None:
        log.error("queue.append_failed peer=%s entries=%d error=%r",
                  format_key(self.peer)[:12], len(self._queued), exc)
        self._failures[self._generation] = exc
        while len(self._failures) > 16:
            self._failures.popitem(last=False)
        self._generation += 1
        self._queued.clear()
        self._assigned = self._published
        self._room_lot.unpark_all()
        self._wake_publishers(None)

    def _cache_out(self, start: int, batch: list[bytes], head: Head, size: int) -> None:
        self._out_cache[start] = (batch, head)
        self._out_cache_bytes += size
        while self._out_cache and (self._out_cache_bytes > self.config.cache_bytes
                                   or next(iter(self._out_cache.values()))[1].length
                                   <= self._peer_acked):
            _, (old, _) = self._out_cache.popitem(last=False)
            self._out_cache_bytes -= sum(len(entry) for entry in old)

    async def wait_peer_acked(self, position: int) -> None:
        """Wait until the peer has acked up to ``position`` (QueueClosed if we close)."""
        while self._peer_acked < position:
            self._check_open()
            await self._peer_event.wait()

    # -- the sender's needs (see _service) ---------------------------------------------

    async def segment(self, start: int, max_bytes: int) -> tuple[list[bytes], Head | None]:
        """Our entries from ``start`` (0-based) for the peer, ending on a head if they can."""
        cached = self._out_cache.get(start)
        if cached is not None:
            # Consecutive batches the peer has not had go in one message, as
            # many as fit (the chain lets the last head cover them all).
            entries: list[bytes] = []
            head = None
            size = 256
            while cached is not None:
                more = sum(len(entry) + 8 for entry in cached[0])
                if size + more > max_bytes:
                    break
                entries.extend(cached[0])
                head = cached[1]
                size += more
                cached = self._out_cache.get(head.length)
            if head is not None:
                return entries, head
        self._check_open()
        # On the writer thread: the log is never read while it is written.
        return await self._writer.run(functools.partial(self._out.segment, start, max_bytes))

    def peer_status(self, have: int, acked: int) -> None:
        """The peer says it stores ``have`` of our entries and acked ``acked``."""
        if have > self._published:
            raise BadQueueMessage(f"the peer has {have} of our entries; we published "
                                  f"{self._published}", code="AHEAD")
        if acked > self._peer_acked:
            self._peer_acked = acked
            self._peer_acked_file.write(acked)  # not fsynced: a hint, see the module doc
            self._peer_event = _event_set_and_renew(self._peer_event)

    # -- receiving (see _service) ------------------------------------------------------

    async def ingest(self, entries: list[bytes], head: Head) -> int:
        """Verify and store a run of the peer's entries from our length; the new length.

        Raises:
            BadQueueMessage: the chain or signature does not verify (nothing stored).
        """
        return await self._inbox.ingest(entries, head)

    def heard(self) -> None:
        self._last_heard = trio.current_time()

    @contextlib.asynccontextmanager
    async def channel_role(self, role: str) -> AsyncIterator[trio.CancelScope]:
        """Run one replication channel of ``role`` ("send" or "receive"); a newer
        channel of the same role replaces this one (it is cancelled, and the
        newer waits until it has stopped)."""
        self._check_open()
        previous = self._channels.get(role)
        scope, done = trio.CancelScope(), trio.Event()
        self._channels[role] = (scope, done)
        try:
            if previous is not None:
                previous[0].cancel()
                await previous[1].wait()
            with scope:
                yield scope
        finally:
            done.set()
            if self._channels.get(role) == (scope, done):
                del self._channels[role]

    def stop_channels(self) -> None:
        for scope, _ in list(self._channels.values()):
            scope.cancel()

    # -- consuming (see _inbox) ---------------------------------------------------------

    def deliveries(self) -> contextlib.AbstractAsyncContextManager[_Deliveries]:
        """The peer's operations in log order, from the one after our last ack.

        One consumer at a time. Leaving the block and entering again starts
        over from the last ack (what was delivered but not acked comes again).
        """
        return self._inbox.deliveries()

    async def ack(self, position: int) -> None:
        """Ack every delivery up to ``position``; returns once the cursor is durable.

        Concurrent acks share one write and fsync. Acking what was not
        delivered raises QueueError (ACK_AHEAD); acking less than before is a
        no-op.
        """
        await self._inbox.ack(position)

    def ack_nowait(self, position: int) -> None:
        """Note an ack; it becomes durable (and is told to the peer) with the next
        flush: by :meth:`run_acks`, or the next :meth:`ack`. A crash before the
        flush redelivers what it acked."""
        self._inbox.ack_nowait(position)

    async def run_acks(self) -> None:
        """Make every :meth:`ack_nowait` durable (and known to the peer) as soon
        as the flush before it ends, until the queue closes; run it in a task.

        With it, a consumer acks with ``ack_nowait`` and goes straight on to the
        next delivery: the cursor's fsync never sits between two deliveries.
        """
        await self._inbox.run_acks()

    # -- the receiver's needs ----------------------------------------------------------

    @property
    def received(self) -> int:
        return self._inbox.received

    @property
    def acked(self) -> int:
        return self._inbox.acked

    @property
    def acked_changed(self) -> trio.Event:
        """Set at the next durable ack (a new event each time)."""
        return self._inbox.acked_changed

    @property
    def published(self) -> int:
        return self._published

    @property
    def published_grew(self) -> trio.Event:
        """Set at the next append (a new event each time)."""
        return self._out_grew

    def statistics(self) -> QueueStatistics:
        return QueueStatistics(
            published=self._published, peer_acked=self._peer_acked,
            pending=self._published - self._peer_acked, received=self._inbox.received,
            delivered=self._inbox.delivered, acked=self._inbox.acked,
            connected=bool(self._channels),
            last_heard=self._last_heard)

    def __repr__(self) -> str:
        return (f"<DurableQueue peer={format_key(self.peer)[:12]} published={self._published} "
                f"received={self._inbox.received}>")
