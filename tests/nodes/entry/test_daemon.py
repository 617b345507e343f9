"""``cosmicac run entry`` as a real process: the line it prints, proxying, metrics, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import httpx
import pytest
import trio

from tests.cli.helpers import process, read_ready
from tests.ports import free_port

from .upstream import Upstream, serving

pytestmark = pytest.mark.slow



def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}


async def test_the_daemon_proxies_counts_and_stops_on_sigterm():
    api, inference = Upstream("api"), Upstream("inference")
    metrics_port = free_port()
    with trio.fail_after(60):
        async with serving(api, inference):
            env = clean_env()
            env.update({"COSMICAC_ENTRY__PORT": "0", "COSMICAC_ENTRY__API_URL": api.url,
                        "COSMICAC_ENTRY__INFERENCE_URL": inference.url + "/",
                        "COSMICAC_ENTRY__METRICS__PORT": str(metrics_port),
                        "COSMICAC_ENTRY__LOG_FORMAT": "json"})
            async with process("run", "entry", stdout=subprocess.PIPE, env=env) as proc:
                ready = await read_ready(proc.stdout, "entry")
                assert (ready.fields["api"], ready.fields["inference"],
                        ready.fields["monitor"]) == (api.url, inference.url, "off")
                url = ready.url()
                async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=10) as http:
                    echo = (await http.get("/api/v1/echo")).json()
                    assert (echo["upstream"], echo["raw_path"]) == ("api", "/api/v1/echo")
                    echo = (await http.get("/inference/v1/echo")).json()
                    assert (echo["upstream"], echo["raw_path"]) == ("inference", "/v1/echo")
                    assert (await http.get("/")).status_code == 200
                    landing = 'entry_requests_total{code="200",service="landing"} 1.0'
                    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
                    scraped = ""
                    with trio.fail_after(10):  # counted just after the last byte went out
                        for _ in range(500):
                            scraped = (await http.get(metrics_url)).text
                            if landing in scraped:
                                break
                            await trio.sleep(0.02)
                assert 'entry_requests_total{code="200",service="api"} 1.0' in scraped
                assert 'entry_requests_total{code="200",service="landing"} 1.0' in scraped
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
                stderr = b""
                while chunk := await proc.stderr.receive_some(65536):
                    stderr += chunk
    assert b"entry.stopped" in stderr
    assert b"entry.request" in stderr  # one line per request


async def test_a_bad_upstream_url_is_named_and_exits_2():
    env = clean_env()
    env.update({"COSMICAC_ENTRY__PORT": "0", "COSMICAC_ENTRY__API_URL": "ftp://example"})
    with trio.fail_after(30):
        async with process("run", "entry", env=env) as proc:
            assert await proc.wait() == 2
            stderr = await proc.stderr.receive_some(65536)
    assert b"api_url" in stderr and b"COSMICAC_ENTRY__API_URL" in stderr


async def test_a_busy_port_is_one_line_and_exit_1():
    env = clean_env()
    with socket.socket() as busy, trio.fail_after(30):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env["COSMICAC_ENTRY__PORT"] = str(port)
        async with process("run", "entry", env=env) as proc:
            assert await proc.wait() == 1
            stderr = await proc.stderr.receive_some(65536)
    assert stderr.decode().strip().splitlines()[-1] == (
        f"error: cannot serve the entry point on 127.0.0.1:{port}: Address already in use")
