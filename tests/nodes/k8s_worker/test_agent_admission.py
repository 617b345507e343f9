"""A new job's agent under a flood of strangers.

The worker knows a new agent only by its report token: until its hello binds
its key, the agent is a stranger and competes with a flood for the strangers'
slots. Two rules keep it in: a stranger that has held a slot for the worker's
``STRANGER_EVICT_AFTER_S`` gives it up to a newcomer (so the agent waits about
that long, not the swarm's 10 s), and once the hello has bound its key the
host counts it as reserved before choosing anyone to evict
(``PeerHost.promote_reserved``), so the flood never takes its slot again.

In memory under the autojump clock (the host's accept path takes any stream;
tests/flood.py floods over real sockets): all from loopback, as on the
``local`` backend, where the agent and the flood are one source.
"""

from __future__ import annotations

import trio
import trio.testing

from contracts.agent_report import Hello
from nodes.k8s_worker.agents import AgentTable
from nodes.k8s_worker.daemon import STRANGER_EVICT_AFTER_S, reserved_peers
from nodes.k8s_worker.settings import WorkerSettings
from p2p.connection import Connection
from p2p.host import PeerHost
from p2p.keys import KeyPair
from p2p.noise import SecretStream
from p2p.swarm import Swarm, SwarmConfig
from tests.agents.helpers import agent_config, vmi_of
from tests.p2p.helpers import wait_until

WORKER = KeyPair.generate()
ORK = KeyPair.generate()
#: How often the flood dials a fresh key, and the agent tries again.
FLOOD_EVERY_S = 0.25
RETRY_EVERY_S = 0.5


async def connect(nursery: trio.Nursery, host: PeerHost, keypair: KeyPair,
                  port: int) -> Connection:
    ours, theirs = trio.testing.memory_stream_pair()
    nursery.start_soon(host.accept, theirs, ("127.0.0.1", port))
    stream = await SecretStream.initiator(ours, keypair, host.public_key)
    connection = Connection(stream)
    await nursery.start(connection.run)
    await trio.sleep(0.01)  # the host takes it or closes it
    return connection


async def flood(nursery: trio.Nursery, host: PeerHost) -> None:
    """Every strangers' slot loopback may hold, then a fresh key every
    ``FLOOD_EVERY_S``: a client holding on and pushing."""
    port = 10_000
    while True:
        port += 1
        await connect(nursery, host, KeyPair.generate(), port)
        if len(host.connections) >= host.config.connections_per_address:
            await trio.sleep(FLOOD_EVERY_S)


async def join(nursery: trio.Nursery, host: PeerHost, agent: KeyPair) -> float:
    """Dial as the agent until the host keeps it (as its report loop retries);
    return when it got in."""
    while True:
        await connect(nursery, host, agent, 9)
        if agent.public_key in host.connections:
            return trio.current_time()
        await trio.sleep(RETRY_EVERY_S)


async def worker_host(nursery: trio.Nursery, table: AgentTable) -> PeerHost:
    """A host with the worker's limits (its swarm's) and reserved peers."""
    config = Swarm(WORKER, config=SwarmConfig(
        stranger_evict_after_s=STRANGER_EVICT_AFTER_S)).host.config
    assert config.stranger_evict_after_s == STRANGER_EVICT_AFTER_S  # the swarm passes it on
    host = PeerHost(WORKER, config=config)
    host.add_reserved(reserved_peers(WorkerSettings(storage="/nonexistent",
                                                    ork=ORK.public_key), table))
    await nursery.start(host.run)
    return host


async def agent_under_flood(nursery: trio.Nursery, *, hello: bool) -> tuple[float, bool]:
    """A new job's agent joins while the flood holds on; with ``hello`` its
    hello binds it once in. Returns (seconds it waited, still connected 15 s later)."""
    table = AgentTable()
    host = await worker_host(nursery, table)
    config = agent_config(WORKER.public_key)
    table.expect(vmi_of(config))
    agent = KeyPair.generate()
    async with trio.open_nursery() as attacker:
        attacker.start_soon(flood, attacker, host)
        # The flood holds every strangers' slot of loopback first.
        await wait_until(lambda: len(host.connections) >= host.config.connections_per_address)
        started = trio.current_time()
        waited = await join(nursery, host, agent) - started
        if hello:
            table.hello(agent.public_key, Hello(
                job_id=config.job_id, replica=config.replica, generation=config.generation,
                node_rank=config.node_rank, token=config.report_token), now=0.0)
        await trio.sleep(15)
        kept = agent.public_key in host.connections
        attacker.cancel_scope.cancel()
    return waited, kept


async def test_a_new_agent_gets_in_within_the_workers_eviction_time_and_its_hello_keeps_it(
        nursery, autojump_clock):
    with trio.fail_after(120):
        waited, kept = await agent_under_flood(nursery, hello=True)
    # Virtual seconds (the autojump clock): the worker's eviction time and one
    # retry. The swarm's default (10 s) kept it out about five times as long.
    assert waited <= 3
    assert kept  # bound by its hello: reserved, and never evicted again


async def test_without_a_hello_the_flood_would_take_the_agents_slot_again(
        nursery, autojump_clock):
    """The control: what the hello protects it from."""
    with trio.fail_after(120):
        _waited, kept = await agent_under_flood(nursery, hello=False)
    assert not kept
