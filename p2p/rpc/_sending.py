"""Sending RPC messages on a channel with as few scheduler passes as possible."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import trio

from p2p.mux import Channel as MuxChannel

__all__ = ["Outbox", "deliver_messages", "send_bytes", "send_bytes_nowait", "set_push_handler"]

_CHANNEL_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


async def send_bytes(
    channel: trio.abc.SendChannel[bytes],
    data: bytes,
    *,
    checkpoint: bool = True,
    more: bool = False,
) -> None:
    """Send ``data``; without ``checkpoint``, skip the scheduler when it can.

    A mux channel writes the message from this task when nothing else is
    being written (no hand-off to its writer task), or else queues it; without
    ``checkpoint`` the queued case returns without yielding. That saves one task
    switch per RPC message. Callers pass ``checkpoint=False`` only when they
    reach a checkpoint soon after (waiting for the reply, or ending the task).
    ``more`` is the mux's batching hint (other messages follow right away).
    Other channels: ``send_nowait`` if they have it, else ``send``.
    """
    if type(channel) is MuxChannel:
        await channel.send(data, checkpoint=checkpoint, more=more)
        return
    send_nowait = getattr(channel, "send_nowait", None)
    if send_nowait is not None and not checkpoint:
        try:
            send_nowait(data)
            return
        except trio.WouldBlock:
            pass
    await channel.send(data)


def send_bytes_nowait(channel: trio.abc.SendChannel[bytes], data: bytes) -> bool:
    """Queue ``data`` if the channel takes it at once; return whether it did."""
    send_nowait = getattr(channel, "send_nowait", None)
    if send_nowait is None:
        return False
    try:
        send_nowait(data)
    except trio.WouldBlock:
        return False
    return True


class Outbox:
    """Messages handed to a channel without waiting, in order.

    :meth:`put` queues each message on the channel at once if it takes it
    (``send_nowait``) and nothing older is still waiting; the rest wait, in
    order, for :meth:`run`'s task, which sends them with ``send``. So a task that
    must not wait (a reader callback, a cancelled caller) can still send.

    Args:
        channel: the channel.
        limit: messages that may wait; beyond it :meth:`put` with
            ``droppable=True`` drops the message (counted in ``dropped``). None:
            the caller bounds what it puts.
    """

    def __init__(self, channel: trio.abc.SendChannel[bytes], limit: int | None = None) -> None:
        self._channel = channel
        self._limit = limit
        self._waiting: deque[bytes] = deque()
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False
        #: Messages dropped at the limit.
        self.dropped = 0

    def __len__(self) -> int:
        """Messages waiting for the task."""
        return len(self._waiting)

    def close(self) -> None:
        """Drop what waits and everything put from now on (the channel is gone)."""
        self._closed = True
        self._waiting.clear()
        self._lot.unpark_all()

    def put(self, messages: list[bytes], *, droppable: bool = False) -> None:
        """Hand ``messages`` to the channel now, or queue them for :meth:`run`."""
        if not messages or self._closed:
            return
        waiting = self._waiting
        for data in messages:
            if not waiting:
                try:
                    if send_bytes_nowait(self._channel, data):
                        continue
                except _CHANNEL_GONE:
                    self.close()  # the read loop sees the channel end
                    return
            if droppable and self._limit is not None and len(waiting) >= self._limit:
                self.dropped += 1
                continue
            waiting.append(data)
            self._lot.unpark()

    async def run(self) -> None:
        """Send waiting messages until cancelled or the channel is gone."""
        waiting = self._waiting
        while not self._closed:
            if not waiting:
                await self._lot.park()
                continue
            try:
                # more=True: leave it to the mux writer's batch, so cancelling
                # this task never cuts a write short.
                await send_bytes(self._channel, waiting[0], more=True)
            except _CHANNEL_GONE:
                self.close()
                return
            if waiting:
                waiting.popleft()


def set_push_handler(
    channel: trio.abc.ReceiveChannel[bytes], handler: Callable[[bytes], None] | None
) -> bool:
    """Have a mux channel push messages to ``handler`` (see ``set_message_handler``).

    Returns:
        False if the channel cannot push; the caller then pulls with ``receive``.
    """
    if isinstance(channel, MuxChannel):
        channel.set_message_handler(handler)
        return True
    return False


async def deliver_messages(
    channel: trio.abc.ReceiveChannel[bytes],
    on_message: Callable[[bytes], None],
    *,
    logger: logging.Logger,
    name: str,
) -> None:
    """Feed every message of ``channel`` to ``on_message`` until the channel ends.

    A mux channel pushes them from its reader task (no task hop per message);
    ``receive()`` then only returns when the channel ends. Other channels are
    pulled here.
    """
    pushed = set_push_handler(channel, on_message)
    try:
        while True:
            try:
                data = await channel.receive()
            except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                logger.debug("rpc.channel_ended endpoint=%s reason=%r", name, exc)
                return
            on_message(data)
    finally:
        if pushed:
            set_push_handler(channel, None)
