"""Every daemon keeps connection slots for the peers its settings name
("every daemon keeps room for its configured peers under any flood").

A table over the daemons: each row builds the predicate the daemon hands its
swarm (``reserved_peers`` of its daemon module, or the real object for the
agent and the relay) from settings naming a key per peer role, and lists the
keys the settings name as peers. Each must be reserved and a stranger's key
must not. Peers that change while the daemon runs (a worker's bound agents,
wrk-ork's racks, an agent's shell keys, the proxy's routed agents) have rows
that change them. tests/nodes/test_admission_flood.py floods the daemons over
real sockets; this proves the predicates are whole.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from agents._agent import Agent
from contracts.agent_report import Hello
from contracts.model import JobType
from crdt import run_database_service
from nodes.app_node.daemon import reserved_peers as app_node_reserved
from nodes.app_node.settings import AppNodeSettings
from nodes.k8s_worker.agents import AgentTable
from nodes.k8s_worker.daemon import reserved_peers as worker_reserved
from nodes.k8s_worker.settings import WorkerSettings
from nodes.monitor.daemon import reserved_peers as monitor_reserved
from nodes.monitor.service import ROLES
from nodes.monitor.settings import MonitorSettings
from nodes.ork.access import OrkAccess
from nodes.ork.daemon import reserved_peers as ork_reserved
from nodes.proxy_inference.daemon import reserved_peers as proxy_reserved
from nodes.proxy_inference.settings import ProxySettings
from p2p.keys import KeyPair
from p2p.log import FsyncPolicy
from p2p.swarm import Swarm, SwarmConfig
from relay import RelayConfig, RelayServer
from tests.agents.helpers import agent_config, vmi_of

STORAGE = Path("/nonexistent")


def keys(n: int) -> list[bytes]:
    return [KeyPair.generate().public_key for _ in range(n)]


@dataclass
class Row:
    is_reserved: Callable[[bytes], bool]
    #: Every key the daemon's settings name as a peer.
    peers: list[bytes]


def monitor() -> Row:
    named = {role: keys(2) for role in ROLES}
    settings = MonitorSettings(storage=STORAGE, allow_any_pusher=True, **named)
    return Row(monitor_reserved(settings).__contains__,
               [key for role in ROLES for key in named[role]])


def app_node() -> Row:
    writers, readers, (ork, monitor) = keys(2), keys(2), keys(2)
    settings = AppNodeSettings(storage=STORAGE, database_writers=writers,
                               database_readers=readers, ork=ork, monitor=monitor)
    return Row(app_node_reserved(settings).__contains__, [*writers, *readers, ork, monitor])


def proxy() -> Row:
    ork, database, *routed = keys(4)
    settings = ProxySettings(storage=STORAGE, ork=ork, database=database)
    return Row(proxy_reserved(settings, lambda: frozenset(routed)), [ork, database, *routed])


def ork() -> Row:
    app_nodes, proxies, clients, racks = keys(2), keys(2), keys(1), keys(2)
    access = OrkAccess.from_settings(app_nodes=app_nodes, proxies=proxies, clients=clients,
                                     is_rack=set(racks).__contains__)
    return Row(ork_reserved(access), [*app_nodes, *proxies, *clients, *racks])


def worker() -> Row:
    (ork,) = keys(1)
    settings = WorkerSettings(storage=STORAGE, ork=ork)
    return Row(worker_reserved(settings, AgentTable()), [ork])


def container_agent() -> Row:
    (worker,), relays, users = keys(1), keys(2), keys(2)
    config = agent_config(worker).model_copy(update={
        "relays": tuple(key.hex() for key in relays),
        "authorized_keys": tuple(key.hex() for key in users)})
    agent = Agent(config, KeyPair.generate())
    return Row(agent.swarm.host.is_reserved, [worker, *relays, *users])


def inference_agent() -> Row:
    (worker,), proxies = keys(1), keys(2)
    config = agent_config(worker).model_copy(update={
        "job_type": JobType.INFERENCE, "authorized_keys": tuple(key.hex() for key in proxies)})
    agent = Agent(config, KeyPair.generate())
    return Row(agent.swarm.host.is_reserved, [worker, *proxies])


def relay() -> Row:
    allowed = keys(3)
    server = RelayServer(KeyPair.generate(), RelayConfig(allow=frozenset(allowed)))
    return Row(server.host.is_reserved, allowed)


ROWS = {"wrk-monitor": monitor, "app-node": app_node, "proxy-inference": proxy,
        "wrk-ork": ork, "worker": worker, "container agent": container_agent,
        "inference agent": inference_agent, "relay": relay}


@pytest.mark.parametrize("build", ROWS.values(), ids=ROWS.keys())
def test_every_configured_peer_is_reserved_and_a_stranger_is_not(build):
    row = build()
    assert row.peers
    assert [key for key in row.peers if not row.is_reserved(key)] == []
    assert not any(row.is_reserved(key) for key in keys(8))


def test_every_role_of_wrk_monitor_is_a_setting_whose_keys_are_reserved():
    """A role added to the service's table is kept room for without another edit."""
    for role in ROLES:
        (key,) = keys(1)
        settings = MonitorSettings(storage=STORAGE, **{role: [key]})
        assert key in monitor_reserved(settings), role


def test_an_open_relay_keeps_no_reserve():
    server = RelayServer(KeyPair.generate(), RelayConfig(allow=None))
    assert not server.host.is_reserved(keys(1)[0])


# -- peers that change while the daemon runs --------------------------------------


def test_a_workers_agent_is_reserved_once_its_hello_binds_it_and_no_longer_once_forgotten():
    (ork, agent) = keys(2)
    table = AgentTable()
    reserved = worker_reserved(WorkerSettings(storage=STORAGE, ork=ork), table)
    config = agent_config(KeyPair.generate().public_key)
    vmi = vmi_of(config)
    table.expect(vmi)
    assert not reserved(agent)  # a new job's agent is a stranger until its hello
    table.hello(agent, Hello(job_id=config.job_id, replica=config.replica,
                             generation=config.generation, node_rank=config.node_rank,
                             token=config.report_token), now=0.0)
    assert reserved(agent)
    table.forget(vmi.name)  # the job was deleted
    assert not reserved(agent)
    assert reserved(ork)


def test_a_rack_registered_while_wrk_ork_runs_is_reserved():
    app_node, rack = keys(2)
    racks: set[bytes] = set()
    reserved = ork_reserved(OrkAccess.from_settings(app_nodes=[app_node],
                                                    is_rack=racks.__contains__))
    assert not reserved(rack)
    racks.add(rack)
    assert reserved(rack)
    racks.discard(rack)
    assert not reserved(rack)


def test_a_container_agents_shell_keys_follow_the_team_while_the_job_runs():
    (worker,), (member, joined) = keys(1), keys(2)
    config = agent_config(worker).model_copy(update={"authorized_keys": (member.hex(),)})
    agent = Agent(config, KeyPair.generate())
    assert agent.access is not None
    assert agent.swarm.host.is_reserved(member)
    assert not agent.swarm.host.is_reserved(joined)
    agent.access.update([joined.hex()], agent.access.version + 1)  # member left, one joined
    assert agent.swarm.host.is_reserved(joined)
    assert not agent.swarm.host.is_reserved(member)
    assert agent.swarm.host.is_reserved(worker)


def test_the_proxy_reserves_the_agents_of_the_jobs_it_routes_to_now():
    ork, database, agent = keys(3)
    routed: frozenset[bytes] = frozenset()
    reserved = proxy_reserved(ProxySettings(storage=STORAGE, ork=ork, database=database),
                              lambda: routed)
    assert not reserved(agent)
    routed = frozenset({agent})  # a job became routable (the pool's table is replaced)
    assert reserved(agent)
    routed = frozenset()
    assert not reserved(agent)


async def test_a_writer_admitted_while_the_database_runs_is_reserved(tmp_path):
    """app-node's and the proxy's replicas: the database service reserves its
    readers and writers, those it admits at run time too, and lets go when it ends."""
    reader, joiner, stranger = keys(3)
    swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1",
                                                         announce_key=False))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(swarm.run)
            service = await nursery.start(functools.partial(
                run_database_service, tmp_path / "db", swarm=swarm,
                readers=frozenset({reader}), fsync=FsyncPolicy.NEVER))
            assert swarm.host.is_reserved(swarm.keypair.public_key)  # its own writer
            assert swarm.host.is_reserved(reader)
            assert not swarm.host.is_reserved(joiner)
            await service.db.change_writer("add_writer", joiner)
            assert swarm.host.is_reserved(joiner)
            assert not swarm.host.is_reserved(stranger)
            nursery.cancel_scope.cancel()
    assert not swarm.host.is_reserved(reader)

