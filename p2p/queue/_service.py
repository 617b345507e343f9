"""Replication of queues over a host's connections: the ``cosmicac-mq/1`` service.

One :class:`QueueService` per daemon; attach one :class:`DurableQueue` per
peer. On every connection to a peer with an attached queue, each side opens
one channel (id: its own public key) on which it *pushes* its log: the peer
answers STATUS (what it stores, what it acked) first and again at each
durable ack; we send ENTRIES from what it stores, and again as soon as our
log grows (no poll: a publish reaches a connected peer in one message).

So one connection carries two channels, one per direction, each with data
one way and acks the other. Backpressure is the mux's: a consumer that does
not read holds at most its channel window of our entries, and the sender
waits. A peer that breaks the protocol or sends entries that do not verify
has its channel ended (logged); the connection and the process go on, and
replication with that peer resumes only on a new connection.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import trio

from p2p.connection import Connection
from p2p.errors import ConnectionBroken
from p2p.host import Service
from p2p.keys import format_key
from p2p.mux import Channel, ChannelRejected, MuxError

from ._errors import BadQueueMessage, QueueClosed
from ._messages import (
    PROTOCOL,
    Entries,
    Receiver,
    Status,
    decode_message,
    encode_entries,
    encode_status,
)
from ._queue import DurableQueue

__all__ = ["QueueService"]

log = logging.getLogger(__name__)

#: Room left in a mux message for the ENTRIES framing around the entries.
_MESSAGE_SLACK = 1024
#: Entries stored with one append at most, when several messages are waiting.
_MAX_INGEST_ENTRIES = 8192
#: Waits before reopening a channel the peer closed at once (it has no queue
#: for us yet): doubling from the first to the second.
_RETRY_S = (0.05, 2.0)


class QueueService(Service):
    """Replicates every attached queue with its peer whenever a connection exists.

    Args:
        firewall: if True, :meth:`allows` refuses connections from keys with no
            attached queue. Off by default: ``allows`` decides for the whole
            connection, and a daemon hosts other services for other peers;
            channels from such keys are refused either way.
    """

    protocol = PROTOCOL

    def __init__(self, *, firewall: bool = False) -> None:
        self.firewall = firewall
        self._queues: dict[bytes, DurableQueue] = {}
        self._changed = trio.Event()

    def attach(self, queue: DurableQueue) -> None:
        """Replicate ``queue`` with its peer (now if connected, else on connection)."""
        old = self._queues.get(queue.peer)
        if old is not None and old is not queue:
            old.stop_channels()
        self._queues[queue.peer] = queue
        self._changed.set()
        self._changed = trio.Event()

    def detach(self, peer: bytes) -> None:
        """Stop replicating the queue with ``peer`` (its channels end; it stays open)."""
        queue = self._queues.pop(peer, None)
        if queue is not None:
            queue.stop_channels()
        self._changed.set()
        self._changed = trio.Event()

    def queue(self, peer: bytes) -> DurableQueue | None:
        return self._queues.get(peer)

    def allows(self, remote_public_key: bytes, how: str) -> bool:
        return not self.firewall or remote_public_key in self._queues

    # -- pushing our log -----------------------------------------------------------------

    async def on_connection(self, connection: Connection) -> None:
        peer = connection.remote_public_key
        retry = _RETRY_S[0]
        while True:
            queue = self._queues.get(peer)
            if queue is None or queue.closed:
                await self._changed.wait()
                continue
            opened = trio.current_time()
            try:
                await _push(queue, connection)
            except BadQueueMessage as exc:
                log.warning("queue.bad_peer peer=%s code=%s reason=%s; channel ended",
                            format_key(peer)[:12], exc.code, exc.message)
                return
            except ChannelRejected as exc:
                if exc.code == "UNKNOWN_PROTOCOL":
                    return  # the peer runs no queue service: nothing to retry
                log.info("queue.rejected peer=%s code=%s", format_key(peer)[:12], exc.code)
            except QueueClosed:
                continue
            except (ConnectionBroken, MuxError, trio.BrokenResourceError,
                    trio.ClosedResourceError):
                return  # the connection is going; a new one starts over
            if trio.current_time() - opened > _RETRY_S[1]:
                retry = _RETRY_S[0]
            await trio.sleep(retry)
            retry = min(retry * 2, _RETRY_S[1])

    # -- receiving the peer's log --------------------------------------------------------

    async def serve_channel(self, channel: Channel, connection: Connection) -> None:
        peer = connection.remote_public_key
        queue = self._queues.get(peer)
        if queue is None or queue.closed or channel.id != peer:
            return  # not attached (or not the opener's own log): the channel is closed
        try:
            await _receive(queue, channel)
        except BadQueueMessage as exc:
            log.warning("queue.bad_peer peer=%s code=%s reason=%s; channel ended",
                        format_key(peer)[:12], exc.code, exc.message)
        except (QueueClosed, ConnectionBroken, MuxError, trio.BrokenResourceError,
                trio.ClosedResourceError):
            pass


@contextlib.contextmanager
def _leaf_errors() -> Iterator[None]:
    """Raise the one error a channel's nursery collected as itself, so callers
    catch BadQueueMessage & co. by type (several stay a group)."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


async def _push(queue: DurableQueue, connection: Connection) -> None:
    """Send our log to the peer on a channel of our own until it ends.

    Returns when the peer ends the channel or the queue stops replicating.
    """
    channel = await connection.open_channel(PROTOCOL, queue.public_key)
    try:
        with _leaf_errors():
            await _push_on(queue, channel)
    finally:
        channel.close_nowait()


async def _push_on(queue: DurableQueue, channel: Channel) -> None:
    async with queue.channel_role("send"), trio.open_nursery() as nursery:
        first: list[int] = []
        have_first = trio.Event()

        async def read_statuses() -> None:
            while True:
                try:
                    data = await channel.receive()
                except trio.EndOfChannel:
                    nursery.cancel_scope.cancel()
                    return
                queue.heard()
                message = decode_message(data)
                if not isinstance(message, Status):
                    raise BadQueueMessage("a consumer sends STATUS only", code="BAD_TYPE")
                queue.peer_status(message.have, message.acked)
                if not first:
                    first.append(message.have)
                    have_first.set()

        nursery.start_soon(read_statuses)
        await have_first.wait()
        sent = first[0]
        limit = channel.max_message_bytes - _MESSAGE_SLACK
        while True:
            grew = queue.published_grew
            if sent >= queue.published:
                await grew.wait()
                continue
            entries, head = await queue.segment(sent, limit)
            await channel.send(encode_entries(sent, entries, head))
            sent += len(entries)


async def _receive(queue: DurableQueue, channel: Channel) -> None:
    """Take the peer's log from the channel it opened; tell it our cursor."""
    with _leaf_errors():
        await _receive_on(queue, channel)


async def _receive_on(queue: DurableQueue, channel: Channel) -> None:
    async with queue.channel_role("receive"), trio.open_nursery() as nursery:
        receiver = Receiver(queue.received, queue.config.max_pending_bytes)
        nursery.start_soon(_send_statuses, queue, channel)
        ended = False
        while not ended:
            try:
                data = await channel.receive()
            except trio.EndOfChannel:
                break
            # Take every message already here too, and store them all with one
            # append and one fsync: a consumer that fell behind catches up in
            # big appends instead of one per publisher's batch.
            entries: list[bytes] = []
            head = None
            while True:
                queue.heard()
                message = decode_message(data)
                if not isinstance(message, Entries):
                    raise BadQueueMessage("a publisher sends ENTRIES only", code="BAD_TYPE")
                run = receiver.offer(message)
                if run is not None:
                    entries.extend(run[0])
                    head = run[1]
                if len(entries) >= _MAX_INGEST_ENTRIES:
                    break
                try:
                    data = channel.receive_nowait()
                except trio.WouldBlock:
                    break
                except trio.EndOfChannel:
                    ended = True
                    break
            if head is not None:
                await queue.ingest(entries, head)
        nursery.cancel_scope.cancel()


async def _send_statuses(queue: DurableQueue, channel: Channel) -> None:
    """STATUS now, then at every durable ack (coalesced: one per flush at most)."""
    last = -1
    while True:
        changed = queue.acked_changed
        if queue.acked != last:
            last = queue.acked
            await channel.send(encode_status(queue.received, last))
        await changed.wait()


