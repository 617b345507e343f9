"""The task that sends the proxy's window to wrk-monitor: ``metrics.push`` every few seconds.

One connection to wrk-monitor (``p2p.swarm.stay_connected``: its addresses,
then the DHT, redialled with backoff), one ``cosmicac-monitor/1`` channel of
its own on it (not the log shipper's: a slow log push never delays a report,
nor the reverse), and on it, every ``interval_s``, one ``metrics.push`` of
:meth:`~.health.HealthWindow.report` as it is then: the loop is
:class:`nodes.kit.reporter.PeriodicReporter`, shared with the workers'
agent metrics reporter.

Latest snapshot only: a report is built when it is sent, never queued; one
that fails (wrk-monitor down, slow, refusing) is simply not sent, and the next
one, a few seconds later, carries everything it would have (the window's
figures are totals, not deltas). Requests never wait for any of this: they
only touch the window (:meth:`HealthWindow.record`). wrk-monitor treats a
sender silent for ``health.stale_after_s`` as gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from contracts.monitor import METRICS_PUSH
from nodes.kit.metrics import Family, Snapshot
from nodes.kit.reporter import DEFAULT_INTERVAL_S, PeriodicReporter

from .health import HealthWindow

__all__ = ["DEFAULT_INTERVAL_S", "HealthReporter", "health_snapshot"]

#: The channel's id: the log shipper holds ``cosmicac-monitor/1`` with the
#: empty id on the same connection, and a mux keeps one channel per (protocol, id).
CHANNEL_ID = b"metrics"


class HealthReporter(PeriodicReporter):
    """Pushes ``window``'s report to wrk-monitor every ``interval_s``
    (:class:`~nodes.kit.reporter.PeriodicReporter`: ``report``, ``run``).

    Args:
        window: the proxy's window (the app records into it).
        routed: the job ids the proxy routes now (reported even when idle).
        interval_s: seconds between reports (the window's bucket, so each
            report sees it move).
        timeout_s: a push not answered by then is given up (the next one follows).
        clock: the clock ``window`` is recorded with (``time.perf_counter``).
    """

    def __init__(self, window: HealthWindow, *, routed: Callable[[], Iterable[str]] = tuple,
                 interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(METRICS_PUSH, self._build, channel_id=CHANNEL_ID,
                         name="health_reporter", interval_s=interval_s, timeout_s=timeout_s)
        self.window = window
        self.routed = routed
        self.clock = clock

    def _build(self):
        return self.window.report(self.clock(), self.routed())


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
