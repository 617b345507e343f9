"""``cosmicac jobs list`` and ``jobs get`` show a job's model health beside its status
(run in this process) against an in-process app-node, wrk-ork and wrk-monitor
(``served_logs``):
``health`` is what wrk-monitor judged from the proxies' reports, ``-`` when unknown (a
container job, no report); ``-o json`` carries the API's ``model_health`` as it is."""

from __future__ import annotations

import json
import re

import pytest
import trio

from contracts.monitor import (
    LATENCY_BUCKETS,
    AgentMetrics,
    AgentMetricsReport,
    JobWindow,
    MetricsReport,
)
from tests.p2p.helpers import wait_until

from .support import ServedOrk

pytestmark = pytest.mark.slow

IMAGE = "docker://registry.local/jobs/app:1"
PROXY = b"\x05" * 32


def _report(served: ServedOrk, job: str, errors: int) -> None:
    service = served.monitor_service
    assert service is not None
    window = JobWindow(job_id=job, requests=100, errors=errors,
                       first_byte_ms=(100 - errors,) + (0,) * (LATENCY_BUCKETS - 1),
                       requests_total={"200": 100 - errors, "502": errors})
    service.health.accept(PROXY, MetricsReport(window_s=60, jobs=(window,)), service.clock())


async def _create(served: ServedOrk, *args: str) -> str:
    created = await served.cli("jobs", "create", "--image", IMAGE, *args)
    assert created.returncode == 0, created.stderr
    return created.stdout.decode().strip()


def _cells(line: str) -> list[str]:
    """A table line's cells: columns are two spaces or more apart (no cell here is empty
    or holds two spaces)."""
    return re.split(r" {2,}", line.strip())


def _row(table: str, job: str) -> list[str]:
    for line in table.splitlines():
        if job in line:
            return _cells(line)
    raise AssertionError(f"no row for {job} in:\n{table}")


def _header(table: str) -> list[str]:
    for line in table.splitlines():
        if " STATUS " in line:
            return [cell.lower() for cell in _cells(line)]
    raise AssertionError(table)


async def test_list_and_get_show_model_health_beside_status(served_logs: ServedOrk
                                                            ) -> None:
    served = served_logs
    with trio.fail_after(120):
        await served.login()
        llm = await _create(served, "--name", "llm", "--type", "inference", "--runtime",
                            "local", "--model", "demo")
        box = await _create(served, "--name", "box", "--type", "container")
        _report(served, llm, errors=10)
        assert served.monitor_service is not None
        served.monitor_service.agent_metrics.accept(b"\x06" * 32, AgentMetricsReport(agents=(
            AgentMetrics(job_id=box, replica=0, node_rank=0, service="agent-instance",
                         values={"heard_age_seconds": 300.0}),)),
            served.monitor_service.clock())
        # The jobs routes never wait for wrk-monitor's connection (no health, at once):
        # the table shows health only once app-node's client is connected.
        monitor = served.node.services.monitor
        assert monitor is not None
        await wait_until(lambda: monitor.connected, limit_s=30)

        listed = await served.cli("jobs", "list")
        assert listed.returncode == 0, listed.stderr
        table = listed.stdout.decode()
        header = _header(table)
        assert header[header.index("status") + 1] == "health"
        at = header.index("health")
        assert _row(table, llm)[at] == "Degraded" and _row(table, box)[at] == "-"
        # When each job's agents were last heard from: the silent box's five minutes.
        heard = header.index("heard")
        assert _row(table, box)[heard] == "5m ago" and _row(table, llm)[heard] == "-"

        shown = await served.cli("jobs", "get", llm)
        assert shown.returncode == 0, shown.stderr
        table = shown.stdout.decode()
        header = _header(table)
        assert _row(table, llm)[header.index("health")] == "Degraded"

        as_json = await served.cli("jobs", "list", "-o", "json")
        health = {job["id"]: job["model_health"] for job in json.loads(as_json.stdout)}
        assert health == {llm: "Degraded", box: None}
        _report(served, llm, errors=0)
        document = json.loads((await served.cli("jobs", "get", llm, "-o", "json")).stdout)
        assert document["model_health"] == "Healthy" and document["status"] != "Healthy"
