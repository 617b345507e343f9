"""Sending RPC messages on a channel with as few scheduler passes as possible."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from p2p.mux import Channel as MuxChannel

__all__ = ["deliver_messages", "send_bytes", "send_bytes_nowait", "set_push_handler"]


async def send_bytes(
    channel: trio.abc.SendChannel[bytes],
    data: bytes,
    *,
    checkpoint: bool = True,
    more: bool = False,
) -> None:
    """Send ``data``; without ``checkpoint``, skip the scheduler when it can.

    A mux channel writes the message from this task when nothing else is
    pending (no hand-off to its writer task), or else queues it; without
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
