"""wrk-ork keeps each team's newest shell keys and sends a changed set to the racks of
the team's container jobs: stale and repeated versions change
nothing, a new job's rack gets the set before its create, and the set survives a
restart of wrk-ork. ``teams.set_shell_keys`` is app-node's alone."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from contracts.operations import CreateReplica, SetShellKeys
from contracts.ork import SET_SHELL_KEYS
from contracts.shell_access import ShellKeys
from p2p.rpc import RpcError

from .support import STRANGER, Harness, connect
from .world import RACK, World, container, inference

A, B, C = "aa" * 32, "bb" * 32, "cc" * 32


def keys(version: int, *members: str, team: str = "team-a") -> ShellKeys:
    return ShellKeys(team=team, keys=members, version=version)


def shell_ops(world: World) -> list[tuple[str, ShellKeys]]:
    return [(o.rack, o.op.keys) for o in world.orch.outbox() if isinstance(o.op, SetShellKeys)]


def publish_all(world: World) -> None:
    world.orch.mark_published([o.op_id for o in world.orch.outbox()])


def test_a_changed_set_goes_to_the_racks_of_the_teams_container_jobs_only():
    world = World(nodes=(8,))
    world.create(container(team="team-a"))
    world.create(container(team="team-b"))
    world.create(inference(team="team-a", replicas=1))
    publish_all(world)
    assert world.orch.set_shell_keys(keys(5, B, A)) == (5, True)
    assert shell_ops(world) == [(RACK, keys(5, A, B))]  # sorted, one rack, team-a only
    publish_all(world)
    # The same keys at a newer version: kept, nothing sent (after an app-node restart).
    assert world.orch.set_shell_keys(keys(6, A, B)) == (6, True)
    assert shell_ops(world) == []
    # Stale or repeated: refused, nothing sent, the newer set stays.
    assert world.orch.set_shell_keys(keys(4, C)) == (6, False)
    assert world.orch.set_shell_keys(keys(6, C)) == (6, False)
    assert shell_ops(world) == [] and world.orch.shell_keys("team-a") == keys(6, A, B)


def test_a_new_jobs_rack_gets_the_set_before_the_create_even_when_placed_later():
    world = World(nodes=(4,))
    world.orch.set_shell_keys(keys(3, A))
    assert shell_ops(world) == []  # no job yet: nowhere to send it
    world.create(container(gpus=4))
    kinds = [type(o.op) for o in world.orch.outbox()]
    assert kinds == [SetShellKeys, CreateReplica]
    publish_all(world)
    world.create(container(gpus=4))  # Pending: the rack is full
    assert world.orch.outbox() == []
    world.orch.set_shell_keys(keys(4, A, B))
    first = world.orch.list_jobs()[0].id
    world.orch.delete_job(first, world.now)
    publish_all(world)  # the first job's rack got v4 with its delete
    world.say(0, "deleted", job=first)  # the GPUs free: the Pending job is placed
    world.advance(1)
    ops = [o.op for o in world.orch.outbox()]
    assert [type(op) for op in ops] == [SetShellKeys, CreateReplica]
    assert ops[0].keys == keys(4, A, B)


def test_the_newest_set_survives_a_restart_of_wrk_ork(tmp_path):
    world = World(tmp_path / "ork.sqlite")
    world.create(container())
    world.orch.set_shell_keys(keys(9, A, B))
    world.reopen()
    assert world.orch.shell_keys("team-a") == keys(9, A, B)
    assert world.orch.set_shell_keys(keys(8, C)) == (9, False)


@given(st.lists(st.tuples(st.integers(1, 20), st.sets(st.sampled_from([A, B, C]))),
                min_size=1, max_size=12))
def test_whatever_the_order_the_highest_version_wins_and_only_changes_are_sent(updates):
    world = World()
    world.create(container())
    publish_all(world)
    held: ShellKeys | None = None
    sent = 0
    for version, members in updates:
        update = keys(version, *sorted(members))
        version_now, applied = world.orch.set_shell_keys(update)
        assert applied == (held is None or version > held.version)
        if applied:
            sent += held is None or held.keys != update.keys
            held = update
        assert version_now == held.version
    assert world.orch.shell_keys("team-a") == held
    assert len(shell_ops(world)) == sent


async def test_only_app_node_may_set_shell_keys(nursery, autojump_clock):
    harness = Harness()
    harness.world.create(container())
    with trio.fail_after(10):
        async with connect(nursery, harness, key=STRANGER) as client:
            with pytest.raises(RpcError) as caught:
                await client.call(SET_SHELL_KEYS, keys(1, A))
            assert caught.value.code == "FORBIDDEN"
        assert harness.world.orch.shell_keys("team-a") is None
        async with connect(nursery, harness) as client:
            ack = await client.call(SET_SHELL_KEYS, keys(1, A))
            assert (ack.version, ack.applied) == (1, True)
            assert harness.changes == 1  # the daemon is told to publish
