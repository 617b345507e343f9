"""The job agents' figures, as their workers forward them: ``metrics.agents`` in, ``/metrics`` out.

Theory of operation
-------------------
Agents send their figures to their worker with each heartbeat; every few
seconds each worker pushes the latest of all its agents
(:class:`~contracts.monitor.AgentMetricsReport`, ``metrics.agents``; sender:
``nodes/k8s_worker/agent_metrics.py``). Each agent is labelled by the worker
from the VMI its key is bound to, so an agent can only ever speak for its own
replica; the worker, in turn, must be one of wrk-monitor's ``workers``
(``allow_any_pusher`` never admits this method: it opens logs to agents, and
an agent must not forge other agents' figures; nor may a proxy or another
pusher, whose keys are on other lists).

:class:`AgentMetricsBook` (sans-IO) keeps the newest report of each worker
with the time it came (wrk-monitor's clock) and nothing older; a worker silent
for ``stale_after_s`` no longer counts (its agents' series disappear). Bounds:
``max_senders`` workers (a new one past it replaces a stale one, else is
refused: ``TOO_MANY_SENDERS``) and ``max_agents`` agents over the fresh
workers together (a report that would pass it: ``TOO_MANY_AGENTS``), so the
series a scrape shows stay bounded (``max_agents`` x 32 figures).

Exposition (read at scrape time, :func:`agent_metrics_registry`): each figure
``<name>`` of an agent is ``cosmicac_agent_<name>{job_id, replica,
node_rank, service}``; a name ending in ``_total`` is a counter, any other a
gauge. When two workers report the same (job_id, replica, node_rank) (a
replica moved), the newer report wins. Plus ``cosmicac_monitor_agent_metrics_senders``
and ``cosmicac_monitor_agent_metrics_reports_total``.

:func:`install` adds the handler to a running
:class:`~nodes.monitor.service.MonitorService` (``add_method``: its ``workers``
are checked at each call, so a reload of them applies).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from contracts.monitor import (
    AGENTS_HEARD,
    HEARD_AGE,
    METRICS_AGENTS,
    AgentMetrics,
    AgentMetricsReport,
    HealthQuery,
    HeardResult,
    JobHeard,
    MetricsResult,
)
from p2p.rpc import CallContext, Method, RpcError

__all__ = ["AgentMetricsBook", "TooManyAgents", "agent_metrics_registry", "install"]

#: Labels of every agent series.
LABELS = ("job_id", "replica", "node_rank", "service")


class TooManyAgents(Exception):
    """A report past the book's bounds; ``code`` is the RPC error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class AgentMetricsBook:
    """The newest :class:`AgentMetricsReport` of each worker (see the module doc).

    Args:
        stale_after_s: a worker silent this long no longer counts.
        max_senders: workers kept at once.
        max_agents: agents over the fresh workers together.
    """

    def __init__(self, *, stale_after_s: float = 30.0, max_senders: int = 1024,
                 max_agents: int = 16_384) -> None:
        if stale_after_s <= 0 or max_senders < 1 or max_agents < 1:
            raise ValueError("stale_after_s, max_senders and max_agents must be positive")
        self.stale_after_s = stale_after_s
        self.max_senders = max_senders
        self.max_agents = max_agents
        #: sender key -> (arrival time, report)
        self._reports: dict[bytes, tuple[float, AgentMetricsReport]] = {}
        #: Reports taken, and refused by the bounds.
        self.accepted = 0
        self.refused = 0

    def accept(self, sender: bytes, report: AgentMetricsReport, now: float) -> None:
        """Keep ``report`` as ``sender``'s newest (replacing its previous one).

        Raises:
            TooManyAgents: ``TOO_MANY_SENDERS`` or ``TOO_MANY_AGENTS`` (nothing kept).
        """
        reports = self._reports
        if sender not in reports and len(reports) >= self.max_senders:
            self.expire(now)
        if sender not in reports and len(reports) >= self.max_senders:
            self.refused += 1
            raise TooManyAgents("TOO_MANY_SENDERS", f"wrk-monitor keeps at most "
                                                    f"{self.max_senders} agent metrics senders")
        others = sum(len(r.agents) for key, (_, r) in reports.items() if key != sender)
        if others + len(report.agents) > self.max_agents:
            self.expire(now)
            others = sum(len(r.agents) for key, (_, r) in reports.items() if key != sender)
            if others + len(report.agents) > self.max_agents:
                self.refused += 1
                raise TooManyAgents("TOO_MANY_AGENTS", f"wrk-monitor keeps the figures of at "
                                                       f"most {self.max_agents} agents")
        reports[sender] = (now, report)
        self.accepted += 1

    def expire(self, now: float) -> int:
        """Forget the workers silent for ``stale_after_s``; how many went."""
        cutoff = now - self.stale_after_s
        stale = [key for key, (at, _) in self._reports.items() if at < cutoff]
        for key in stale:
            del self._reports[key]
        return len(stale)

    def senders(self, now: float) -> int:
        """Fresh workers."""
        cutoff = now - self.stale_after_s
        return sum(at >= cutoff for at, _ in self._reports.values())

    def heard(self, job_ids: Iterable[str], now: float, wall_now: float) -> list[JobHeard]:
        """Per asked job, the wall time of its least recently heard agent's last
        report (:data:`~contracts.monitor.HEARD_AGE` read back from the report's
        arrival), None when no fresh report names an agent of it."""
        wanted = set(job_ids)
        oldest: dict[str, float] = {}
        counted: dict[str, int] = {}
        for at, agent in self._latest(now).values():
            age = agent.values.get(HEARD_AGE)
            if agent.job_id not in wanted or age is None:
                continue
            heard_at = wall_now - (now - at) - age
            oldest[agent.job_id] = min(heard_at, oldest.get(agent.job_id, heard_at))
            counted[agent.job_id] = counted.get(agent.job_id, 0) + 1
        return [JobHeard(job_id=job_id, heard_at=oldest.get(job_id),
                         agents=counted.get(job_id, 0)) for job_id in job_ids]

    def agents(self, now: float) -> list[AgentMetrics]:
        """Every fresh agent's figures; one per (job_id, replica, node_rank), the
        newest report's, sorted by those."""
        latest = self._latest(now)
        return [latest[slot][1] for slot in sorted(latest)]

    def _latest(self, now: float) -> dict[tuple[str, int, int], tuple[float, AgentMetrics]]:
        """Each agent slot's newest fresh figures, with their report's arrival."""
        cutoff = now - self.stale_after_s
        latest: dict[tuple[str, int, int], tuple[float, AgentMetrics]] = {}
        for at, report in self._reports.values():
            if at < cutoff:
                continue
            for agent in report.agents:
                slot = (agent.job_id, agent.replica, agent.node_rank)
                held = latest.get(slot)
                if held is None or held[0] < at:
                    latest[slot] = (at, agent)
        return latest


class _Collector:
    def __init__(self, book: AgentMetricsBook, clock: Callable[[], float]) -> None:
        self._book = book
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        book = self._book
        now = self._clock()
        families: dict[str, Metric] = {}
        for agent in book.agents(now):
            labels = [agent.job_id, str(agent.replica), str(agent.node_rank), agent.service]
            for name, value in agent.values.items():
                family = families.get(name)
                if family is None:
                    if name.endswith("_total"):
                        family = CounterMetricFamily(
                            f"cosmicac_agent_{name[:-len('_total')]}",
                            f"Agents' {name} (a counter), forwarded by their workers",
                            labels=LABELS)
                    else:
                        family = GaugeMetricFamily(
                            f"cosmicac_agent_{name}",
                            f"Agents' {name}, forwarded by their workers", labels=LABELS)
                    families[name] = family
                family.add_metric(labels, value)
        for name in sorted(families):
            yield families[name]
        yield GaugeMetricFamily("cosmicac_monitor_agent_metrics_senders",
                                "Workers whose agent metrics report is fresh",
                                value=book.senders(now))
        yield CounterMetricFamily("cosmicac_monitor_agent_metrics_reports",
                                  "Agent metrics reports taken", value=book.accepted)


def agent_metrics_registry(book: AgentMetricsBook, clock: Callable[[], float]
                           ) -> CollectorRegistry:
    """A registry whose every scrape shows ``book``'s fresh agents at ``clock()``."""
    registry = CollectorRegistry()
    registry.register(_Collector(book, clock))
    return registry


class _Service(Protocol):
    agent_metrics: Any
    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    last_report_at: float | None

    def add_method(self, method: Method, handler: Callable[..., Any]) -> None: ...


def install(service: _Service, book: AgentMetricsBook) -> None:
    """Serve ``metrics.agents`` on ``service`` into ``book`` (its ``workers`` only)."""

    async def metrics_agents(params: AgentMetricsReport, ctx: CallContext) -> MetricsResult:
        key = ctx.remote_public_key
        assert key is not None  # add_method checked it is a worker's
        try:
            book.accept(key, params, service.clock())
        except TooManyAgents as exc:
            raise RpcError(exc.code, str(exc)) from None
        service.last_report_at = service.wall_clock()
        return MetricsResult(accepted=len(params.agents))

    async def agents_heard(params: HealthQuery, ctx: CallContext) -> HeardResult:
        return HeardResult(jobs=tuple(book.heard(params.job_ids, service.clock(),
                                                 service.wall_clock())))

    service.add_method(METRICS_AGENTS, metrics_agents)
    service.add_method(AGENTS_HEARD, agents_heard)
    service.agent_metrics = book
