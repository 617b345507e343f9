"""wrk-monitor's ``metrics.agents``: its ``workers`` only (never ``allow_any_pusher`` or a
log pusher), hostile reports refused whole, the newest report per worker with staleness
and bounds, and ``cosmicac_agent_<name>`` on ``/metrics`` as Prometheus' own parser
reads it (counters by the ``_total`` suffix)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict

from contracts.monitor import (
    MAX_AGENT_VALUES,
    MAX_REPORT_AGENTS,
    METRICS_AGENTS,
    AgentMetrics,
    AgentMetricsReport,
    MetricsResult,
)
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.agent_metrics import (
    AgentMetricsBook,
    TooManyAgents,
    agent_metrics_registry,
    install,
)
from nodes.monitor.service import MonitorService
from p2p.rpc import Method, RpcError

from .support import connect

WORKER = b"\x11" * 32
OTHER_WORKER = b"\x12" * 32
AGENT = b"\x13" * 32
#: A daemon that may push logs (``pushers``), not agents' figures.
PUSHER = b"\x14" * 32


def agent(job_id: str = "j-1", replica: int = 0, node_rank: int = 0, **values: float
          ) -> AgentMetrics:
    return AgentMetrics(job_id=job_id, replica=replica, node_rank=node_rank,
                        service="agent-inference", values=values)


def report(*agents: AgentMetrics) -> AgentMetricsReport:
    return AgentMetricsReport(agents=agents)


def served(**kw) -> tuple[MonitorService, AgentMetricsBook]:
    service = MonitorService(LogBuffer(), pushers=[WORKER, PUSHER], workers=[WORKER],
                             clock=trio.current_time, **kw)
    book = AgentMetricsBook(stale_after_s=30)
    install(service, book)
    return service, book


async def test_a_workers_report_is_taken_and_others_are_forbidden(nursery, autojump_clock):
    service, book = served(allow_any_pusher=True)
    async with connect(nursery, service, WORKER) as worker, \
            connect(nursery, service, AGENT) as stranger, \
            connect(nursery, service, PUSHER) as pusher, \
            connect(nursery, service, None) as anonymous:
        with trio.fail_after(10):
            ok = await worker.call(METRICS_AGENTS, report(agent(up=1), agent("j-2", up=0)))
            assert ok.accepted == 2 and service.last_report_at is not None
            for client in (stranger, pusher, anonymous):
                with pytest.raises(RpcError) as refused:
                    await client.call(METRICS_AGENTS, report(agent("j-1", up=0)))
                assert refused.value.code == "FORBIDDEN"
    assert [a.values for a in book.agents(trio.current_time())] == [{"up": 1.0}, {"up": 0.0}]


class LooseReport(BaseModel):
    """What a hostile sender may put on the wire: anything."""

    model_config = ConfigDict(extra="allow")
    agents: Any = ()


LOOSE = Method("metrics.agents", params=LooseReport, result=MetricsResult)
GOOD = agent(up=1).model_dump()


@pytest.mark.parametrize("hostile", [
    {"agents": [GOOD] * 2},                                            # one agent twice
    {"agents": [{**GOOD, "replica": i} for i in range(MAX_REPORT_AGENTS + 1)]},
    {"agents": [{**GOOD, "values": {f"m{i}": 1 for i in range(MAX_AGENT_VALUES + 1)}}]},
    {"agents": [{**GOOD, "values": {"Bad": 1}}]},
    {"agents": [{**GOOD, "values": {"up} 1\nevil{": 1}}]},
    {"agents": [{**GOOD, "values": {"up": -1}}]},
    {"agents": [{**GOOD, "values": {"up": float("nan")}}]},
    {"agents": [{**GOOD, "values": {"up": float("inf")}}]},
    {"agents": [{**GOOD, "job_id": ""}]},
    {"agents": [{**GOOD, "job_id": "x" * 65}]},
    {"agents": [{**GOOD, "service": "agent\"} 1\n"}]},
    {"agents": [{**GOOD, "node_rank": 65}]},
    {"agents": [{**GOOD, "extra": 1}]},
    {"agents": "not a list"},
    {"extra": 1},
])
async def test_hostile_reports_are_refused_and_change_nothing(nursery, autojump_clock, hostile):
    service, book = served()
    async with connect(nursery, service, WORKER) as worker:
        with trio.fail_after(10):
            with pytest.raises(RpcError) as refused:
                await worker.call(LOOSE, LooseReport(**hostile))
            assert refused.value.code == "INVALID_PARAMS"
            assert book.accepted == 0 and service.last_report_at is None
            assert (await worker.call(METRICS_AGENTS, report(agent(up=1)))).accepted == 1


def test_the_newest_report_per_worker_counts_until_it_is_stale():
    book = AgentMetricsBook(stale_after_s=30)
    book.accept(WORKER, report(agent(up=1)), 0.0)
    book.accept(WORKER, report(agent(up=0), agent("j-2", up=1)), 5.0)
    assert [(a.job_id, a.values["up"]) for a in book.agents(5.0)] == [("j-1", 0.0), ("j-2", 1.0)]
    # A replica that moved to another worker: the newer report wins, one series each.
    book.accept(OTHER_WORKER, report(agent("j-2", up=0)), 10.0)
    assert [(a.job_id, a.values["up"]) for a in book.agents(10.0)] == [("j-1", 0.0), ("j-2", 0.0)]
    assert book.senders(36.0) == 1 and [a.job_id for a in book.agents(36.0)] == ["j-2"]
    assert book.agents(41.0) == [] and book.senders(41.0) == 0


def test_senders_and_agents_are_bounded():
    book = AgentMetricsBook(stale_after_s=30, max_senders=1, max_agents=2)
    book.accept(WORKER, report(agent(up=1)), 0.0)
    with pytest.raises(TooManyAgents) as info:
        book.accept(OTHER_WORKER, report(agent("j-2", up=1)), 1.0)
    assert info.value.code == "TOO_MANY_SENDERS"
    book.accept(OTHER_WORKER, report(agent("j-2", up=1)), 31.0)  # WORKER went stale
    book = AgentMetricsBook(stale_after_s=30, max_senders=4, max_agents=2)
    book.accept(WORKER, report(agent(up=1), agent("j-2", up=1)), 0.0)
    with pytest.raises(TooManyAgents) as info:
        book.accept(OTHER_WORKER, report(agent("j-3", up=1)), 1.0)
    assert info.value.code == "TOO_MANY_AGENTS" and book.refused == 1
    book.accept(WORKER, report(agent(up=1)), 2.0)  # a sender's own replacement fits
    book.accept(OTHER_WORKER, report(agent("j-3", up=1)), 3.0)


def test_exposition_parses_with_counters_by_suffix():
    clock = [0.0]
    book = AgentMetricsBook(stale_after_s=30)
    book.accept(WORKER, report(
        agent("j-1", 0, 0, model_server_up=1, inference_calls_total=42,
              model_server_health_check_ms=3.5),
        AgentMetrics(job_id="j-2", replica=1, node_rank=2, service="agent-instance",
                     values={"shell_sessions_open": 2, "shell_sessions_total": 7})), 0.0)
    text = generate_latest(agent_metrics_registry(book, lambda: clock[0])).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    up = families["cosmicac_agent_model_server_up"]
    assert up.type == "gauge"
    [sample] = up.samples
    assert sample.labels == {"job_id": "j-1", "replica": "0", "node_rank": "0",
                             "service": "agent-inference"} and sample.value == 1
    calls = families["cosmicac_agent_inference_calls"]
    assert calls.type == "counter"
    assert [(s.name, s.value) for s in calls.samples] == [
        ("cosmicac_agent_inference_calls_total", 42)]
    shells = families["cosmicac_agent_shell_sessions"]
    assert shells.type == "counter" and shells.samples[0].labels["node_rank"] == "2"
    assert families["cosmicac_agent_shell_sessions_open"].samples[0].value == 2
    assert families["cosmicac_monitor_agent_metrics_senders"].samples[0].value == 1
    clock[0] = 31.0  # the worker went stale: its agents' series go with it
    text = generate_latest(agent_metrics_registry(book, lambda: clock[0])).decode()
    assert "cosmicac_agent_" not in text.replace("cosmicac_monitor_agent_", "")


def test_a_jobs_last_word_is_its_least_recently_heard_agents_in_wall_time():
    """``heard_age_seconds`` (the worker's clock) read back from the report's arrival
    (wrk-monitor's): no clock of the worker's machine is trusted."""
    book = AgentMetricsBook(stale_after_s=30)
    book.accept(WORKER, report(agent("j-1", 0, heard_age_seconds=2.0),
                               agent("j-1", 1, heard_age_seconds=90.0),  # silent
                               agent("j-2", 0, up=1.0)), 100.0)  # no age: an older worker
    heard = book.heard(["j-1", "j-2", "j-3"], now=104.0, wall_now=5_000.0)
    assert [(h.job_id, h.heard_at, h.agents) for h in heard] == [
        ("j-1", 5_000.0 - 4.0 - 90.0, 2), ("j-2", None, 0), ("j-3", None, 0)]
    assert [h.heard_at for h in book.heard(["j-1"], now=131.0, wall_now=6_000.0)] == [None]


async def test_agents_heard_is_app_nodes_alone_over_the_rpc(nursery, autojump_clock):
    from contracts.monitor import AGENTS_HEARD, HealthQuery

    app = b"\x15" * 32
    service, book = served(followers=[app])
    book.accept(WORKER, report(agent("j-1", heard_age_seconds=1.0)), trio.current_time())
    async with connect(nursery, service, app) as client:
        with trio.fail_after(10):
            answer = await client.call(AGENTS_HEARD, HealthQuery(job_ids=("j-1",)))
            assert answer.jobs[0].agents == 1 and answer.jobs[0].heard_at is not None
    async with connect(nursery, service, WORKER) as worker:
        with trio.fail_after(10), pytest.raises(RpcError) as refused:
            await worker.call(AGENTS_HEARD, HealthQuery(job_ids=("j-1",)))
        assert refused.value.code == "FORBIDDEN"
