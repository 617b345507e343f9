"""A container job's agent shows up in wrk-monitor's ``/metrics``: agent → worker
(heartbeat figures) → wrk-monitor (``metrics.agents``) → Prometheus text, the daemons
and the agent in the test's trio run (tests/nodes/cluster.py), wrk-monitor's HTTP side
on a real socket. Real time, conditions polled, every wait bounded."""

from __future__ import annotations

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from ..cluster import MONITOR_TOKEN, cluster, container, status

pytestmark = pytest.mark.slow


async def scrape(port: int) -> dict:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
        response = await http.get(f"http://127.0.0.1:{port}/metrics",
                                  headers={"Authorization": f"Bearer {MONITOR_TOKEN}"})
    response.raise_for_status()
    return {f.name: f for f in text_string_to_metric_families(response.text)}


async def test_a_container_agents_figures_reach_wrk_monitors_metrics(tmp_path):
    async with cluster(tmp_path, monitor=True) as path:
        job = await path.create(container("metrics-box"))
        await path.wait_job(job.id, status("active"), limit_s=30)
        families: dict = {}
        with trio.move_on_after(30):
            while True:
                families = await scrape(path.monitor_http_port)
                shells = families.get("cosmicac_agent_shell_sessions_open")
                if shells is not None and shells.samples:
                    break
                await trio.sleep(0.5)
        assert "cosmicac_agent_shell_sessions_open" in families, sorted(families)
        [sample] = families["cosmicac_agent_shell_sessions_open"].samples
        assert sample.labels == {"job_id": job.id, "replica": "0", "node_rank": "0",
                                 "service": "agent-instance"} and sample.value == 0
        rss = families["cosmicac_agent_process_resident_memory_bytes"].samples[0]
        assert rss.labels["job_id"] == job.id and rss.value > 0
        assert families["cosmicac_agent_process_cpu_seconds"].type == "counter"
        assert families["cosmicac_monitor_agent_metrics_senders"].samples[0].value == 1
