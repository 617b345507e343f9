"""The task that sends the proxy's window to wrk-monitor: ``metrics.push`` every few seconds.

One connection to wrk-monitor (``p2p.swarm.stay_connected``: its addresses,
then the DHT, redialled with backoff), one ``cosmicac-monitor/1`` channel of
its own on it (not the log shipper's: a slow log push never delays a report,
nor the reverse), and on it, every ``interval_s``, one ``metrics.push`` of
:meth:`~.health.HealthWindow.report` as it is then.

Latest snapshot only: a report is built when it is sent, never queued; one
that fails (wrk-monitor down, slow, refusing) is simply not sent, and the next
one, a few seconds later, carries everything it would have (the window's
figures are totals, not deltas). Requests never wait for any of this: they
only touch the window (:meth:`HealthWindow.record`). wrk-monitor treats a
sender silent for ``health.stale_after_s`` as gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

import trio

from contracts.telemetry import METRICS_PUSH, PROTOCOL
from nodes.metrics import Family, Snapshot
from p2p.rpc import RpcChannelClosed, RpcClient, RpcError
from p2p.swarm import UpkeepPolicy, stay_connected

from .health import HealthWindow

__all__ = ["DEFAULT_INTERVAL_S", "HealthReporter", "health_snapshot"]

log = logging.getLogger(__name__)

#: The channel's id: the log shipper holds ``cosmicac-monitor/1`` with the
#: empty id on the same connection, and a mux keeps one channel per (protocol, id).
CHANNEL_ID = b"metrics"
#: Seconds between reports: the window's bucket, so each report sees it move.
DEFAULT_INTERVAL_S = 5.0


class HealthReporter:
    """Pushes ``window``'s report to wrk-monitor every ``interval_s``.

    Args:
        window: the proxy's window (the app records into it).
        routed: the job ids the proxy routes now (reported even when idle).
        interval_s: seconds between reports.
        timeout_s: a push not answered by then is given up (the next one follows).
        clock: the clock ``window`` is recorded with (``time.perf_counter``).
    """

    def __init__(self, window: HealthWindow, *, routed: Callable[[], Iterable[str]] = tuple,
                 interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        self.window = window
        self.routed = routed
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        #: Reports wrk-monitor took, and those that failed or were refused.
        self.sent = 0
        self.failed = 0
        #: The last push was answered on the current connection.
        self.connected = False

    async def report(self, client: RpcClient) -> None:
        """Push reports over ``client`` every ``interval_s`` until its channel fails.

        A refusal (``FORBIDDEN``: this proxy is not among wrk-monitor's
        pushers; ``INVALID_PARAMS``) is logged and the next report waits its
        turn; a broken channel returns (the caller opens another).
        """
        try:
            while True:
                report = self.window.report(self.clock(), self.routed())
                try:
                    await client.call(METRICS_PUSH, report, timeout_s=self.timeout_s)
                except RpcError as exc:
                    self.failed += 1
                    self.connected = False
                    if isinstance(exc, RpcChannelClosed):
                        log.info("health_reporter.push_failed code=%s reason=%s", exc.code, exc)
                        return
                    log.warning("health_reporter.refused code=%s reason=%s", exc.code, exc)
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
            while True:
                try:
                    channel = await connection.open_channel(PROTOCOL, CHANNEL_ID)
                except Exception as exc:  # no such service (yet), or the connection went
                    log.info("health_reporter.open_failed reason=%s", exc)
                else:
                    client = RpcClient(channel, name="health-reporter")
                    async with trio.open_nursery() as nursery:
                        await nursery.start(client.run)
                        try:
                            await self.report(client)
                        finally:
                            nursery.cancel_scope.cancel()
                            with trio.CancelScope(shield=True):
                                await client.aclose()
                await trio.sleep(retry_s)

        extra = {} if backoff is None else {"backoff": backoff}
        await stay_connected(swarm, monitor, addresses=tuple(addresses) or None,
                             on_connection=on_connection, task_status=task_status, **extra)


def health_snapshot(reporter: HealthReporter) -> Snapshot:
    """The reporter's and its window's counters, for the proxy's ``/metrics``."""
    stats = reporter.window.statistics()
    return Snapshot({
        "proxy_health_reports_sent": Family("Metrics reports wrk-monitor took",
                                            reporter.sent, counter=True),
        "proxy_health_reports_failed": Family("Metrics reports not taken (down, refused)",
                                              reporter.failed, counter=True),
        "proxy_health_jobs": Family("Jobs in the health window", stats.jobs),
        "proxy_health_dropped": Family("Requests not in the window (past its job bound)",
                                       stats.dropped, counter=True),
    })
