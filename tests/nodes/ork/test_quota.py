"""GPU quotas in wrk-ork: what a job counts in each status,
the refusal naming the quota, the use and the request, per-user quotas by owner,
the owner kept across a restart and a migration, two racing creates over RPC,
and a hypothesis run: whatever happens, a team never holds more than its quota."""

from __future__ import annotations

import sqlite3

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.ork import CREATE_JOB, CreateJob, GpuQuota
from nodes.ork.errors import OrkError, QuotaExceeded
from nodes.ork.quota import gpus_counted
from nodes.ork.service import OrkService
from nodes.ork.store import SCHEMA_VERSION, Store
from p2p.rpc import RpcError
from tests.examples import examples

from .support import APP_NODE, Harness, connect
from .world import SETUPS, World, container, inference

#: GPUs each setup's last job counts: its replicas (1 GPU each) that hold GPUs or
#: may take them; "pending" is a 1-GPU job waiting behind an 8-GPU one.
COUNTED = {
    "starting1": 1, "starting2": 2, "active1": 1, "active2": 2, "degraded": 2,
    "restarting1": 1, "restarting2": 2, "worker_restarting": 1,
    # a failed replica keeps its GPUs (or a restart takes them back): it counts
    "failed1": 1, "failed2": 2, "unknown1": 1, "unknown_starting": 1,
    "unknown_degraded": 2, "unknown_failed": 1, "unknown_restarting": 1,
    # waits for GPUs: takes them as soon as they free
    "pending": 1,
    # can never fit: holds nothing and never will
    "unplaceable": 0,
    # its GPUs stay claimed until the worker says the replica is deleted
    "deleting": 1,
}


def _claimed(world: World) -> int:
    return sum(n.gpus - n.free for n in world.orch.nodes())


@pytest.mark.parametrize("setup", sorted(COUNTED))
def test_what_each_status_counts(setup: str) -> None:
    world = World(nodes=(8, 8))
    for step in SETUPS[setup]:
        world.do(step)
    job = world.orch.book.jobs[world.job_id]
    assert gpus_counted(job) == COUNTED[setup]
    # never less than what the team's jobs really hold
    assert sum(gpus_counted(j) for j in world.orch.book.jobs.values()) >= _claimed(world)


def test_a_job_gone_after_its_delete_counts_nothing() -> None:
    world = World()
    world.do("one")
    world.do("delete")
    world.say(0, "deleted")
    world.create(container(gpus=8))  # the whole rack again, quota 8
    with pytest.raises(QuotaExceeded):
        world.orch.create_job(container(), world.now, team_gpus=8)


def test_over_the_team_quota_is_refused_and_nothing_is_created() -> None:
    world = World(nodes=(8, 8))
    world.orch.create_job(container(gpus=2), world.now, team_gpus=3)
    before = world.orch.list_jobs()
    world.orch.drain_events()
    with pytest.raises(QuotaExceeded) as info:
        world.orch.create_job(inference(gpus=1, replicas=2), world.now, team_gpus=3)
    exc = info.value
    assert exc.code == "QUOTA_EXCEEDED"
    assert exc.data == {"scope": "team", "quota": 3, "in_use": 2, "requested": 2}
    assert "quota is 3" in exc.message and "hold or may hold 2" in exc.message
    assert "asks for 2" in exc.message
    assert world.orch.list_jobs() == before and world.orch.drain_events() == []
    # exactly at the quota passes; other teams are not counted
    world.orch.create_job(container(gpus=1), world.now, team_gpus=3)
    world.orch.create_job(container(gpus=4, team="team-b"), world.now, team_gpus=4)
    # a job alone bigger than the quota
    with pytest.raises(QuotaExceeded) as info:
        world.orch.create_job(container(gpus=5, team="team-c"), world.now, team_gpus=4)
    assert info.value.data["in_use"] == 0 and info.value.data["requested"] == 5


def test_the_per_user_quota_counts_the_owners_jobs_in_the_team() -> None:
    world = World(nodes=(8, 8))
    orch = world.orch
    orch.create_job(container(gpus=2), world.now, owner="u-1", user_gpus=3)
    orch.create_job(container(gpus=2), world.now, owner="u-2", user_gpus=3)
    orch.create_job(container(gpus=2, team="team-b"), world.now, owner="u-1", user_gpus=3)
    with pytest.raises(QuotaExceeded) as info:
        orch.create_job(container(gpus=2), world.now, owner="u-1", user_gpus=3)
    assert info.value.data == {"scope": "user", "quota": 3, "in_use": 2, "requested": 2}
    orch.create_job(container(gpus=1), world.now, owner="u-1", user_gpus=3)
    # the team's quota is checked first and names the team
    with pytest.raises(QuotaExceeded) as info:
        orch.create_job(container(gpus=1), world.now, owner="u-3", team_gpus=5, user_gpus=3)
    assert info.value.data["scope"] == "team" and info.value.data["in_use"] == 5


def test_the_owner_survives_a_restart_of_wrk_ork(tmp_path) -> None:
    world = World(tmp_path / "ork.sqlite")
    world.orch.create_job(container(gpus=2), world.now, owner="u-1")
    world.reopen()
    [job] = world.orch.book.jobs.values()
    assert job.owner == "u-1"
    with pytest.raises(QuotaExceeded):
        world.orch.create_job(container(gpus=2), world.now, owner="u-1", user_gpus=3)


def test_a_version_2_store_is_migrated_and_its_jobs_have_no_owner(tmp_path) -> None:
    path = tmp_path / "ork.sqlite"
    world = World(path)
    world.create(container(gpus=2))
    world.orch.close()
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE jobs DROP COLUMN owner")
        conn.execute("ALTER TABLE replicas DROP COLUMN gateway")  # version 4's
        conn.execute("PRAGMA user_version = 2")
    store = Store.open(path)
    try:
        [job] = store.load_jobs()
        assert job.owner is None and job.spec.gpus == 2
        assert all(replica.gateway is None for replica in job.replicas.values())
        (version,) = store._conn.execute("PRAGMA user_version").fetchone()
        assert version == SCHEMA_VERSION == 4
    finally:
        store.close()


# -- over RPC: two creates racing at the edge --------------------------------------

async def test_two_creates_racing_at_the_edge_one_passes(nursery) -> None:
    harness = Harness()  # one rack of two 4-GPU nodes
    world = harness.world
    # as the daemon runs it: each call in a worker thread, one at a time
    harness.service = OrkService(world.orch, allow=lambda key: key == APP_NODE,
                                 clock=lambda: world.now, limiter=trio.CapacityLimiter(1))
    async with connect(nursery, harness) as client:
        params = CreateJob(spec=container(gpus=3), created_by="u-1",
                           quota=GpuQuota(team_gpus=4))
        outcomes: list[str] = []

        async def create() -> None:
            try:
                await client.call(CREATE_JOB, params)
                outcomes.append("created")
            except RpcError as exc:
                outcomes.append(exc.code)
                assert exc.data == {"scope": "team", "quota": 4, "in_use": 3,
                                    "requested": 3}

        with trio.fail_after(30):
            async with trio.open_nursery() as race:
                race.start_soon(create)
                race.start_soon(create)
        assert sorted(outcomes) == ["QUOTA_EXCEEDED", "created"]
        assert [job.spec.gpus for job in world.orch.list_jobs()] == [3]


# -- hypothesis: whatever happens, the team holds at most its quota -----------------

_ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("create"), st.integers(1, 4), st.integers(1, 3)),
    st.tuples(st.sampled_from(["active", "failed", "deleted", "restart", "delete"]),
              st.integers(0, 20), st.integers(0, 2)),
), max_size=40)


@settings(max_examples=examples(60), deadline=None)
@given(quota=st.integers(0, 12), actions=_ACTIONS)
def test_a_team_never_holds_more_than_its_quota(quota: int, actions) -> None:
    world = World(nodes=(8, 8))
    orch = world.orch
    for action in actions:
        world.now += 1
        jobs = orch.list_jobs()
        if action[0] == "create":
            _, gpus, replicas = action
            spec = (container(gpus=gpus) if replicas == 1
                    else inference(gpus=gpus, replicas=replicas))
            try:
                orch.create_job(spec, world.now, team_gpus=quota)
            except QuotaExceeded:
                pass
        elif jobs:
            kind, pick, replica = action
            job = jobs[pick % len(jobs)]
            try:
                if kind == "restart":
                    orch.restart_job(job.id, world.now)
                elif kind == "delete":
                    orch.delete_job(job.id, world.now)
                elif replica in {r.index for r in job.replicas}:
                    world.say(replica, kind, job=job.id)
            except OrkError as exc:  # the table's refusals: fine here
                assert exc.code == "INVALID_STATE", exc
        assert _claimed(world) <= quota
        assert sum(gpus_counted(j) for j in orch.book.jobs.values()) <= quota
