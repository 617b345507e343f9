"""``cosmicac racks`` and ``cosmicac nodes`` (run in this process) against an in-process
app-node and wrk-ork: an operator lists, adds and removes racks, lists nodes,
reserves them for a team (the rack and the team by name) and releases them; a
member gets the API's forbidden message and exit 1 (a real process: the
``racks`` group's smoke test)."""

from __future__ import annotations

import json

import pytest
import trio

from nodes.app_node.auth import hash_password
from tests.nodes.ork.world import RACK

from .support import CHEAP, PASSWORD, ServedOrk, cosmicac_process, one_error_line

pytestmark = pytest.mark.slow

NEW_RACK = "cd" * 32


async def test_operator_racks_and_nodes_member_forbidden(served_ork: ServedOrk) -> None:
    served = served_ork
    with trio.fail_after(120):
        await served.login()
        listed = await served.cli("racks", "list", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        [rack] = json.loads(listed.stdout)
        assert rack["key"] == RACK and rack["name"] == "rack-1" and rack["gpus"] == 16

        added = await served.cli("racks", "add", NEW_RACK, "--location", "eu-1", "--name",
                                 "rack-2", "-o", "json")
        assert added.returncode == 0, added.stderr
        new = json.loads(added.stdout)
        assert (new["key"], new["location"], new["name"]) == (NEW_RACK, "eu-1", "rack-2")
        table = await served.cli("racks", "list")
        assert table.returncode == 0 and NEW_RACK in table.stdout.decode()
        bad = await served.cli("racks", "add", "not-a-key")
        assert bad.returncode == 2
        one_error_line(bad)
        removed = await served.cli("racks", "remove", "rack-2")
        assert removed.returncode == 0, removed.stderr
        listed = await served.cli("racks", "list", "-o", "json")
        assert [r["key"] for r in json.loads(listed.stdout)] == [RACK]

        reserved = await served.cli("nodes", "reserve", "--rack", "rack-1", "--team", "core",
                                    "n0")
        assert reserved.returncode == 0, reserved.stderr
        # the nodes group's smoke test: a real process
        nodes = await served.cli("nodes", "list", "-o", "json", process=True)
        assert nodes.returncode == 0, nodes.stderr
        by_name = {n["name"]: n for n in json.loads(nodes.stdout)}
        store = served.node.services.store
        [(core, _)] = await trio.to_thread.run_sync(
            lambda: store.teams.of_user(store.users.by_email("ada@example.com").id))
        assert by_name["n0"]["reserved_for"] == core.id and by_name["n1"]["reserved_for"] is None
        released = await served.cli("nodes", "release", "--rack", RACK, "n0")
        assert released.returncode == 0, released.stderr
        table = await served.cli("nodes", "list")
        assert table.returncode == 0 and core.id not in table.stdout.decode()

        def add_member() -> None:
            user = store.users.create(email="m@example.com", name="m",
                                      password_hash=hash_password(PASSWORD, params=CHEAP), now=0.0)
            store.teams.add_member(core.id, user.id, "member")

        await trio.to_thread.run_sync(add_member)
        env = await served.login_as("m@example.com", PASSWORD, served.config.parent / "m")
        member = await cosmicac_process("racks", "list", env=env)
        assert member.returncode == 1
        assert "platform operators" in one_error_line(member)
