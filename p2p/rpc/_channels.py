"""Keeping one RPC client channel open on a connection, for a sender that works over it.

A daemon's long-lived senders (the log shipper, the metrics reporters) each
hold a channel of their own to one peer: open it, run an :class:`RpcClient`
on it, do their work until the channel fails, close it, wait, open another,
for as long as the connection lasts. What differs is the work.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ._client import RpcClient

__all__ = ["keep_client_channel"]

log = logging.getLogger(__name__)


async def keep_client_channel(connection: Any, protocol: str, work: Callable[[RpcClient],
                              Awaitable[object]], *, channel_id: bytes = b"",
                              name: str, retry_s: float) -> None:
    """Open ``protocol`` (``channel_id``) on ``connection`` and run ``work(client)``
    over it; when the channel cannot be opened or ``work`` returns, wait
    ``retry_s`` and open it again. Runs until cancelled or the connection's
    task ends; the client is closed every time (shielded)."""
    while True:
        try:
            channel = await connection.open_channel(protocol, channel_id)
        except Exception as exc:  # refused (no such service yet) or the connection went
            log.info("%s.open_failed reason=%s", name, exc)
        else:
            client = RpcClient(channel, name=name.replace("_", "-"))
            async with trio.open_nursery() as nursery:
                await nursery.start(client.run)
                try:
                    await work(client)
                finally:
                    nursery.cancel_scope.cancel()
                    with trio.CancelScope(shield=True):
                        await client.aclose()
        await trio.sleep(retry_s)
