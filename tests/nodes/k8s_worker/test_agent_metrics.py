"""Agents' figures on the worker: the heartbeat's metrics are bounded by the contract
(hypothesis), kept per VMI and labelled with the bound VMI (an agent cannot speak for
another job), forgotten with the VMI, its silence or a new hello; an old agent's empty
heartbeat still goes through; and the reporter pushes the latest snapshot to wrk-monitor
over an in-memory channel (autojump clock), never queueing."""

from __future__ import annotations

import math

import pytest
import trio
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from contracts.agent_report import HEARTBEAT, HELLO, MAX_AGENT_METRICS, Heartbeat, ReportCode
from contracts.monitor import MAX_REPORT_AGENTS, AgentMetrics
from nodes.k8s_worker.agent_metrics import AgentMetricsReporter, agent_metrics_snapshot
from nodes.k8s_worker.agents import AgentTable
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.agent_metrics import AgentMetricsBook, install
from nodes.monitor.service import MonitorService
from p2p.rpc import RpcError
from p2p.rpc._models import dump
from tests.agents.helpers import agent_config, vmi_of
from tests.nodes.monitor.support import connect

from .registry_client import AGENT, STRANGER, WORKER, client_as, hello_of, registry_and_events

GOOD_NAME = st.from_regex(r"[a-z][a-z0-9_]{0,47}", fullmatch=True)
GOOD_VALUE = st.floats(min_value=0, max_value=2.0**63, allow_nan=False, allow_infinity=False)


@given(st.dictionaries(GOOD_NAME, GOOD_VALUE, max_size=MAX_AGENT_METRICS))
def test_a_heartbeat_takes_bounded_well_named_finite_figures(metrics):
    beat = Heartbeat.model_validate({"metrics": metrics})
    assert beat.metrics == metrics
    assert Heartbeat.model_validate(dump(beat)) == beat


BAD_NAME = st.one_of(st.text(max_size=60).filter(
    lambda s: not (0 < len(s) <= 48 and s[0].isascii() and s[0].islower()
                   and all(c.isascii() and (c.islower() or c.isdigit() or c == "_")
                           for c in s))),
    st.just("a" * 49), st.just("Up"), st.just("9lives"), st.just("a-b"), st.just(""))
BAD_VALUE = st.one_of(st.floats(max_value=-1e-300), st.just(math.nan), st.just(math.inf),
                      st.floats(min_value=2.0**63, exclude_min=True), st.text(min_size=1))


@given(BAD_NAME, GOOD_VALUE)
def test_a_heartbeat_with_a_bad_name_is_refused(name, value):
    with pytest.raises(ValidationError):
        Heartbeat.model_validate({"metrics": {name: value}})


@given(GOOD_NAME, BAD_VALUE)
@example("a", "0")  # a number's text: pydantic would coerce it without strict
@example("a", True)
def test_a_heartbeat_with_a_bad_value_is_refused(name, value):
    with pytest.raises(ValidationError):
        Heartbeat.model_validate({"metrics": {name: value}})


def test_a_heartbeat_with_too_many_figures_is_refused():
    with pytest.raises(ValidationError):
        Heartbeat.model_validate({"metrics": {f"m{i}": 1 for i in range(MAX_AGENT_METRICS + 1)}})


def test_an_empty_heartbeat_is_what_version_1_sent():
    # An older worker's Heartbeat is extra="forbid" and field-less: the wire must stay {}.
    assert dump(Heartbeat()) == {}
    assert Heartbeat.model_validate({}) == Heartbeat()


def test_the_table_keeps_figures_per_vmi_labelled_by_the_bound_vmi():
    table = AgentTable(silent_after_s=10)
    mine = agent_config(WORKER, job_id="j-mine", replica=2, node_rank=0)
    other = agent_config(WORKER, job_id="j-other", replica=0)
    table.expect(vmi_of(mine))
    table.expect(vmi_of(other))
    table.hello(AGENT, hello_of(mine), 0.0)
    assert table.agent_metrics() == []  # nothing until a heartbeat carries figures
    table.heartbeat(AGENT, 1.0, {"uptime_seconds": 5.0})
    table.heartbeat(AGENT, 2.0, None)  # an older agent's empty beat keeps the last figures
    assert table.agent_metrics() == [AgentMetrics(
        job_id="j-mine", replica=2, node_rank=0, service="agent-instance",
        values={"uptime_seconds": 5.0})]
    # A stranger has no VMI: its figures go nowhere.
    with pytest.raises(Exception) as info:
        table.heartbeat(STRANGER, 3.0, {"uptime_seconds": 1.0})
    assert info.value.code is ReportCode.NOT_INTRODUCED
    # A new hello (another agent process, maybe) starts afresh; silence and forget drop them.
    table.heartbeat(AGENT, 4.0, {"uptime_seconds": 6.0})
    table.hello(AGENT, hello_of(mine), 5.0)
    assert table.agent_metrics() == []
    table.heartbeat(AGENT, 6.0, {"uptime_seconds": 7.0})
    assert table.expire(20.0) and table.agent_metrics() == []
    table.heartbeat(AGENT, 21.0, {"uptime_seconds": 8.0})
    assert len(table.agent_metrics()) == 1
    table.forget(vmi_of(mine).name)
    assert table.agent_metrics() == []


def test_the_report_names_every_agent_heard_from_with_its_age_silent_ones_too():
    table = AgentTable(silent_after_s=10)
    mine = agent_config(WORKER, job_id="j-mine", replica=0)
    table.expect(vmi_of(mine))
    assert table.agent_report(0.0) == []  # nothing heard yet
    table.hello(AGENT, hello_of(mine), 1.0)
    table.heartbeat(AGENT, 2.0, {"uptime_seconds": 5.0})
    [fresh] = table.agent_report(3.5)
    assert fresh.values == {"uptime_seconds": 5.0, "heard_age_seconds": 1.5}
    assert table.expire(20.0)  # silent: its figures are stale, its age is the news
    [silent] = table.agent_report(80.0)
    assert silent.values == {"heard_age_seconds": 78.0}
    many = {f"m{i}": float(i) for i in range(MAX_AGENT_METRICS)}
    table.heartbeat(AGENT, 81.0, many)
    [full] = table.agent_report(81.0)
    assert len(full.values) <= MAX_AGENT_METRICS and full.values["heard_age_seconds"] == 0


async def test_figures_arrive_over_the_rpc_and_cannot_claim_another_job(nursery, autojump_clock):
    mine = agent_config(WORKER, job_id="j-mine", replica=1)
    victim = agent_config(WORKER, job_id="j-victim", replica=0)
    async with registry_and_events(nursery) as (registry, _events), \
            client_as(nursery, registry, AGENT) as client, \
            client_as(nursery, registry, STRANGER) as stranger:
        registry.expect(vmi_of(mine))
        registry.expect(vmi_of(victim))
        await client.call(HELLO, hello_of(mine))
        with trio.fail_after(5):
            await client.call(HEARTBEAT, Heartbeat(metrics={"shell_sessions_open": 2}))
            await client.call(HEARTBEAT, Heartbeat())  # the old agent's form
            with pytest.raises(RpcError) as info:
                await stranger.call(HEARTBEAT, Heartbeat(metrics={"shell_sessions_open": 9}))
        assert info.value.code == ReportCode.NOT_INTRODUCED
        [only] = registry.table.agent_metrics()
        assert (only.job_id, only.replica, only.values) == ("j-mine", 1,
                                                            {"shell_sessions_open": 2.0})


async def test_the_reporter_pushes_the_tables_latest_figures(nursery, autojump_clock):
    service = MonitorService(LogBuffer(), workers=[WORKER], clock=trio.current_time)
    book = AgentMetricsBook(stale_after_s=30)
    install(service, book)
    figures = {"uptime_seconds": 1.0}

    def source():
        return [AgentMetrics(job_id="j", replica=0, node_rank=0, service="agent-inference",
                             values=dict(figures))]

    reporter = AgentMetricsReporter(source, interval_s=5)
    async with connect(nursery, service, WORKER) as client:
        with trio.fail_after(60):
            nursery.start_soon(reporter.report, client)
            await trio.sleep(1)
            assert reporter.sent == 1 and reporter.connected and reporter.agents == 1
            figures["uptime_seconds"] = 6.0
            await trio.sleep(5)
            assert reporter.sent == 2
            [agent] = book.agents(trio.current_time())
            assert agent.values == {"uptime_seconds": 6.0}
    snap = agent_metrics_snapshot(reporter)
    assert snap.families["worker_agent_metrics_reports_sent"].value == 2


async def test_a_refused_reporter_keeps_its_pace_and_queues_nothing(nursery, autojump_clock):
    service = MonitorService(LogBuffer(), pushers=[], allow_any_pusher=True,
                             clock=trio.current_time)
    book = AgentMetricsBook()
    install(service, book)
    reporter = AgentMetricsReporter(list, interval_s=5)
    async with connect(nursery, service, WORKER) as client:
        with trio.fail_after(60):
            nursery.start_soon(reporter.report, client)
            await trio.sleep(21)
            # allow_any_pusher opens logs, never agent metrics.
            assert (reporter.sent, reporter.failed) == (0, 5) and book.accepted == 0


def test_a_report_holds_at_most_the_contracts_bound():
    agents = [AgentMetrics(job_id="j", replica=i % 1024, node_rank=i // 1024, service="agent-x",
                           values={}) for i in range(MAX_REPORT_AGENTS + 3)]
    reporter = AgentMetricsReporter(lambda: agents)
    report = reporter.build()
    assert len(report.agents) == MAX_REPORT_AGENTS and reporter.left_out == 3
