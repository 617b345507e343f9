"""`cosmicac up` as a real process: the whole deployment starts, answers (the local CLI,
run in this process, is logged in to it), and stops clean."""

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
import trio

from cli.up import DEFAULT_BASE_PORT, MARKER, Ports

from .helpers import UP, free_base_port, pids_using, read_until, running_up
from .support import cosmicac


def test_ports_shift_together_and_keep_5173_at_the_default():
    default = Ports.from_base(49737)
    assert (default.relay, default.dht, default.app_http, default.proxy_http,
            default.entry) == (49737, 49738, 49751, 49750, 5173)
    assert Ports.from_base(30000).entry == 30020


def test_the_default_ports_are_the_daemons_own_settings():
    from nodes.app_node.settings import AppNodeSettings
    from nodes.monitor.settings import MonitorSettings
    from relay import DEFAULT_PORT

    default = Ports.from_base(DEFAULT_BASE_PORT)
    assert DEFAULT_BASE_PORT == DEFAULT_PORT == default.relay
    assert (default.worker, default.ork, default.proxy, default.app, default.monitor,
            default.monitor_http) == (49739, 49740, 49741, 49742, 49743, 49752)
    assert default.app == AppNodeSettings.model_fields["port"].default
    assert default.monitor_http == MonitorSettings.model_fields["http"].default.port
    shifted = Ports.from_base(30000)
    assert (shifted.dht, shifted.app, shifted.app_http) == (30001, 30005, 30014)


def test_reset_refuses_a_folder_up_did_not_make(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    (tmp_path / "precious").write_text("keep me")
    result = CliRunner().invoke(app, ["up", "--storage", str(tmp_path), "--reset"])
    assert result.exit_code == 2
    assert MARKER in result.output
    assert (tmp_path / "precious").exists()


@pytest.mark.slow
async def test_up_runs_everything_serves_the_api_and_inference_and_stops_clean(tmp_path):
    storage = tmp_path / "up"
    base = free_base_port()
    async with running_up(storage, base) as process:
        with trio.fail_after(120):
            match = await read_until(process.stdout, UP)
        url = match[1]
        assert url == f"http://127.0.0.1:{base + 20}"
        credentials = storage / "credentials.json"
        assert credentials.stat().st_mode & 0o777 == 0o600
        creds = json.loads(credentials.read_text())
        assert creds["url"] == url and creds["email"] == "admin@cosmicac.local"

        def get(path: str, **headers: str) -> httpx.Response:
            return httpx.get(url + path, headers=headers, timeout=30)

        spec = await trio.to_thread.run_sync(get, "/api/openapi.json")
        assert spec.status_code == 200, spec.text
        models = await trio.to_thread.run_sync(
            lambda: get("/inference/v1/models", authorization=f"Bearer {creds['api_key']}"))
        assert models.status_code == 200, models.text
        # wrk-monitor behind the door: its token (0600, made by up) or nothing.
        token_file = storage / "wrk-monitor" / "http-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        for path in ("/monitor/metrics", "/monitor/jobs/any-job/logs"):
            refused = await trio.to_thread.run_sync(get, path)
            assert refused.status_code == 401, refused.text
        token = token_file.read_text().strip()
        metrics = await trio.to_thread.run_sync(
            lambda: get("/monitor/metrics", authorization=f"Bearer {token}"))
        assert metrics.status_code == 200 and "monitor" in metrics.text, metrics.text
        assert pids_using(storage)  # the children name their configs under storage
        # The local CLI is logged in at once (its config folder is this test's).
        who = await cosmicac("whoami", "-o", "json")
        assert who.returncode == 0, who.stderr
        assert json.loads(who.stdout)["user"]["email"] == creds["email"]
        session = json.loads((Path(os.environ["COSMICAC_CONFIG_DIR"]) / "session.json")
                             .read_text())
        assert session["server"] == url
        # up's admin is an operator: creates teams and sets their GPU quotas
        for args in (["teams", "create", "research"],
                     ["teams", "quota", "set", "research", "--gpus", "4"]):
            done = await cosmicac(*args)
            assert done.returncode == 0, (args, done.stderr)

        process.send_signal(signal.SIGINT)
        with trio.fail_after(15):
            assert await process.wait() == 0
        assert pids_using(storage) == []


@pytest.mark.slow
async def test_stopping_up_also_stops_the_local_workers_agent_processes(tmp_path):
    """Agents live in sessions of their own (they outlive a worker restart): up
    must stop them itself. A job is created through wrk-ork with an app-node key
    the test adds (the environment's list beats the config file's)."""
    from contracts.ork import CREATE_JOB, CreateJob
    from nodes.kit.ork_client import OrkClient
    from p2p.keys import KeyPair, load_or_create_keypair
    from p2p.swarm import Swarm, SwarmConfig

    from ..nodes.ork.world import container
    from ..p2p.helpers import wait_until

    storage = tmp_path / "up"
    base = free_base_port()
    me = KeyPair.generate()
    app_nodes = [load_or_create_keypair(storage / "app-node").hex, me.hex]
    async with running_up(storage, base,
                          dict(os.environ, COSMICAC_ORK__APP_NODES=",".join(app_nodes))) as process:
        with trio.fail_after(120):
            await read_until(process.stdout, UP)
            ork = load_or_create_keypair(storage / "wrk-ork").public_key
            async with trio.open_nursery() as nursery:
                swarm = Swarm(me, config=SwarmConfig(host="127.0.0.1", port=0))
                await nursery.start(swarm.run)
                client = OrkClient(swarm, ork, addresses=[("127.0.0.1", base + 3)])
                await nursery.start(client.run)
                job = (await client.call(CREATE_JOB, CreateJob(spec=container(gpus=1)))).job
                nursery.cancel_scope.cancel()
            vmis = storage / "wrk-server-k8s-nvidia" / "vmis"
            await wait_until(lambda: list(vmis.glob("*/process.json")), limit_s=60,
                             step_s=0.2)
            # wrk-ork and the worker ship the job's System steps to wrk-monitor.
            logs_url = f"http://127.0.0.1:{base + 15}/jobs/{job.id}/logs"
            token = (storage / "wrk-monitor" / "http-token").read_text().strip()

            def services() -> set[str]:
                body = httpx.get(logs_url, timeout=10,
                                 headers={"Authorization": f"Bearer {token}"}).json()
                return {r["service"] for r in body["records"] if r["source"] == "System"}

            seen: set[str] = set()

            async def shipped() -> bool:
                seen.update(await trio.to_thread.run_sync(services))
                return {"wrk-ork", "wrk-server-k8s-nvidia"} <= seen

            for _ in range(300):
                if await shipped():
                    break
                await trio.sleep(0.2)
            assert {"wrk-ork", "wrk-server-k8s-nvidia"} <= seen, seen
        agents = [json.loads(path.read_text())["pid"] for path in vmis.glob("*/process.json")]
        assert all(pid in pids_using(storage) for pid in agents)

        process.send_signal(signal.SIGINT)
        with trio.fail_after(15):
            assert await process.wait() == 0
            said = b""
            while chunk := await process.stderr.receive_some():
                said += chunk
        assert f"stopped {len(agents)} agent processes".encode() in said  # by up, not the worker
        assert pids_using(storage) == []
