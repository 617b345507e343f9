"""A real Prometheus (Debian's ``prometheus``) scrapes our daemons: ``cosmicac run
wrk-monitor`` as a process (its HTTP side's ``/metrics``, with the bearer token from
a ``credentials_file`` as deploy/prometheus.yml does it; a scrape without it is refused)
and proxy-inference on the
daemon kit's metrics endpoint; a PromQL query over Prometheus's HTTP API then returns
the proxy's request count, both targets are ``up``, and the proxy's log records shipped
to the monitor (telemetry on) are counted alike on both sides.

Prometheus runs with a configuration, a ``127.0.0.1`` port and a TSDB folder of the
test's own, so the service Debian's package may have started (``:9090``,
``/var/lib/prometheus``) is neither used nor touched. Without the binary the test
skips, unless ``CAC_PROMETHEUS_REQUIRED=1`` (``.ci/run`` sets it) or ``CI=true``:
then it fails.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from p2p.keys import load_or_create_keypair
from p2p.metrics import ProcessMetrics, serve_metrics
from tests.cli.helpers import process, read_ready
from tests.nodes.proxy_inference.harness import CHAT, client, proxy_world, two_agents
from tests.ports import free_port

pytestmark = pytest.mark.slow

#: Requests answered through the proxy, then counted by Prometheus.
REQUESTS = 7


def prometheus_required() -> bool:
    """True where this test must run rather than skip (CI sets it)."""
    return (os.environ.get("CAC_PROMETHEUS_REQUIRED") == "1"
            or os.environ.get("CI", "").lower() == "true")


@pytest.fixture
def prometheus_binary() -> str:
    found = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin")
    if found is None:
        message = "`prometheus` not found (apt-get install prometheus; .ci/run installs it)"
        if prometheus_required():
            pytest.fail(message + " and CAC_PROMETHEUS_REQUIRED=1 or CI=true")
        pytest.skip(message)
    return found


@dataclass
class Prometheus:
    """A running Prometheus and a client of its HTTP API."""

    url: str
    http: httpx.AsyncClient
    proc: trio.Process

    async def query(self, promql: str) -> list[dict]:
        """The instant vector ``promql`` evaluates to now (``data.result``)."""
        response = await self.http.get(f"{self.url}/api/v1/query", params={"query": promql})
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", body
        return body["data"]["result"]

    async def wait_value(self, promql: str, want: float, *, limit_s: float = 60.0) -> None:
        """Until ``promql`` is one sample equal to ``want`` (scrapes come every second)."""
        seen: list[dict] = []
        with trio.move_on_after(limit_s):
            while True:
                seen = await self.query(promql)
                if len(seen) == 1 and float(seen[0]["value"][1]) == want:
                    return
                await trio.sleep(0.25)
        raise AssertionError(f"{promql} never became {want} within {limit_s} s: {seen}")

    async def wait_scrape_error(self, job: str, text: str, *, limit_s: float = 60.0) -> None:
        """Until ``job``'s target's last scrape failed with an error saying ``text``."""
        errors: list[str] = []
        with trio.move_on_after(limit_s):
            while True:
                response = await self.http.get(f"{self.url}/api/v1/targets")
                errors = [t["lastError"] for t in response.json()["data"]["activeTargets"]
                          if t["labels"]["job"] == job]
                if errors and all(text in error for error in errors):
                    return
                await trio.sleep(0.25)
        raise AssertionError(f"{job}'s scrapes never failed with {text!r}: {errors}")


def write_config(folder: Path, targets: Mapping[str, tuple[str, int]],
                 credentials: Mapping[str, Path] | None = None) -> Path:
    """``folder/prometheus.yml``: one scrape job per target, every second (JSON is YAML);
    a job named in ``credentials`` sends that file's token as its bearer."""
    folder.mkdir()
    config = folder / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                   "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                            "static_configs": [{"targets": [f"{host}:{port}"]}],
                            **({"authorization": {"type": "Bearer", "credentials_file":
                                                  str((credentials or {})[job])}}
                               if job in (credentials or {}) else {})}
                           for job, (host, port) in targets.items()],
    }, indent=1))
    return config


@asynccontextmanager
async def running_prometheus(binary: str, folder: Path,
                             targets: Mapping[str, tuple[str, int]],
                             credentials: Mapping[str, Path] | None = None
                             ) -> AsyncIterator[Prometheus]:
    """Prometheus scraping ``targets`` (job name -> address; ``credentials``: job name ->
    bearer token file), its files in ``folder``; ready when yielded, stopped with
    SIGTERM (and waited for) on the way out."""
    config = write_config(folder, targets, credentials)
    port = free_port()
    log = (folder / "prometheus.log").open("wb")
    proc = await trio.lowlevel.open_process(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            with trio.fail_after(30):
                while True:
                    assert proc.returncode is None, (folder / "prometheus.log").read_text()
                    try:
                        if (await http.get(f"{url}/-/ready")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.1)
            yield Prometheus(url, http, proc)
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await proc.wait() == 0, (folder / "prometheus.log").read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            with trio.move_on_after(10):
                await proc.wait()
        log.close()


async def test_prometheus_scrapes_the_monitor_and_the_proxy_and_counts_its_requests(
        tmp_path, prometheus_binary, caplog):
    # The proxy ships its log records to the monitor (telemetry on, its key a pusher):
    # Prometheus then sees both ends of that flow agree.
    caplog.set_level(logging.INFO)  # the daemon kit's default: the proxy's lines are made
    caplog.set_level(logging.WARNING, logger="httpx")  # the test's client: not the proxy's
    proxy_key = load_or_create_keypair(tmp_path / "world" / "proxy")  # proxy_world's
    monitor_config = tmp_path / "monitor.json"
    (tmp_path / "monitor").mkdir()
    token_file = tmp_path / "monitor" / "http-token"  # as cosmicac up writes it
    token_file.write_text("p" * 40 + "\n")
    # The scraped ports are chosen first, so that Prometheus starts with everything
    # else: it hands its targets to its scrapers on its discovery's first 5 s tick.
    monitor_http = ("127.0.0.1", free_port())
    proxy_metrics = ("127.0.0.1", free_port())
    monitor_config.write_text(json.dumps({
        "storage": str(tmp_path / "monitor"), "host": "127.0.0.1", "port": 0,
        "http": {"host": monitor_http[0], "port": monitor_http[1],
                 "token_file": str(token_file)},
        "pushers": [proxy_key.hex], "proxies": [proxy_key.hex]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    with trio.fail_after(150):
        async with process("run", "wrk-monitor", "--config", str(monitor_config),
                           "--config-dir", str(tmp_path / "none"),
                           stdout=subprocess.PIPE, env=env) as monitor, \
                running_prometheus(prometheus_binary, tmp_path / "prometheus", {
                    "wrk-monitor": monitor_http, "wrk-monitor-no-token": monitor_http,
                    "proxy-inference": proxy_metrics},
                    credentials={"wrk-monitor": token_file}) as prometheus, \
                proxy_world(tmp_path / "world") as world:
            ready = await read_ready(monitor.stdout, "wrk-monitor")
            assert ready.fields["loki"] == "off"
            assert ready.address("http") == monitor_http
            # The proxy in-process, its registries on an endpoint as the daemon kit serves it.
            metrics = ProcessMetrics()
            assert await world.nursery.start(functools.partial(
                serve_metrics, metrics.registry, port=proxy_metrics[1])) == proxy_metrics
            _, secret = await world.add_key()
            await world.start_proxy(metrics=metrics, telemetry={
                "monitor": ready.key, "monitor_addresses": [ready.fields["swarm"]]})
            await world.wait_replicated()
            await two_agents(world)
            async with client(world, secret) as http:
                for _ in range(REQUESTS):
                    response = await http.post("/chat/completions", json=CHAT)
                    assert response.status_code == 200, response.text
            await prometheus.wait_value(
                'sum(proxy_requests_total{job="proxy-inference",code="200"})', REQUESTS)
            await prometheus.wait_value('up{job="wrk-monitor"}', 1)
            # wrk-monitor's series name every team's jobs: no token, no scrape (refused
            # by wrk-monitor, not a scrape from before it listened: Prometheus starts first).
            await prometheus.wait_scrape_error("wrk-monitor-no-token", "401")
            await prometheus.wait_value('up{job="wrk-monitor-no-token"}', 0)
            await prometheus.wait_value('up{job="proxy-inference"}', 1)
            by_code = await prometheus.query('proxy_requests_total{job="proxy-inference"}')
            assert [(s["metric"]["model"], s["metric"]["code"]) for s in by_code] == [
                ("chat", "200")]
            # The proxy's shipped records arrived: what it counts as sent is what
            # the monitor counts as received (once the proxy's start-up lines settled).
            await prometheus.wait_value(
                'telemetry_records_sent_total{job="proxy-inference"} > bool 0', 1)
            await prometheus.wait_value(
                'monitor_records_received_total{job="wrk-monitor"} - ignoring(job, instance)'
                ' telemetry_records_sent_total{job="proxy-inference"}', 0)
            monitor.send_signal(signal.SIGINT)
            assert await monitor.wait() == 0
