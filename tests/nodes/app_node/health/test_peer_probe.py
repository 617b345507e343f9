"""Probing daemons over real swarms on 127.0.0.1 (real time, bounded): wrk-ork answers
``service.status`` through ``PeerClient.status()``; a peer that does not know the
method answered (reachable, ``UNKNOWN_METHOD``); one that refuses app-node's key
answered too (``FORBIDDEN``); one nobody can reach is down within the timeout."""

from __future__ import annotations

import trio

from contracts.health import package_version
from contracts.monitor import PROTOCOL as MONITOR
from nodes.app_node.health import ServiceState, peer_target, probe, service_state
from nodes.kit.monitor_client import MonitorClient
from nodes.kit.ork_client import OrkClient
from nodes.ork.service import OrkService
from p2p.host import RpcService
from p2p.keys import KeyPair
from p2p.rpc import Router
from p2p.swarm import Swarm, SwarmConfig, UpkeepPolicy
from tests.nodes.ork.world import World

FAST = UpkeepPolicy(base_s=0.05, max_s=0.2, dial_timeout_s=2.0)


async def _serve(nursery: trio.Nursery, service) -> tuple[bytes, tuple[str, int]]:
    swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", port=0),
                  services=[service])
    address = await nursery.start(swarm.run)
    return swarm.keypair.public_key, address


async def test_peers_answer_refuse_or_stay_silent() -> None:
    me, world = KeyPair.generate(), World(nodes=(8,))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            swarm = Swarm(me, config=SwarmConfig(host="127.0.0.1", port=0))
            await nursery.start(swarm.run)
            ork_key, ork_address = await _serve(nursery, OrkService(
                world.orch, allow=lambda key: key == me.public_key, clock=lambda: world.now))
            strict_key, strict_address = await _serve(nursery, OrkService(
                world.orch, allow=lambda key: False))

            old_key, old_address = await _serve(nursery, RpcService(MONITOR, Router()))

            clients = [OrkClient(swarm, ork_key, addresses=[ork_address], backoff=FAST),
                       MonitorClient(swarm, old_key, addresses=[old_address], backoff=FAST),
                       OrkClient(swarm, strict_key, addresses=[strict_address], backoff=FAST),
                       OrkClient(swarm, KeyPair.generate().public_key, backoff=FAST)]
            for client in clients:
                await nursery.start(client.run)
            # The peers that answer get room for their first dial and handshake on a
            # busy machine; the unreachable one is timed to its 1 s.
            rows = [await probe(peer_target(c), timeout_s=1.0 if c is clients[-1] else 20.0)
                    for c in clients]
            nursery.cancel_scope.cancel()
    ork, old, strict, gone = rows
    assert ork.up and ork.service == "wrk-ork" and ork.version == package_version()
    assert ork.details["racks"] == 1 and ork.latency_ms is not None
    assert old.service == "wrk-monitor" and old.reachable and old.error.startswith(
        "UNKNOWN_METHOD")
    assert strict.reachable and strict.error.startswith("FORBIDDEN")
    assert not gone.reachable and gone.latency_ms >= 900
    now = ork.at + 1
    assert [service_state(r, now, 15.0) for r in rows] == [
        ServiceState.UP, ServiceState.ERROR, ServiceState.ERROR, ServiceState.DOWN]
