"""deploy/Caddyfile routes as the entry point does: a real Caddy in front of the tiny upstreams.

Skipped where there is no ``caddy`` binary (Debian: ``apt-get install caddy``),
except in CI (``CI`` set), where ``.ci/run`` installs it and a missing one fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from tests.ports import free_port

from .upstream import Upstream, serving

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("caddy") is None and not os.environ.get("CI"),
                                 reason="needs caddy (apt-get install caddy)")]

CADDYFILE = Path(__file__).resolve().parents[3] / "deploy" / "Caddyfile"


def caddy_env(tmp_path: Path, port: int, **upstreams: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    env.update({"COSMICAC_SITE": f"http://127.0.0.1:{port}", "COSMICAC_BIND": "127.0.0.1",
                "COSMICAC_CADDY_ADMIN": "off", "XDG_CONFIG_HOME": str(tmp_path / "config"),
                "XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)})
    env.update(upstreams)
    return env


def test_the_caddyfile_is_valid(tmp_path):
    result = subprocess.run(
        ["caddy", "validate", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
        env=caddy_env(tmp_path, 5173), capture_output=True, text=True, timeout=60,
        check=False)
    assert result.returncode == 0, result.stderr


async def test_caddy_routes_streams_and_fails_as_the_entry_point_does(tmp_path):
    api, inference, ui = Upstream("api"), Upstream("inference"), Upstream("ui")
    port = free_port()
    with trio.fail_after(60):
        async with serving(api, inference, ui):
            env = caddy_env(tmp_path, port,
                            COSMICAC_APP_NODE=api.url.removeprefix("http://"),
                            COSMICAC_PROXY_INFERENCE=inference.url.removeprefix("http://"),
                            COSMICAC_UI=ui.url.removeprefix("http://"),
                            COSMICAC_WRK_MONITOR=f"127.0.0.1:{free_port()}")
            proc = await trio.lowlevel.open_process(
                ["caddy", "run", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                             trust_env=False, timeout=10) as client:
                    for _ in range(500):  # until Caddy listens (bounded: 10 s)
                        try:
                            await client.get("/")
                            break
                        except httpx.ConnectError:
                            await trio.sleep(0.02)
                    await check_routes(client, inference)
            finally:
                proc.kill()
                await proc.wait()


async def check_routes(client: httpx.AsyncClient, inference: Upstream) -> None:
    echo = (await client.get("/api/v1/jobs/echo", params={"q": "1"},
                             headers={"X-Forwarded-For": "6.6.6.6"})).json()
    assert (echo["upstream"], echo["raw_path"], echo["query"]) == (
        "api", "/api/v1/jobs/echo", "q=1")
    # a client's own X-Forwarded-For never reaches app-node (its rate limits trust Caddy)
    assert [v for k, v in echo["headers"] if k == "x-forwarded-for"] == ["127.0.0.1"]
    echo = (await client.post("/inference/v1/chat/echo", json={})).json()
    assert (echo["upstream"], echo["raw_path"]) == ("inference", "/v1/chat/echo")
    assert [v for k, v in echo["headers"] if k == "x-forwarded-prefix"] == ["/inference"]
    assert [v for k, v in echo["headers"] if k == "x-forwarded-for"] == ["127.0.0.1"]

    # Every other path goes to the web UI as it is, with the address the browser
    # used (the UI's same-origin check) and its scheme (its cookie's Secure flag).
    echo = (await client.post("/apis/echo", json={}, params={"q": "2"})).json()
    assert (echo["upstream"], echo["raw_path"], echo["query"]) == ("ui", "/apis/echo", "q=2")
    headers = dict(echo["headers"])
    assert headers["x-forwarded-host"] == f"127.0.0.1:{client.base_url.port}"
    assert headers["x-forwarded-proto"] == "http"
    assert headers["x-forwarded-for"] == "127.0.0.1"

    seen: list[tuple[str, float]] = []
    async with client.stream("GET", "/inference/v1/events") as response:
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen.append((line[6:], trio.current_time()))
                inference.first_seen.set()
    assert [data for data, _ in seen] == ["0", "1", "2", "3", "4"]
    assert seen[0][1] < inference.sent_at[-1]  # flush_interval -1: no buffering

    down = await client.get("/monitor/logs")
    assert down.status_code == 502
    assert down.json()["error"]["code"] == "UPSTREAM_UNREACHABLE"
