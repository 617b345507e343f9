"""A relay started without bootstrap nodes is a DHT others bootstrap from.

Regression: such a relay was a network of one that stored its own announce
nowhere, so a listener bootstrapped on it found no record of the relay's key
(``reservation_lost … NOT_FOUND``, 0 reservations after 45 s). Real UDP and
TCP on 127.0.0.1; every wait is on a condition, bounded.
"""

from __future__ import annotations

import functools

import pytest
import trio

import p2p.addresses
from p2p.dht import DhtNode, UdpTransport
from p2p.swarm import Swarm, SwarmConfig
from relay import run_relay

from ..p2p.helpers import BOB
from .helpers import RELAY as RELAY_KEY
from .helpers import control, reserve


async def find_relay(node: DhtNode):
    with trio.fail_after(15):
        # The announcer starts after run_relay reports started: look until it lands.
        while (record := await node.find_peer(RELAY_KEY.public_key)) is None:  # noqa: ASYNC110
            await trio.sleep(0.05)
    return record


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
async def test_a_relay_without_bootstrap_is_found_by_key_by_a_node_bootstrapped_on_it(
    nursery, monkeypatch, host
):
    # On a wildcard the relay also names its interface addresses; keep this
    # test's traffic on loopback.
    monkeypatch.setattr(p2p.addresses, "interface_addresses", lambda: [])
    started = await nursery.start(functools.partial(run_relay, RELAY_KEY, host=host, port=0))
    port = started.dht[1]
    client = DhtNode(await UdpTransport.bind("127.0.0.1"), bootstrap=[("127.0.0.1", port)])
    await nursery.start(client.run)
    record = await find_relay(client)
    assert list(record.addresses) == [("127.0.0.1", started.tcp[1])]
    with trio.fail_after(10):
        connection = await control(nursery, record.addresses[0], BOB)
        await reserve(nursery, connection)  # returns once the relay accepted it
    assert started.server.statistics().reservations == 1


async def test_a_listener_bootstrapped_on_a_standalone_relay_holds_a_reservation(nursery):
    started = await nursery.start(functools.partial(run_relay, RELAY_KEY, host="127.0.0.1",
                                                    port=0))
    swarm = Swarm(BOB, config=SwarmConfig(host="127.0.0.1", relays=(RELAY_KEY.public_key,),
                                          bootstrap=(started.dht,)))
    await nursery.start(swarm.run)
    with trio.fail_after(15):
        while RELAY_KEY.public_key not in swarm.reserved_relays:
            await swarm.reservations_changed.wait()
