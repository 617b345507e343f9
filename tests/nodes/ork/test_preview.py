"""``jobs.preview``: what ``jobs.create`` of the same params would do now, done nowhere.

Each case previews, proves nothing was recorded (the store file's bytes, the jobs,
the outbox, the events, the free GPUs), then creates the same job and checks the
preview said what the create did: the same placement, or the same status and reason,
or the same refusal."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

from contracts.model import JobStatus
from contracts.ork import CREATE_JOB, PREVIEW_JOB, CreateJob, GpuQuota
from nodes.ork.errors import Conflict, QuotaExceeded
from p2p.rpc import RpcError

from .support import STRANGER, Harness, connect
from .world import RACK, World, container, inference

J = JobStatus


def _files(path: Path) -> str:
    """A digest of the store's files (the database and its WAL, if any)."""
    digest = hashlib.blake2b()
    for file in sorted(path.parent.glob(path.name + "*")):
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


def _state(world: World) -> tuple:
    """Everything a create records: jobs, operations, events (those since the last
    call: none when nothing happened), free GPUs, the file."""
    orch = world.orch
    assert world.path is not None
    return (orch.list_jobs(), orch.outbox(), orch.book.drain_events(),
            [(n.name, n.free) for n in orch.nodes()], orch.statistics().jobs,
            _files(world.path))


def _settled(world: World) -> tuple:
    """:func:`_state` once the events so far are drained."""
    world.orch.drain_events()
    return _state(world)


def test_a_job_that_fits_would_start_where_create_then_places_it(tmp_path: Path) -> None:
    world = World(tmp_path / "ork.sqlite", nodes=(8, 4))
    world.create(container(gpus=3))  # n1 keeps 1 free, n0 5: best fit differs by size
    before = _settled(world)
    spec = inference(gpus=2, replicas=2)
    preview = world.orch.preview_job(spec)
    assert _state(world) == before  # nothing recorded anywhere
    assert preview.status is J.STARTING and preview.reason == "" and preview.rack == RACK
    created = world.create(spec)
    assert created.status is J.STARTING
    assert preview.placements == tuple(r.placement for r in created.replicas)


def test_a_job_without_room_now_would_wait_with_the_reason_create_gives(
        tmp_path: Path) -> None:
    world = World(tmp_path / "ork.sqlite", nodes=(8,))
    world.create(container(gpus=6))
    before = _settled(world)
    preview = world.orch.preview_job(container(gpus=4))
    assert _state(world) == before
    assert preview.status is J.PENDING and preview.placements == () and preview.rack is None
    created = world.create(container(gpus=4))
    assert created.status is J.PENDING and preview.reason == created.reason
    assert "no room now" in preview.reason


def test_a_job_that_can_never_fit_would_fail_with_the_reason(tmp_path: Path) -> None:
    world = World(tmp_path / "ork.sqlite", nodes=(8,))
    for spec in (container(gpus=9), container(location="mars")):
        before = _settled(world)
        preview = world.orch.preview_job(spec)
        assert _state(world) == before
        created = world.create(spec)
        assert (preview.status, preview.reason) == (created.status, created.reason)
        assert created.status is J.FAILED
    assert "no rack is registered in location mars" in preview.reason


def test_a_rack_that_has_not_reported_makes_the_job_wait_not_fail() -> None:
    world = World(register=False)
    world.orch.register_rack(RACK, "default", world.now, name="rack-1")
    preview = world.orch.preview_job(container(gpus=2))
    assert preview.status is J.PENDING and "report its capacity" in preview.reason
    assert world.orch.list_jobs() == []


def test_refusals_are_create_s_and_a_preview_uses_no_quota(tmp_path: Path) -> None:
    world = World(tmp_path / "ork.sqlite", nodes=(8, 8))
    world.create(inference(served_name="chat"))
    with pytest.raises(Conflict):
        world.orch.preview_job(inference(served_name="chat"))
    quota = {"team_gpus": 4}
    before = _settled(world)
    for _ in range(3):  # at the quota's edge, again and again: nothing is counted
        assert world.orch.preview_job(container(gpus=2), **quota).status is J.STARTING
    assert _state(world) == before
    with pytest.raises(QuotaExceeded) as refused:
        world.orch.preview_job(container(gpus=3), **quota)
    assert refused.value.data == {"scope": "team", "quota": 4, "in_use": 2, "requested": 3}
    world.now += 1
    assert world.orch.create_job(container(gpus=2), world.now, **quota).status is J.STARTING
    with pytest.raises(QuotaExceeded):
        world.orch.preview_job(container(gpus=1), **quota)


async def test_the_service_previews_for_app_node_only_and_changes_nothing(
        nursery, autojump_clock) -> None:
    harness = Harness()
    params = CreateJob(spec=container(gpus=2), created_by="u-1",
                       quota=GpuQuota(team_gpus=8))
    with trio.fail_after(10):
        async with connect(nursery, harness) as client:
            preview = await client.call(PREVIEW_JOB, params)
            assert preview.status is J.STARTING and len(preview.placements) == 1
            assert harness.changes == 0 and harness.world.orch.list_jobs() == []
            over = CreateJob(spec=container(gpus=2), quota=GpuQuota(team_gpus=1))
            with pytest.raises(RpcError) as refused:
                await client.call(PREVIEW_JOB, over)
            assert refused.value.code == "QUOTA_EXCEEDED"
            created = (await client.call(CREATE_JOB, params)).job
            assert [r.placement for r in created.replicas] == list(preview.placements)
        async with connect(nursery, harness, STRANGER) as stranger:
            with pytest.raises(RpcError) as forbidden:
                await stranger.call(PREVIEW_JOB, params)
            assert forbidden.value.code == "FORBIDDEN"
