"""DHT nodes on a MemoryInternet's hosts: the firewall model is the one DHT reachability expects.

A node behind ``block_inbound`` gets replies to its own queries (the flow
lets them in) but not the probe its checker sends from another port, so it
stays ephemeral and unstored while an open node is stored.
"""

import random

import trio

from p2p.dht import DhtNode
from p2p.net import MemoryInternet

BOOT, WALLED, OPEN = "127.0.1.1", "127.0.2.1", "127.0.3.1"
OTHERS = [f"127.0.1.{n}" for n in range(2, 8)]


async def test_a_host_behind_block_inbound_stays_ephemeral_and_an_open_one_is_stored(
    autojump_clock,
):
    internet = MemoryInternet()
    internet.block_inbound(WALLED)
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            await nursery.start(internet.run)

            async def start(host, **options):
                transport = await internet.host(host).bind_datagram("0.0.0.0", 49737)
                node = DhtNode(transport, rng=random.Random(host), **options)
                await nursery.start(node.run)
                return node

            boot = await start(BOOT, persistent=True, reachable=True)
            others = [await start(h, bootstrap=[boot.address], persistent=True) for h in OTHERS]
            walled = await start(WALLED, bootstrap=[boot.address], persistent=True)
            open_node = await start(OPEN, bootstrap=[boot.address], persistent=True)

            assert all(node.persistent for node in [*others, open_node])
            assert not walled.persistent and walled.address == (WALLED, 49737)
            everyone = [boot, *others]
            stored = {c.address for node in everyone for c in node.core.routing.contacts()}
            assert open_node.address in stored
            assert walled.address not in stored
            # Its own queries still get their answers through the firewall.
            assert len(await walled.find_node(boot.core.node_id)) >= 5
            nursery.cancel_scope.cancel()
