"""``cosmicac status`` (run in this process) against an in-process app-node whose prober
(every second here) watches a real in-process wrk-ork: the table and ``-o json``
while wrk-ork answers, wrk-ork shown down once it stops, and a member refused (a real
process: the command's smoke test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from cli.status import age, sparkline
from nodes.app_node.auth import hash_password
from nodes.app_node.health import HEALTH_FILE, HealthSettings
from nodes.ork.service import OrkService
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.swarm import Swarm, SwarmConfig
from tests.nodes.ork.world import World

from .support import CHEAP, PASSWORD, ServedOrk, cosmicac_process, one_error_line, serve

pytestmark = pytest.mark.slow


async def until_row(served: ServedOrk, service: str, up: bool, limit_s: float = 30) -> None:
    """Wait (real time, bounded) for the prober's newest row of ``service`` to be ``up``."""
    health = served.node.services.health
    assert health is not None
    with trio.fail_after(limit_s):
        while True:
            row = (await health.store.latest()).get(service)
            if row is not None and row.up is up:
                return
            await trio.sleep(0.1)


async def test_status_shows_the_control_plane_and_a_service_going_down(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    world = World(nodes=(8, 8))
    app_key = await trio.to_thread.run_sync(load_or_create_keypair, tmp_path / "app-node")
    service = OrkService(world.orch, allow=lambda key: key == app_key.public_key,
                         clock=lambda: world.now)
    ork_swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", port=0),
                      services=[service])
    ork_scope = trio.CancelScope()

    async def run_ork(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with ork_scope:
            await ork_swarm.run(task_status=task_status)

    with trio.fail_after(120):
        address = await nursery.start(run_ork)
        base = await serve(tmp_path, nursery, ork=ork_swarm.keypair.public_key,
                           ork_addresses=(address,),
                           health=HealthSettings(interval_s=1.0, timeout_s=1.0))
        served = ServedOrk(base.node, base.server, base.env, base.config, world, service)
        assert (tmp_path / "app-node" / HEALTH_FILE).exists()
        await until_row(served, "wrk-ork", up=True)
        await served.login()

        listed = await served.cli("status", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        health = json.loads(listed.stdout)
        by = {s["service"]: s for s in health["services"]}
        assert list(by) == ["wrk-ork", "database", "app-node", "email", "worker rack-1"]
        # The worker as wrk-ork hears it (the test's world has reported its nodes).
        worker = by["worker rack-1"]
        assert worker["state"] == "up" and worker["last"]["details"]["gpus"] == 16
        assert by["wrk-ork"]["state"] == "up" and by["wrk-ork"]["last"]["version"]
        assert by["wrk-ork"]["last"]["details"]["racks"] == 1
        assert by["database"]["last"]["details"]["admin"] is True
        assert by["app-node"]["last"]["details"]["ork"] is True
        assert by["email"]["last"]["details"] == {"backend": "outbox"}

        table = await served.cli("status")
        assert table.returncode == 0, table.stderr
        text = table.stdout.decode()
        assert "control plane:" in text and "wrk-ork" in text and "UPTIME 1H" in text

        ork_scope.cancel()  # wrk-ork stops
        await until_row(served, "wrk-ork", up=False)
        down = json.loads((await served.cli("status", "-o", "json")).stdout)
        assert down["status"] == "degraded"
        ork_now = next(s for s in down["services"] if s["service"] == "wrk-ork")
        assert ork_now["state"] == "down" and ork_now["last"]["reachable"] is False
        assert ork_now["last_hour"]["down"] >= 1 and ork_now["last_hour"]["up"] >= 1
        table = (await served.cli("status")).stdout.decode()
        assert "degraded" in table

        store = served.node.services.store

        def add_member() -> None:
            [(core, _)] = store.teams.of_user(store.users.by_email("ada@example.com").id)
            user = store.users.create(email="m@example.com", name="m",
                                      password_hash=hash_password(PASSWORD, params=CHEAP), now=0.0)
            store.teams.add_member(core.id, user.id, "member")

        await trio.to_thread.run_sync(add_member)
        env = await served.login_as("m@example.com", PASSWORD, served.config.parent / "m")
        member = await cosmicac_process("status", env=env)
        assert member.returncode == 1
        assert "platform operators" in one_error_line(member)
    nursery.cancel_scope.cancel()


def test_sparkline_and_age_render_compactly() -> None:
    assert sparkline([None, 0.0, 0.5, 1.0]) == "·▁▅█"
    assert sparkline([None, 0.0, 1.0], ascii_only=True) == "?_#"
    assert age(None, 100.0) == "-"
    assert (age(95.0, 100.0), age(0.0, 600.0), age(0.0, 7200.0)) == ("5s ago", "10m ago",
                                                                      "2h ago")
