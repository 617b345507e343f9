"""The worker's agents' figures, forwarded to wrk-monitor: ``metrics.agents`` every 5 s.

Agents never dial wrk-monitor (their keys are not its pushers, and they run
in VMs the platform does not trust): each sends its figures to its worker
with its heartbeat (``Heartbeat.metrics``). The worker's
:class:`~.agents.AgentTable` keeps the latest per VMI, labelled with what the
worker knows of the VMI (job id, replica, node rank, service) and never with
what the agent claims; this reporter pushes that table, as it is at each
push, to wrk-monitor, on its own ``cosmicac-monitor/1`` channel
(:data:`CHANNEL_ID`) beside the worker's log shipper, through the same
:class:`~nodes.kit.reporter.PeriodicReporter` as proxy-inference's
health reports.

Latest snapshot only, never queued: a push that fails is simply not sent,
the next one carries the figures as they are then. wrk-monitor drops a
worker's report once it is stale, so a worker that stops takes its agents'
series with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from contracts.monitor import MAX_REPORT_AGENTS, METRICS_AGENTS, AgentMetrics, AgentMetricsReport
from nodes.kit.metrics import Family, Snapshot
from nodes.kit.reporter import DEFAULT_INTERVAL_S, PeriodicReporter

__all__ = ["CHANNEL_ID", "AgentMetricsReporter", "agent_metrics_snapshot"]

#: The reporter's channel id (the log shipper holds the empty one).
CHANNEL_ID = b"agent-metrics"


class AgentMetricsReporter(PeriodicReporter):
    """Pushes ``source()`` (the table's :meth:`~.agents.AgentTable.agent_metrics`)
    to wrk-monitor every ``interval_s``; ``report`` and ``run`` as in
    :class:`~nodes.kit.reporter.PeriodicReporter`.

    A worker with more than :data:`~contracts.monitor.MAX_REPORT_AGENTS`
    reporting agents sends the first ones and counts the rest in :attr:`left_out`.
    """

    def __init__(self, source: Callable[[], Sequence[AgentMetrics]], *,
                 interval_s: float = DEFAULT_INTERVAL_S, timeout_s: float = 5.0) -> None:
        super().__init__(METRICS_AGENTS, self._build, channel_id=CHANNEL_ID,
                         name="agent_metrics_reporter", interval_s=interval_s,
                         timeout_s=timeout_s)
        self.source = source
        #: Agents in the last report built, and those left out by the bound.
        self.agents = 0
        self.left_out = 0

    def _build(self) -> AgentMetricsReport:
        agents = list(self.source())
        self.left_out = max(0, len(agents) - MAX_REPORT_AGENTS)
        agents = agents[:MAX_REPORT_AGENTS]
        self.agents = len(agents)
        return AgentMetricsReport(agents=tuple(agents))


def agent_metrics_snapshot(reporter: AgentMetricsReporter) -> Snapshot:
    """The reporter's counters, for the worker's own ``/metrics``."""
    return Snapshot({
        "worker_agent_metrics_reports_sent": Family("Agent metrics reports wrk-monitor took",
                                                    reporter.sent, counter=True),
        "worker_agent_metrics_reports_failed": Family(
            "Agent metrics reports not taken (down, refused)", reporter.failed, counter=True),
        "worker_agent_metrics_agents": Family("Agents in the last metrics report",
                                              reporter.agents),
    })
