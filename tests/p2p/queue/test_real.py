"""Real sockets and real processes: two swarms on 127.0.0.1, and kill -9 mid-publish.

These wait on conditions with bounded overall timeouts (real time is the point).
"""

from __future__ import annotations

import functools
import random
import time

import trio

from p2p.queue import QueueConfig, QueueService
from tests.forked import forked
from tests.p2p.queue.crash_publisher import CONSUMER, PUBLISHER, publish_until_killed
from tests.p2p.queue.helpers import End, drain, two_ends
from tests.p2p.swarm.helpers import swarm_net


async def test_two_swarms_on_real_sockets_with_fsync(tmp_path):
    with trio.fail_after(30):
        async with swarm_net(3) as net, two_ends(net, tmp_path, QueueConfig()) as (a, b):
            async with trio.open_nursery() as nursery:
                for job in range(4):
                    async def publish(job=job):
                        for i in range(50):
                            await a.queue.publish(f"job-{job}", b"%d" % i)
                    nursery.start_soon(publish)
                got = await drain(b.queue, 200)
            assert [d.position for d in got] == list(range(1, 201))
            for job in range(4):
                assert [int(d.payload) for d in got if d.key == f"job-{job}"] == list(range(50))
            await a.queue.wait_peer_acked(200)


def test_kill_9_mid_publish_loses_no_returned_position(tmp_path):
    """Kill the publisher process 8 times while 16 tasks publish; every position
    publish() returned (printed at once) is then delivered to a consumer, with
    its payload, over real sockets."""
    rng = random.Random(7)
    returned: dict[int, bytes] = {}
    directory = tmp_path / "publisher"
    for round_ in range(8):
        publish = functools.partial(publish_until_killed, str(directory), round_)
        with forked(publish) as child:
            opened = int(child.lines.readline().split()[1])
            assert opened >= max(returned, default=0)
            deadline = time.monotonic() + 10
            for _ in range(rng.randint(5, 300)):
                line = child.lines.readline()
                assert line and time.monotonic() < deadline, "the publisher stalled"
                position, payload = line.split()
                returned[int(position)] = bytes.fromhex(payload)
        # (forked() ended it with SIGKILL while other tasks were mid-publish)
    assert len(returned) > 40

    async def deliver():
        with trio.fail_after(60):
            async with swarm_net(3) as net:
                ends = []
                for keypair, name in ((PUBLISHER, "publisher"), (CONSUMER, "consumer")):
                    service = QueueService()
                    swarm = await net.start(keypair, services=[service])
                    ends.append(End(keypair, tmp_path / name, swarm, service))
                publisher, consumer = ends
                await publisher.reopen(CONSUMER.public_key, QueueConfig())
                await consumer.reopen(PUBLISHER.public_key, QueueConfig())
                try:
                    await publisher.swarm.connect(CONSUMER.public_key,
                                                  addresses=[consumer.swarm.address])
                    total = publisher.queue.statistics().published
                    assert total >= max(returned)
                    got = await drain(consumer.queue, total)
                    return {d.position: d.payload for d in got}
                finally:
                    for end in ends:
                        await end.queue.aclose()

    delivered = trio.run(deliver)
    for position, payload in returned.items():
        assert delivered[position] == payload
