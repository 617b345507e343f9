"""``cosmicac run proxy-inference`` as a real process: settings (PROXY_AUTOBASE_KEY
included), the line it prints, HTTP and metrics served, and usage counted before SIGTERM
written on the way out."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import httpx
import pytest
import trio

from crdt import Database, FsyncPolicy
from p2p.keys import KeyPair
from p2p.swarm import Swarm
from tests.cli.helpers import process, read_ready
from tests.p2p.helpers import wait_until
from tests.ports import free_port

from .harness import inference_spec, proxy_world
from .ork_service import Ork
from .tiny_agent import TinyAgent

pytestmark = pytest.mark.slow



async def test_a_missing_setting_is_named_and_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSMICAC_", "PROXY_"))}
    env["COSMICAC_PROXY__STORAGE"] = str(tmp_path / "p")
    env["COSMICAC_PROXY__HTTP__PORT"] = "0"
    env["COSMICAC_PROXY__PORT"] = "0"
    with trio.fail_after(30):
        async with process("run", "proxy-inference", env=env) as proc:
            stderr = await proc.stderr.receive_some()
            assert await proc.wait() == 2
    assert b"COSMICAC_PROXY__ORK" in stderr


async def test_a_busy_http_port_is_one_line_and_exit_1(tmp_path):
    import socket
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSMICAC_", "PROXY_"))}
    env.update({"COSMICAC_PROXY__STORAGE": str(tmp_path / "p"), "COSMICAC_PROXY__PORT": "0",
                "COSMICAC_PROXY__HOST": "127.0.0.1", "COSMICAC_PROXY__ORK": "ab" * 32,
                "PROXY_AUTOBASE_KEY": "cd" * 32})
    with socket.socket() as busy, trio.fail_after(30):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env["COSMICAC_PROXY__HTTP__PORT"] = str(busy.getsockname()[1])
        async with process("run", "proxy-inference", env=env) as proc:
            assert await proc.wait() == 1
            stderr = await proc.stderr.receive_some(65536)
    assert stderr.decode().strip().splitlines()[-1] == (
        f"error: cannot serve HTTP on 127.0.0.1:{env['COSMICAC_PROXY__HTTP__PORT']}: "
        "Address already in use")


async def test_the_daemon_serves_and_writes_its_usage_when_stopped(tmp_path):
    with trio.fail_after(90):
        async with proxy_world(tmp_path) as world:
            ork = Ork({world.proxy_key.public_key})
            ork_swarm = Swarm(ork.keypair, config=world.swarm_config(), services=[ork.service])
            ork_address = await world.nursery.start(ork_swarm.run)
            key_id, secret = await world.add_key()
            job = ork.world.create(inference_spec("chat"))
            agent_key, agent = KeyPair.generate(), TinyAgent("a0")
            await world.start_agent(agent_key, [agent.service()], job.id)
            ork.report(job.id, 0, "active", (agent_key.public_key,))
            metrics_port = free_port()
            config = tmp_path / "proxy.json"
            config.write_text(json.dumps({
                "storage": str(tmp_path / "proxy"), "host": "127.0.0.1", "port": 0,
                "bootstrap": [f"{h}:{p}" for h, p in world.bootstrap],
                "ork": ork.keypair.hex, "ork_addresses": [f"{ork_address[0]}:{ork_address[1]}"],
                "http": {"host": "127.0.0.1", "port": 0}, "fsync": False,
                "usage": {"flush_interval_s": 3600, "flush_ops": 100000},
                "metrics": {"port": metrics_port}, "log_format": "json"}))
            env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
            env["PROXY_AUTOBASE_KEY"] = world.admin.db.bootstrap.hex()
            async with process("run", "proxy-inference", "--config", str(config),
                               stdout=subprocess.PIPE, env=env) as proc:
                ready = await read_ready(proc.stdout, "proxy-inference")
                assert ready.key == world.proxy_key.hex
                url = ready.url("http", "/v1")
                async with httpx.AsyncClient(base_url=url, timeout=20, headers={
                        "Authorization": f"Bearer {secret}"}) as http:

                    async def answered() -> bool:
                        response = await http.post("/chat/completions", json={
                            "model": "chat", "messages": []})
                        return response.status_code == 200

                    with trio.fail_after(30):
                        while not await answered():  # noqa: ASYNC110 - key, job, agent all up
                            await trio.sleep(0.1)
                    for _ in range(4):
                        assert await answered()
                    metrics = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
                assert 'proxy_requests_total{code="200",model="chat"}' in metrics
                assert 'proxy_replicas{model="chat"} 1.0' in metrics
                assert "crdt_entries" in metrics and "swarm_connections" in metrics
                await wait_until(lambda: world.admin.db.writers()
                                 and any(w.key == world.proxy_key.public_key and w.admitted
                                         for w in world.admin.db.writers()), limit_s=20)
                proc.send_signal(signal.SIGTERM)
                assert await proc.wait() == 0
    db = await Database.open(tmp_path / "proxy", world.proxy_key, fsync=FsyncPolicy.NEVER)
    try:
        rows = await db.usage(key_id)
        assert [(r.model, r.requests, r.total) for r in rows] == [("chat", 5, 25)]
    finally:
        await db.aclose()
