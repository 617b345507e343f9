"""A task that pushes the latest snapshot of something to wrk-monitor every few seconds.

Used by proxy-inference (``metrics.push``, its per-job window) and by the
workers (``metrics.agents``, their agents' figures). One connection to
wrk-monitor (``p2p.swarm.stay_connected``: its addresses, then the DHT,
redialled with backoff), one ``cosmicac-monitor/1`` channel of the reporter's
own on it (its ``channel_id``: not the log shipper's, so a slow log push never
delays a report, nor the reverse), and on it, every ``interval_s``, one call
of ``method`` with ``build()`` as it is then.

Latest snapshot only: a report is built when it is sent, never queued; one
that fails (wrk-monitor down, slow, refusing) is simply not sent, and the next
one, a few seconds later, carries everything it would have (snapshots hold
totals, not deltas). Whatever feeds ``build`` never waits for any of this.
Sender side only: importing it loads none of wrk-monitor's server parts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio
from pydantic import BaseModel

from contracts.monitor import PROTOCOL
from p2p.rpc import Method, RpcChannelClosed, RpcClient, RpcError, keep_client_channel
from p2p.swarm import UpkeepPolicy, stay_connected

__all__ = ["DEFAULT_INTERVAL_S", "PeriodicReporter"]

log = logging.getLogger(__name__)

#: Seconds between reports.
DEFAULT_INTERVAL_S = 5.0


class PeriodicReporter:
    """Calls ``method`` with ``build()`` on wrk-monitor every ``interval_s``.

    Args:
        method: the unary RPC method (``contracts.monitor``).
        build: the report now (synchronous; called once per push).
        channel_id: the id of the reporter's ``cosmicac-monitor/1`` channel
            (a mux keeps one channel per (protocol, id)).
        name: for log lines and the RPC client (``health_reporter``...).
        interval_s: seconds between reports.
        timeout_s: a push not answered by then is given up (the next one follows).
    """

    def __init__(self, method: Method, build: Callable[[], BaseModel], *, channel_id: bytes,
                 name: str, interval_s: float = DEFAULT_INTERVAL_S,
                 timeout_s: float = 5.0) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        self.method = method
        self.build = build
        self.channel_id = channel_id
        self.name = name
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        #: Reports wrk-monitor took, and those that failed or were refused.
        self.sent = 0
        self.failed = 0
        #: The last push was answered on the current connection.
        self.connected = False

    async def report(self, client: RpcClient) -> None:
        """Push reports over ``client`` every ``interval_s`` until its channel fails.

        A refusal (``FORBIDDEN``: this sender is not among wrk-monitor's
        pushers; ``INVALID_PARAMS``...) is logged and the next report waits its
        turn; a broken channel returns (the caller opens another).
        """
        try:
            while True:
                try:
                    await client.call(self.method, self.build(), timeout_s=self.timeout_s)
                except RpcError as exc:
                    self.failed += 1
                    self.connected = False
                    if isinstance(exc, RpcChannelClosed):
                        log.info("%s.push_failed code=%s reason=%s", self.name, exc.code, exc)
                        return
                    log.warning("%s.refused code=%s reason=%s", self.name, exc.code, exc)
                else:
                    self.sent += 1
                    self.connected = True
                await trio.sleep(self.interval_s)
        finally:
            self.connected = False

    async def run(self, swarm: object, monitor: bytes, addresses: Sequence = (), *,
                  backoff: UpkeepPolicy | None = None, retry_s: float = 5.0,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep a connection to wrk-monitor (key ``monitor``; ``addresses`` tried
        before the DHT) and report over it until cancelled."""
        async def on_connection(connection) -> None:
            await keep_client_channel(connection, PROTOCOL, self.report,
                                      channel_id=self.channel_id, name=self.name,
                                      retry_s=retry_s)

        extra = {} if backoff is None else {"backoff": backoff}
        await stay_connected(swarm, monitor, addresses=tuple(addresses) or None,
                             on_connection=on_connection, task_status=task_status, **extra)
