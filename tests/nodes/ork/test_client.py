"""app-node's client of wrk-ork on real swarms: calls wait for the connection,
wrk-ork's refusals keep their codes, a restarted wrk-ork is reached again, and
an unreachable one is a clear OrkUnavailable."""

from __future__ import annotations

import pytest
import trio

from contracts.ork import (
    CREATE_JOB,
    GET_JOB,
    LIST_JOBS,
    WATCH_JOBS,
    CreateJob,
    JobRef,
    ListJobs,
    WatchJobs,
)
from nodes.kit.ork_client import OrkClient, OrkUnavailable
from nodes.ork.service import OrkService
from p2p.keys import KeyPair
from p2p.rpc import RpcError
from p2p.swarm import Swarm, SwarmConfig, UpkeepPolicy

from ...p2p.helpers import Stoppable, wait_until
from .world import World, container

FAST = UpkeepPolicy(base_s=0.05, max_s=0.2, dial_timeout_s=2.0)


async def start_ork(nursery: trio.Nursery, world: World, keypair: KeyPair, allowed: set[bytes],
                    port: int = 0) -> tuple[Stoppable, tuple[str, int]]:
    service = OrkService(world.orch, allow=lambda key: key in allowed, clock=lambda: world.now)
    swarm = Swarm(keypair, config=SwarmConfig(host="127.0.0.1", port=port), services=[service])
    task = Stoppable()
    address = await task.start(nursery, swarm.run)
    return task, address


async def test_calls_reach_wrk_ork_and_keep_its_error_codes():
    world, ork_key, me = World(nodes=(8,)), KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            _, address = await start_ork(nursery, world, ork_key, {me.public_key})
            swarm = Swarm(me, config=SwarmConfig(host="127.0.0.1", port=0))
            await nursery.start(swarm.run)
            client = OrkClient(swarm, ork_key.public_key, addresses=[address], backoff=FAST)
            await nursery.start(client.run)
            job = (await client.call(CREATE_JOB, CreateJob(spec=container()))).job
            assert (await client.call(GET_JOB, JobRef(job_id=job.id))).job.id == job.id
            assert [j.id for j in (await client.call(LIST_JOBS, ListJobs())).jobs] == [job.id]
            with pytest.raises(RpcError) as missing:
                await client.call(GET_JOB, JobRef(job_id="j-0000000000000000"))
            assert missing.value.code == "NOT_FOUND"
            async with client.stream(WATCH_JOBS, WatchJobs(job_id=job.id, snapshot=True)) as ev:
                async for event in ev:
                    assert event.job_id == job.id
                    break
            nursery.cancel_scope.cancel()


async def test_a_restarted_wrk_ork_is_reached_again_and_a_dead_one_is_unavailable():
    world, ork_key, me = World(nodes=(8,)), KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            ork, address = await start_ork(nursery, world, ork_key, {me.public_key})
            swarm = Swarm(me, config=SwarmConfig(host="127.0.0.1", port=0))
            await nursery.start(swarm.run)
            client = OrkClient(swarm, ork_key.public_key, addresses=[address], backoff=FAST)
            await nursery.start(client.run)
            await client.call(LIST_JOBS, ListJobs())
            await ork.stop()  # its port closed: the restart binds it again
            await wait_until(lambda: not client.connected, limit_s=30)
            with pytest.raises(OrkUnavailable, match="is not reachable"):
                await client.call(LIST_JOBS, ListJobs(), timeout_s=0.5)
            await start_ork(nursery, world, ork_key, {me.public_key}, port=address[1])
            assert (await client.call(LIST_JOBS, ListJobs(), timeout_s=20)).jobs == []
            assert client.connections == 2
            nursery.cancel_scope.cancel()


async def test_a_daemon_wrk_ork_does_not_list_is_forbidden():
    world, ork_key, me = World(nodes=(8,)), KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            _, address = await start_ork(nursery, world, ork_key, allowed=set())
            swarm = Swarm(me, config=SwarmConfig(host="127.0.0.1", port=0))
            await nursery.start(swarm.run)
            client = OrkClient(swarm, ork_key.public_key, addresses=[address], backoff=FAST)
            await nursery.start(client.run)
            with pytest.raises(RpcError) as refused:
                await client.call(LIST_JOBS, ListJobs())
            assert refused.value.code == "FORBIDDEN"
            nursery.cancel_scope.cancel()
