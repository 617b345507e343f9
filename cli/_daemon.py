"""Running a long-lived command until SIGINT/SIGTERM, then stopping cleanly."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable

import trio

__all__ = ["run_until_signalled"]


async def run_until_signalled(start: Callable[[trio.Nursery], Awaitable[object]]) -> str:
    """Run ``start(nursery)``, then wait for SIGINT or SIGTERM and cancel everything.

    Cancellation runs every ``finally`` (an announcer unannounces, sockets
    close) instead of a KeyboardInterrupt landing at a random point.

    Returns:
        The name of the signal that stopped it.
    """
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await start(nursery)
            async for signum in signals:
                nursery.cancel_scope.cancel()
                return signal.Signals(signum).name
    return "cancelled"  # pragma: no cover - the signal loop only ends by returning
