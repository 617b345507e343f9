"""stay_connected: one named peer kept connected across its restarts and outages."""

from __future__ import annotations

import random

import trio

from p2p.keys import KeyPair
from p2p.swarm import UpkeepPolicy, stay_connected

from ..helpers import wait_until
from .helpers import FAST_STREAMS, memory_swarm_net

QUICK = UpkeepPolicy(base_s=0.1, max_s=1.0, proven_after_s=2.0, dial_timeout_s=3.0)


async def test_a_peer_that_restarts_is_connected_again_and_the_hook_runs_each_time(
        autojump_clock):
    server_key = KeyPair.generate()
    hooked: list[float] = []

    async def hook(connection) -> None:
        hooked.append(trio.current_time())
        await trio.sleep_forever()

    with trio.fail_after(60):
        async with memory_swarm_net() as net:
            server = await net.start(server_key, connection=FAST_STREAMS)
            client = await net.start(connection=FAST_STREAMS)
            await net.nursery.start(lambda task_status: stay_connected(
                client, server_key.public_key, on_connection=hook, backoff=QUICK,
                rng=random.Random(1), task_status=task_status))
            await wait_until(lambda: len(hooked) == 1)
            net.stop(server)
            await wait_until(lambda: server_key.public_key not in client.connections)
            await trio.sleep(3.0)  # down for a while: attempts fail and back off
            await net.start(server_key, connection=FAST_STREAMS)
            await wait_until(lambda: len(hooked) == 2, limit_s=20)
            assert server_key.public_key in client.connections


async def test_listed_addresses_are_tried_before_the_dht(autojump_clock):
    server_key = KeyPair.generate()
    with trio.fail_after(30):
        async with memory_swarm_net() as net:
            server = await net.start(server_key, announce_key=False)
            client = await net.start()
            address = server.address
            await net.nursery.start(lambda task_status: stay_connected(
                client, server_key.public_key, addresses=[address], backoff=QUICK,
                task_status=task_status))
            await wait_until(lambda: server_key.public_key in client.connections)
            assert client.connections[server_key.public_key].remote_address == address
