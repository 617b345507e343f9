"""The consuming end of a durable queue: the peer's log to us, from its entries to our acks.

:class:`Inbox` owns in.log (our verified copy of the peer's log) and the
``acked`` cursor: it verifies and stores the runs of entries replication
brings (:meth:`Inbox.ingest`), hands them to the one consumer in log order
(:meth:`Inbox.deliveries`), and makes its acks durable (:meth:`Inbox.ack`,
:meth:`Inbox.run_acks`). :class:`~._queue.DurableQueue` opens the files and
exposes these as its own methods; see its module doc for the durability
argument (in.log is fsynced with the next cursor write, just before it).

Blocking file I/O: in.log and the cursor in ``trio.to_thread`` under a trio
lock per file, except that a small run of the peer's entries is verified and
written (no fsync) on the trio thread (see :meth:`Inbox.ingest`). The cursor
flush's ``fdatasync`` of in.log may run beside an append to it, which the
kernel orders.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio

from p2p.keys import format_key
from p2p.log import FsyncPolicy, Head, InvalidBatch, WriterLog

from ._config import QueueConfig
from ._cursor import PositionFile
from ._errors import BadQueueMessage, QueueClosed, QueueError
from ._messages import decode_entry

__all__ = ["Delivery", "Inbox"]

#: Runs of the peer's entries up to this long are verified and stored on the
#: trio thread (see Inbox.ingest).
_INLINE_ENTRIES = 256
_INLINE_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class Delivery:
    """One operation from the peer: apply it, then ``ack(position)``."""

    position: int
    key: str
    payload: bytes


def _event_set_and_renew(event: trio.Event) -> trio.Event:
    event.set()
    return trio.Event()


class Inbox:
    """The peer's log to us, its consumer and its cursor (one end of one queue).

    Args:
        peer: the peer's public key (for error messages).
        config: the queue's limits (cache, read batch, fsync policy).
        inbound: in.log, opened by the queue; closed by :meth:`aclose`.
        cursor: the ``acked`` cursor; closed by :meth:`aclose`.

    :class:`~._queue.DurableQueue` exposes its public methods as its own and
    documents them there (the contract callers read).
    """

    def __init__(self, peer: bytes, config: QueueConfig, inbound: WriterLog,
                 cursor: PositionFile) -> None:
        self.peer = peer
        self.config = config
        self._in = inbound
        self._cursor = cursor
        self.closed = False
        # the peer's log to us
        self._in_lock = trio.Lock()
        self._received = inbound.length
        self._in_grew = trio.Event()
        self._in_cache: collections.deque[tuple[str, bytes]] = collections.deque()
        self._in_cache_first = 0  # position of _in_cache[0]
        self._in_cache_bytes = 0
        # consuming
        self._acked = min(cursor.position, inbound.length)
        self._ack_target = self._acked
        self._ack_lock = trio.Lock()
        self._ack_flushing = False
        self._ack_lot = trio.lowlevel.ParkingLot()
        self._acked_event = trio.Event()
        self._ack_wanted = trio.Event()
        self._consuming = False
        self._delivered = self._acked

    def close(self) -> None:
        """Refuse everything from now on (QueueClosed); the queue closes us with itself."""
        self.closed = True

    async def aclose(self) -> None:
        """Close the files, once an ingest or a cursor flush under way is done."""
        async with self._in_lock, self._ack_lock:
            self._in.close()
            self._cursor.close()

    def wake_all(self) -> None:
        self._ack_lot.unpark_all()
        self._in_grew = _event_set_and_renew(self._in_grew)
        self._acked_event = _event_set_and_renew(self._acked_event)
        self._ack_wanted = _event_set_and_renew(self._ack_wanted)

    def _check_open(self) -> None:
        if self.closed:
            raise QueueClosed(f"the queue with {format_key(self.peer)[:12]} is closed")

    # -- receiving (see _service) ------------------------------------------------------

    async def ingest(self, entries: list[bytes], head: Head) -> int:
        """Verify and store a run of the peer's entries (:meth:`DurableQueue.ingest`)."""
        self._check_open()
        try:
            # A small run (a publisher's batch at a rate it keeps up with) is
            # verified and written (to the page cache: in.log is fsynced with
            # the cursor) right here: a hop to a thread and back costs more.
            # Big runs (a consumer catching up) go to a thread.
            if (len(entries) <= _INLINE_ENTRIES and not self._in_lock.locked()
                    and sum(map(len, entries)) <= _INLINE_BYTES):
                self._in_lock.acquire_nowait()
                try:
                    start = self._in.length
                    length = self._in.append_verified(entries, head)
                finally:
                    self._in_lock.release()
            else:
                async with self._in_lock:
                    self._check_open()
                    start = self._in.length
                    length = await trio.to_thread.run_sync(self._in.append_verified, entries,
                                                           head)
        except InvalidBatch as exc:
            raise BadQueueMessage(f"entries refused: {exc.message}", code=exc.code) from None
        size = 0
        if self._in_cache and self._in_cache_first + len(self._in_cache) != start + 1:
            self._in_cache.clear()
            self._in_cache_bytes = 0
        if not self._in_cache:
            self._in_cache_first = start + 1
        for entry in entries:
            key, payload = decode_entry(entry)
            self._in_cache.append((key, payload))
            size += len(payload) + len(key)
        self._in_cache_bytes += size
        self._trim_in_cache()
        self._received = length
        self._in_grew = _event_set_and_renew(self._in_grew)
        return length

    def _trim_in_cache(self) -> None:
        while self._in_cache and (self._in_cache_bytes > self.config.cache_bytes
                                  or self._in_cache_first <= self._acked):
            key, payload = self._in_cache.popleft()
            self._in_cache_bytes -= len(payload) + len(key)
            self._in_cache_first += 1

    # -- consuming ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def deliveries(self) -> AsyncIterator[_Deliveries]:
        """The peer's operations in log order (:meth:`DurableQueue.deliveries`)."""
        self._check_open()
        if self._consuming:
            raise QueueError("the queue already has a consumer", code="CONSUMER_BUSY")
        self._consuming = True
        self._delivered = self._acked
        try:
            yield _Deliveries(self)
        finally:
            self._consuming = False

    async def _next_delivery(self, buffer: collections.deque[Delivery]) -> Delivery:
        while True:
            self._check_open()
            position = self._delivered + 1
            if buffer and buffer[0].position == position:
                delivery = buffer.popleft()
            elif position <= self._received:
                buffer.clear()
                delivery = self._from_cache(position)
                if delivery is None:
                    buffer.extend(await self._read_in(position))
                    continue
            else:
                await self._in_grew.wait()
                continue
            self._delivered = position
            return delivery

    def _from_cache(self, position: int) -> Delivery | None:
        offset = position - self._in_cache_first
        if 0 <= offset < len(self._in_cache):
            key, payload = self._in_cache[offset]
            return Delivery(position, key, payload)
        return None

    async def _read_in(self, position: int) -> list[Delivery]:
        end = min(self._received, position - 1 + self.config.read_batch_entries)
        async with self._in_lock:
            self._check_open()
            payloads = await trio.to_thread.run_sync(self._in.read_range, position - 1, end)
        return [Delivery(position + k, *decode_entry(entry)) for k, entry in enumerate(payloads)]

    async def ack(self, position: int) -> None:
        """Ack up to ``position``, durably (:meth:`DurableQueue.ack`)."""
        self.ack_nowait(position)
        while self._acked < position:
            self._check_open()
            if self._ack_flushing:
                await self._ack_lot.park()
            else:
                await self._flush_ack()

    def ack_nowait(self, position: int) -> None:
        """Note an ack, durable with the next flush (:meth:`DurableQueue.ack_nowait`)."""
        self._check_open()
        if position > self._delivered:
            raise QueueError(f"cannot ack {position}: only {self._delivered} were delivered",
                             code="ACK_AHEAD")
        if position > self._ack_target:
            self._ack_target = position
            self._ack_wanted = _event_set_and_renew(self._ack_wanted)

    async def run_acks(self) -> None:
        """Flush acks as they come, until closed (:meth:`DurableQueue.run_acks`)."""
        while not self.closed:
            if self._ack_target > self._acked and not self._ack_flushing:
                await self._flush_ack()
            else:
                await self._ack_wanted.wait()

    async def _flush_ack(self) -> None:
        self._ack_flushing = True
        try:
            async with self._ack_lock:
                self._check_open()
                target = self._ack_target
                if target <= self._acked:
                    return
                await trio.to_thread.run_sync(self._write_cursor, target)
                self._acked = target
                self._trim_in_cache()
                self._acked_event = _event_set_and_renew(self._acked_event)
        finally:
            self._ack_flushing = False
            self._ack_lot.unpark_all()

    def _write_cursor(self, target: int) -> None:
        if self.config.fsync is FsyncPolicy.ALWAYS:
            self._in.sync()  # the copy first, so the cursor never points past it
        self._cursor.write(target)

    # -- state -------------------------------------------------------------------------

    @property
    def received(self) -> int:
        return self._received

    @property
    def delivered(self) -> int:
        return self._delivered

    @property
    def acked(self) -> int:
        return self._acked

    @property
    def acked_changed(self) -> trio.Event:
        """Set at the next durable ack (a new event each time)."""
        return self._acked_event


class _Deliveries:
    """The async iterator :meth:`DurableQueue.deliveries` yields."""

    def __init__(self, inbox: Inbox) -> None:
        self._inbox = inbox
        self._buffer: collections.deque[Delivery] = collections.deque()

    def __aiter__(self) -> _Deliveries:
        return self

    async def __anext__(self) -> Delivery:
        return await self._inbox._next_delivery(self._buffer)

    async def receive(self) -> Delivery:
        """The next delivery (waits for one)."""
        return await self._inbox._next_delivery(self._buffer)

    @property
    def available(self) -> int:
        """Deliveries that are here now (``receive`` returns them without waiting
        for the peer). A consumer that acks each delivery with ``ack_nowait``
        and awaits ``ack`` only when this is 0 gets one cursor fsync per burst."""
        inbox = self._inbox
        return inbox._received - inbox._delivered

