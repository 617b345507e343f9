"""The agent in-process against a worker's registry, over real 127.0.0.1 sockets."""

from __future__ import annotations

import pytest
import trio

from agents._agent import Agent, AgentGaveUp, AgentRefused, ReportPolicy, listen_host
from nodes.k8s_worker.agents import AgentEventKind
from p2p.keys import KeyPair

from .helpers import agent_config, running_worker, vmi_of

QUICK = ReportPolicy(backoff_min_s=0.05, backoff_max_s=0.2, connect_timeout_s=5)


def agent_for(worker, readiness=None, **config) -> Agent:
    config = agent_config(worker.keypair.public_key, address=worker.address, **config)
    worker.registry.expect(vmi_of(config))
    return Agent(config, KeyPair.generate(), worker_addresses=[worker.address],
                 readiness=readiness, policy=QUICK)


async def test_ready_waits_for_the_readiness_hook(nursery):
    hook_may_return = trio.Event()

    async def readiness() -> None:
        await hook_may_return.wait()

    async with running_worker(nursery) as worker:
        agent = agent_for(worker, readiness)
        await nursery.start(agent.run)
        assert (await worker.next_event()).kind is AgentEventKind.HELLO
        with trio.move_on_after(0.5):  # heartbeats, but no ready
            await worker.next_event()
            pytest.fail("ready before the readiness hook returned")
        hook_may_return.set()
        ready = await worker.next_event()
        assert (ready.kind, ready.message) == (AgentEventKind.READY, "agent ready")
        assert worker.registry.state(ready.vmi_name).key == agent.keypair.public_key
        nursery.cancel_scope.cancel()


async def test_a_failing_readiness_hook_is_reported_and_ends_the_agent(nursery):
    async def readiness() -> None:
        raise RuntimeError("the model server exited with status 1")

    async with running_worker(nursery) as worker:
        agent = agent_for(worker, readiness)
        with pytest.raises(AgentGaveUp, match="status 1"):
            with trio.fail_after(15):
                await agent.run()
        events = [await worker.next_event() for _ in range(2)]
        assert [e.kind for e in events] == [AgentEventKind.HELLO, AgentEventKind.FAILED]
        assert events[1].message == "the model server exited with status 1"
        nursery.cancel_scope.cancel()


async def test_a_stale_generation_ends_the_agent(nursery):
    async with running_worker(nursery) as worker:
        agent = agent_for(worker, generation=1)
        restarted = agent.config.model_copy(update={"generation": 2})
        worker.registry.expect(vmi_of(restarted))
        with pytest.raises(AgentRefused) as info:
            with trio.fail_after(15):
                await agent.run()
        assert info.value.code == "STALE_GENERATION"
        nursery.cancel_scope.cancel()


async def test_an_agent_retries_until_the_worker_expects_it(nursery):
    async with running_worker(nursery) as worker:
        config = agent_config(worker.keypair.public_key, address=worker.address)
        agent = Agent(config, KeyPair.generate(), worker_addresses=[worker.address],
                      policy=QUICK)
        await nursery.start(agent.run)
        with trio.fail_after(10):
            while agent.failed_sessions < 2:  # noqa: ASYNC110 - UNKNOWN_REPLICA, retried
                await trio.sleep(0.05)
        worker.registry.expect(vmi_of(config))  # the worker re-learnt its VMIs
        assert (await worker.next_event()).kind is AgentEventKind.HELLO
        assert (await worker.next_event()).kind is AgentEventKind.READY
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("addresses", "host"), [
    ([], "0.0.0.0"),
    ([("127.0.0.1", 1)], "127.0.0.1"),
    ([("127.0.0.1", 1), ("10.0.0.1", 2)], "0.0.0.0"),
    ([("::1", 1)], "::1"),
])
def test_an_agent_listens_on_loopback_only_when_all_it_knows_is_there(addresses, host):
    assert listen_host(addresses) == host




async def test_an_agent_that_cannot_reach_its_worker_comes_through_the_relay(nursery):
    """seeds/relay.txt's first symptom: the cluster network cannot reach the worker
    (its address here is a closed port, and there is no DHT), but both reach the
    relay box: the worker reserves there, the agent pairs through it by its address."""
    import socket

    from relay import run_relay

    relay_key = KeyPair.generate()
    with trio.fail_after(30):
        where = await nursery.start(lambda task_status: run_relay(
            relay_key, host="127.0.0.1", port=0, task_status=task_status))
        known = ((relay_key.public_key, (where.tcp,)),)
        async with running_worker(nursery, relays=(relay_key.public_key,),
                                  known_peers=known) as worker:
            while relay_key.public_key not in worker.swarm.reserved_relays:
                await worker.swarm.reservations_changed.wait()
            with socket.socket() as closed:
                closed.bind(("127.0.0.1", 0))
                nowhere = closed.getsockname()
            config = agent_config(worker.keypair.public_key, address=nowhere).model_copy(
                update={"relays": (relay_key.public_key.hex(),),
                        "relay_addresses": {relay_key.public_key.hex(): (where.tcp,)}})
            worker.registry.expect(vmi_of(config))
            agent = Agent(config, KeyPair.generate(), worker_addresses=[nowhere], policy=QUICK)
            await nursery.start(agent.run)
            hello = await worker.next_event()
            assert hello.kind is AgentEventKind.HELLO
            assert worker.swarm.connections[agent.keypair.public_key].relayed
            nursery.cancel_scope.cancel()
