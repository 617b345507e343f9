"""wrk-ork's ``service.status`` (contracts.health): what app-node's health prober
reads: version, start, the outbox as queue depth, the newest rack report, and
small details; refused to keys wrk-ork does not trust."""

from __future__ import annotations

import pytest
import trio

from contracts.health import STATUS, ServiceStatus, StatusRequest, package_version
from contracts.ork import CREATE_JOB, CreateJob
from p2p.rpc import RpcError

from .support import STRANGER, Harness, connect
from .world import container


async def test_status_counts_the_outbox_racks_and_jobs(nursery, autojump_clock):
    harness = Harness()
    world = harness.world
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            status = await client.call(STATUS, StatusRequest())
            assert isinstance(status, ServiceStatus)
            assert status.service == "wrk-ork" and status.version == package_version()
            assert status.started_at == 1000.0 and status.queue_depth == 0
            assert status.last_report_at == world.now  # World hears its rack at start
            assert status.details["racks"] == 1 and status.details["racks_silent"] == 0

            await client.call(CREATE_JOB, CreateJob(spec=container(gpus=2)))
            await client.call(CREATE_JOB, CreateJob(spec=container(gpus=2)))
            status = await client.call(STATUS, StatusRequest())
            assert status.queue_depth == 2  # two CreateReplica not yet published
            assert status.details["jobs_starting"] == 2

            world.orch.mark_published([o.op.op_id for o in world.orch.outbox()])
            world.now += 30
            world.hear()
            status = await client.call(STATUS, StatusRequest())
            assert status.queue_depth == 0 and status.last_report_at == world.now

            world.silence()
            status = await client.call(STATUS, StatusRequest())
            assert status.details["racks_silent"] == 1
            assert status.last_report_at == world.now - (world.orch.unknown_after_s + 1)


async def test_a_rack_never_heard_gives_no_last_report(nursery, autojump_clock):
    harness = Harness()
    harness.world.orch.register_rack("cd" * 32, "default", harness.world.now + 5)
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            status = await client.call(STATUS, StatusRequest())
            assert status.details["racks"] == 2
            assert status.last_report_at == 1000.0  # the first rack's, not the new one's


async def test_status_is_refused_to_a_stranger(nursery, autojump_clock):
    harness = Harness()
    async with connect(nursery, harness, key=STRANGER) as client:
        with trio.fail_after(10), pytest.raises(RpcError) as caught:
            await client.call(STATUS, StatusRequest())
        assert caught.value.code == "FORBIDDEN"
