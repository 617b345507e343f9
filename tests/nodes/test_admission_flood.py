"""Each kind of daemon keeps room for its configured peers while a stranger
floods it over real sockets on 127.0.0.1: 64 self-made
keys and 70 silent sockets, held on to (tests/flood.py), then a peer the
daemon's settings name gets a connection slot.

In-process and cheap: wrk-monitor as ``serve_monitor`` runs it, the shared
database's service as app-node and the proxy run it, a container job's agent
(its swarm, with a member who joined while the job runs) and the relay. wrk-ork
and the worker are flooded end to end in test_admission_daemons.py; which keys
each daemon reserves is tests/nodes/test_reserved_peers.py's table. Real time,
every wait bounded, no timed assert.
"""

from __future__ import annotations

import functools

import trio

from agents._agent import Agent
from crdt import run_database_service
from nodes.monitor.daemon import RunningMonitor, serve_monitor
from nodes.monitor.settings import MonitorSettings
from p2p.host import PeerHost
from p2p.keys import KeyPair
from p2p.log import FsyncPolicy
from p2p.swarm import Swarm, SwarmConfig
from relay import RelayConfig, RelayServer
from tests.agents.helpers import agent_config
from tests.flood import admitted, flood

LIMIT_S = 60


async def flooded(nursery: trio.Nursery, host: PeerHost, port: int) -> None:
    await flood(nursery, port, host.public_key.hex())


async def test_wrk_monitor_admits_its_proxies_and_workers_under_a_flood(tmp_path):
    """They were strangers before (only pushers and followers were reserved)."""
    peers = {role: KeyPair.generate() for role in ("pushers", "proxies", "workers",
                                                   "followers")}
    (tmp_path / "monitor").mkdir()
    settings = MonitorSettings(storage=tmp_path / "monitor", host="127.0.0.1", port=0,
                               http={"host": "127.0.0.1", "port": 0},
                               **{role: [key.public_key] for role, key in peers.items()})
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            monitor: RunningMonitor = await nursery.start(serve_monitor, settings)
            host, port = monitor.swarm.host, monitor.swarm_address[1]
            await flooded(nursery, host, port)
            for role, key in peers.items():
                assert await admitted(host, port, key), role
            nursery.cancel_scope.cancel()


async def test_the_shared_database_admits_its_readers_and_a_writer_added_since(tmp_path):
    """app-node's replica (and the proxy's): its readers were strangers before,
    and so was a writer admitted while it ran."""
    reader, writer = KeyPair.generate(), KeyPair.generate()
    swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1",
                                                         announce_key=False))
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            _host, port = await nursery.start(swarm.run)
            service = await nursery.start(functools.partial(
                run_database_service, tmp_path / "db", swarm=swarm,
                readers=frozenset({reader.public_key}), fsync=FsyncPolicy.NEVER))
            await flooded(nursery, swarm.host, port)
            await service.db.change_writer("add_writer", writer.public_key)
            assert await admitted(swarm.host, port, reader)
            assert await admitted(swarm.host, port, writer)
            nursery.cancel_scope.cancel()


async def test_a_container_agent_admits_a_member_who_joined_while_the_job_runs(tmp_path):
    worker, member, joined = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    config = agent_config(worker.public_key).model_copy(
        update={"authorized_keys": (member.public_key.hex(),)})
    agent = Agent(config, KeyPair.generate(), host="127.0.0.1")
    assert agent.access is not None
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            _host, port = await nursery.start(agent.swarm.run)
            await flooded(nursery, agent.swarm.host, port)
            agent.access.update([member.public_key.hex(), joined.public_key.hex()],
                                agent.access.version + 1)
            assert await admitted(agent.swarm.host, port, joined)
            assert await admitted(agent.swarm.host, port, worker)
            nursery.cancel_scope.cancel()


async def test_the_relay_admits_the_peers_of_its_allow_list(tmp_path):
    allowed = KeyPair.generate()
    server = RelayServer(KeyPair.generate(), RelayConfig(allow=frozenset({allowed.public_key}),
                                                         max_connections=64))
    with trio.fail_after(LIMIT_S):
        async with trio.open_nursery() as nursery:
            _host, port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
            await flooded(nursery, server.host, port)
            assert await admitted(server.host, port, allowed)
            nursery.cancel_scope.cancel()
