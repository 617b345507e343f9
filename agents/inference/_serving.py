"""What both model servers' command lines share: the bind error and the address
form (from :mod:`p2p.http`), and running until SIGTERM (``python -m agents.inference.server`` and
``python -m agents.inference.runtimes.parakeet_server``).

The agent starts a model server, reads ``listening http://HOST:PORT`` from its
stdout, and stops it with SIGTERM: it must then leave cleanly with exit 0. A
server that cannot bind exits 2 with the reason on stderr.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Awaitable, Callable

import trio

from p2p.http import ServerBindError, join_address

__all__ = ["ServerBindError", "join_address", "run_until_signalled"]

Serve = Callable[..., Awaitable[None]]


def run_until_signalled(serve: Serve, *, log: logging.Logger, event: str) -> int:
    """Run ``serve(task_status=...)`` (which reports its ``(host, port)``) until
    SIGTERM or SIGINT; the exit status: 0, or 2 if it could not bind."""

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve)
            print(f"listening http://{join_address(host, port)}", flush=True)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    log.info("%s signal=%s", event, signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(run)
    except ServerBindError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0
