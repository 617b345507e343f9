"""Shell access follows the team's keys on a running job.

A real :class:`~nodes.k8s_worker.worker.Worker` (its SQLite file, its agent
registry on a 127.0.0.1 swarm, the in-memory backend of test_worker) creates a
GPU Container Job's replica; a real :class:`~agents._agent.Agent` runs with the
config the worker rendered, and users dial it and open shells (real processes).
The worker then gets ``set_shell_keys`` operations as wrk-ork sends them.

Real time (shell processes do not run on trio's clock): every wait is on a
condition, bounded by ``fail_after``; :data:`DEADLINE_S` is the promise ("within
seconds") the tests hold the path to.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

import pytest
import trio

from agents._agent import Agent, ReportPolicy
from agents.instance import ShellError, open_shell
from contracts.model import JobSpec, NodeShare, ReplicaPlacement
from contracts.operations import CreateReplica, SetShellKeys, decode_report
from contracts.shell_access import ShellKeys
from nodes.k8s_worker.store import WorkerStore
from nodes.k8s_worker.worker import Worker, WorkerRuntime
from p2p.connection import dial_tcp
from p2p.errors import P2PError
from p2p.keys import KeyPair

from ...agents.helpers import running_worker
from ...p2p.helpers import wait_until
from .worker_harness import FakeBackend

#: How long a removed member may keep a session, or a new key wait for one.
DEADLINE_S = 5.0
LIMIT_S = 30.0
TEAM = "t1"
RACK = "bb" * 32
IMAGE = "docker://registry.example/cosmicac/ubuntu-cuda:12.4"
QUICK = ReportPolicy(backoff_min_s=0.05, backoff_max_s=0.2, connect_timeout_s=5,
                     shell_keys_retry_s=0.1)


class CapturingBackend(FakeBackend):
    """test_worker's backend, keeping the units it was asked to create."""

    def __init__(self) -> None:
        super().__init__()
        self.units = []

    async def create(self, unit) -> None:
        self.units.append(unit)
        await super().create(unit)


def create_op(keys: tuple[str, ...]) -> CreateReplica:
    spec = JobSpec(name="box", team=TEAM, type="container", image=IMAGE, gpus=1,
                   authorized_keys=keys)
    return CreateReplica(op_id="create-1", job_id="j-1", replica=0, spec=spec,
                         placement=ReplicaPlacement(rack=RACK, shares=(
                             NodeShare(node="n1", gpus=1),)))


def set_keys(version: int, *users: KeyPair) -> SetShellKeys:
    return SetShellKeys(op_id=f"keys-{version}", keys=ShellKeys(
        team=TEAM, keys=tuple(user.hex for user in users), version=version))


@asynccontextmanager
async def worker_on(nursery, store_path, *, keypair=None, port=0):
    """A worker (registry + core) on ``store_path``; stopped when the block ends."""
    async with running_worker(nursery, keypair=keypair, port=port) as side:
        backend = CapturingBackend()
        published = []

        async def publish(key: str, payload: bytes) -> int:
            published.append(decode_report(payload))
            return len(published)

        worker = Worker(store=WorkerStore.open(store_path), backend=backend,
                        registry=side.registry, agent_events=side.events, publish=publish,
                        runtime=WorkerRuntime(worker_key=side.keypair.hex,
                                              worker_addresses=(f"127.0.0.1:{side.address[1]}",),
                                              heartbeat_interval_s=0.2, report_interval_s=60))
        try:
            async with trio.open_nursery() as inner:
                await inner.start(worker.run)
                try:
                    yield side, worker, backend
                finally:
                    inner.cancel_scope.cancel()
        finally:
            # Once the worker's tasks are done: one may be writing in a thread.
            worker.store.close()


async def shell(agent: Agent, user: KeyPair, nursery, argv=("cat",)):
    """A session of ``user`` on the agent (its own connection)."""
    host, port = agent.swarm_address
    connection = await dial_tcp(host, port, user, agent.keypair.public_key)
    await nursery.start(connection.run)
    return connection, await open_shell(connection, argv=list(argv))


async def refused(agent: Agent, user: KeyPair, nursery) -> bool:
    try:
        connection, session = await shell(agent, user, nursery, argv=("true",))
    except (P2PError, OSError, trio.BrokenResourceError, ShellError):
        return True
    await session.aclose()
    await connection.aclose()
    return False


async def test_a_removed_member_loses_an_open_shell_and_a_new_key_gets_one(
        nursery, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="cosmicac.agent.system")
    alice, bob, carol = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(LIMIT_S):
        async with worker_on(nursery, tmp_path / "worker.sqlite") as (side, worker, backend):
            await worker.apply(create_op((alice.hex, bob.hex)))
            await wait_until(lambda: backend.units)
            config = backend.units[0].vmis[0].agent
            assert set(config.authorized_keys) == {alice.hex, bob.hex}
            agent = Agent(config, KeyPair.generate(), worker_addresses=[side.address],
                          policy=QUICK, state_dir=tmp_path)
            await nursery.start(agent.run)
            await wait_until(lambda: agent.vmi is not None)

            connection, session = await shell(agent, alice, nursery)
            await session.send_stdin(b"still here\n")
            assert (await session.receive()).data == b"still here\n"

            # Alice leaves the team; Carol joins (or logs in from a new workstation).
            await worker.apply(set_keys(10, bob, carol))
            with trio.fail_after(DEADLINE_S):
                with pytest.raises(ShellError) as closed:
                    await session.wait_exit()
            assert closed.value.code == "revoked"
            assert "no longer a member" in str(closed.value)
            with trio.fail_after(DEADLINE_S):
                # Her connection is still up, but no new session opens on it...
                with pytest.raises(ShellError) as again:
                    await open_shell(connection, argv=["true"])
                assert again.value.code == "unauthorized"
                # ...nor on a new one.
                assert await refused(agent, alice, nursery)
                _, carols = await shell(agent, carol, nursery, argv=("sh", "-c", "exit 7"))
                assert (await carols.wait_exit()).code == 7
            assert agent.metrics()["shell_sessions_revoked_total"] == 1
    revoked = [r for r in caplog.records if getattr(r, "event", "") == "shell.session_revoked"]
    assert len(revoked) == 1 and revoked[0].user_key == alice.hex
    assert revoked[0].job_id == "j-1" and revoked[0].source == "System"


async def test_a_stale_set_is_ignored_at_the_worker_and_the_agent(nursery, tmp_path):
    alice, bob = KeyPair.generate(), KeyPair.generate()
    with trio.fail_after(LIMIT_S):
        async with worker_on(nursery, tmp_path / "worker.sqlite") as (side, worker, backend):
            await worker.apply(create_op((alice.hex, bob.hex)))
            await wait_until(lambda: backend.units)
            agent = Agent(backend.units[0].vmis[0].agent, KeyPair.generate(),
                          worker_addresses=[side.address], policy=QUICK)
            await nursery.start(agent.run)
            await worker.apply(set_keys(5, bob))
            await wait_until(lambda: agent.access.version == 5, limit_s=DEADLINE_S)
            # An older update (reordered, or redelivered after a newer one) and a
            # redelivery of the same version change nothing, anywhere.
            assert not await worker.set_shell_keys(set_keys(4, alice, bob).keys)
            assert not await worker.set_shell_keys(set_keys(5, alice).keys)
            assert worker.store.shell_keys()[TEAM].keys == (bob.hex,)
            assert not await agent.apply_shell_keys(set_keys(3, alice).keys)
            assert agent.access.version == 5 and alice.public_key not in agent.access
            assert await refused(agent, alice, nursery)
            # The long poll runs beside the heartbeats: the agent never went silent.
            await trio.sleep(1.0)  # > silent_after_s (3 heartbeats of 0.2 s)
            state = side.registry.state("cac-1-r0-n0")
            assert state is not None and state.key == agent.keypair.public_key
            assert not state.silent


async def test_the_newest_set_survives_a_worker_restart_and_keeps_flowing(nursery, tmp_path):
    alice, bob, carol = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    store = tmp_path / "worker.sqlite"
    keypair = KeyPair.generate()
    with trio.fail_after(LIMIT_S):
        async with worker_on(nursery, store, keypair=keypair) as (side, worker, backend):
            port = side.address[1]
            await worker.apply(create_op((alice.hex,)))
            await wait_until(lambda: backend.units)
            agent = Agent(backend.units[0].vmis[0].agent, KeyPair.generate(),
                          worker_addresses=[side.address], policy=QUICK, state_dir=tmp_path)
            await nursery.start(agent.run)
            await worker.apply(set_keys(20, alice, carol))
            await wait_until(lambda: agent.access.version == 20, limit_s=DEADLINE_S)
        # The worker is gone (its agents are not, as VMIs outlive it); it comes
        # back on its file, with the newest set it had, and the agent says hello.
        sessions = agent.sessions
        async with worker_on(nursery, store, keypair=keypair, port=port) as (_, worker, _b):
            assert worker.shell_keys_of("cac-1-r0-n0").version == 20
            await wait_until(lambda: agent.sessions > sessions, limit_s=DEADLINE_S)
            _, carols = await shell(agent, carol, nursery)
            await worker.apply(set_keys(21, bob))
            with trio.fail_after(DEADLINE_S), pytest.raises(ShellError) as closed:
                await carols.wait_exit()
            assert closed.value.code == "revoked"
            assert agent.access.version == 21 and bob.public_key in agent.access
            assert not await refused(agent, bob, nursery)
    # What the agent took is in its storage: a restarted agent starts from it.
    restarted = Agent(agent.config, agent.keypair, worker_addresses=[side.address],
                      state_dir=tmp_path)
    assert restarted.access.version == 21 and set(restarted.access.keys) == {bob.public_key}
