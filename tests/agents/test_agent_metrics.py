"""An agent's figures ride its heartbeats (telemetry on only): its process's, its shell
sessions', an inference workload's model server and calls; figures out of the contract's
bounds are left out, never the heartbeat (real 127.0.0.1 sockets, bounded waits)."""

from __future__ import annotations

import math

import trio

from agents._agent import Agent, ReportPolicy
from agents._metrics import clean, process_metrics
from agents.inference import InferenceWorkload
from contracts.agent_report import MAX_AGENT_METRICS
from contracts.inference import InferRequest
from nodes.k8s_worker.agents import AgentEventKind
from p2p.keys import KeyPair

from ..p2p.helpers import wait_until
from ..p2p.swarm.helpers import swarm_net
from .helpers import agent_config, running_worker, vmi_of
from .inference.test_agent_inference import (
    FAST,
    chat,
    collect,
    inference_config,
    next_kind,
    proxy_client,
)

QUICK = ReportPolicy(backoff_min_s=0.05, backoff_max_s=0.2, connect_timeout_s=5)


def test_process_figures_are_cheap_and_sane():
    figures = process_metrics()
    assert figures["process_resident_memory_bytes"] > 1 << 20
    assert figures["process_cpu_seconds_total"] > 0
    assert figures["uptime_seconds"] >= 0
    assert clean(figures) == figures


def test_figures_out_of_bounds_are_left_out_not_the_heartbeat():
    values = {"ok": 1, "neg": -1, "nan": math.nan, "inf": math.inf, "Bad": 1, "x" * 49: 1,
              "text": "nope", "huge": 2.0**64, **{f"m{i}": i for i in range(40)}}
    kept = clean(values)
    assert kept["ok"] == 1 and len(kept) == MAX_AGENT_METRICS
    assert not {"neg", "nan", "inf", "Bad", "x" * 49, "text", "huge"} & set(kept)


def figures_of(worker) -> dict[str, float]:
    found = worker.registry.table.agent_metrics()
    return dict(found[0].values) if found else {}


async def test_a_container_agent_with_telemetry_sends_its_figures(nursery):
    async with running_worker(nursery) as worker:
        config = agent_config(worker.keypair.public_key, address=worker.address, replica=1,
                              job_id="j-shell").model_copy(update={"telemetry": True})
        worker.registry.expect(vmi_of(config))
        agent = Agent(config, KeyPair.generate(), worker_addresses=[worker.address],
                      policy=QUICK)
        await nursery.start(agent.run)
        await wait_until(lambda: "shell_sessions_open" in figures_of(worker), limit_s=10)
        [labelled] = worker.registry.table.agent_metrics()
        assert (labelled.job_id, labelled.replica, labelled.service) == (
            "j-shell", 1, "agent-instance")
        figures = labelled.values
        assert figures["shell_sessions_open"] == 0 and figures["shell_sessions_total"] == 0
        assert figures["shell_sessions_revoked_total"] == 0
        assert figures["process_resident_memory_bytes"] > 0
        assert figures["report_sessions_total"] == 1
        nursery.cancel_scope.cancel()


async def test_without_telemetry_heartbeats_stay_empty(nursery):
    async with running_worker(nursery) as worker:
        config = agent_config(worker.keypair.public_key, address=worker.address)
        worker.registry.expect(vmi_of(config))
        agent = Agent(config, KeyPair.generate(), worker_addresses=[worker.address],
                      policy=QUICK)
        await nursery.start(agent.run)
        name = vmi_of(config).name
        await wait_until(lambda: (s := worker.registry.state(name)) is not None
                         and s.ready, limit_s=10)
        first = worker.registry.state(name).last_report_at
        await wait_until(lambda: worker.registry.state(name).last_report_at > first,
                         limit_s=10)  # a heartbeat came
        assert worker.registry.table.agent_metrics() == []
        nursery.cancel_scope.cancel()


async def test_an_inference_agent_reports_its_model_server_and_calls():
    async with (swarm_net(dht_nodes=3) as net, trio.open_nursery() as nursery,
                running_worker(nursery) as worker):
        config = inference_config(worker.keypair.public_key, worker.address,
                                  net.bootstrap).model_copy(update={"telemetry": True})
        worker.registry.expect(vmi_of(config))
        workload = InferenceWorkload(config, policy=FAST)
        agent = Agent(config, KeyPair.generate(), bootstrap=net.bootstrap,
                      worker_addresses=[worker.address], workload=workload, policy=QUICK)
        nursery.start_soon(agent.run)
        await next_kind(worker, AgentEventKind.READY)
        async with proxy_client(net, agent) as proxy:
            with trio.fail_after(30):
                frames = await collect(proxy, InferRequest(
                    path="/v1/chat/completions", content_type="application/json",
                    body=chat()))
        assert frames
        # The worker holds the latest heartbeat's figures, maybe made while the call
        # still ran (total 1, one in flight): wait for a heartbeat made after it ended.
        await wait_until(lambda: figures_of(worker).get("inference_calls_total") == 1
                         and figures_of(worker).get("inference_calls_in_flight") == 0
                         and "model_server_health_check_ms" in figures_of(worker),
                         limit_s=20)
        figures = figures_of(worker)
        assert figures["model_server_up"] == 1 and figures["inference_calls_in_flight"] == 0
        assert figures["model_server_restarts_total"] == 0
        assert figures["model_server_consecutive_failures"] == 0
        assert [a.service for a in worker.registry.table.agent_metrics()] == ["agent-inference"]
        nursery.cancel_scope.cancel()
