"""The publisher test_real.py forks and kills with -9: many tasks publish to one queue end.

Writes ``opened <published>`` then, for every publish that returned,
``<position> <payload hex>``, each line flushed at once (what the test checks survives).
"""

from __future__ import annotations

from typing import TextIO

import trio

from p2p.keys import KeyPair
from p2p.queue import DurableQueue, QueueConfig

PUBLISHER = KeyPair.from_seed(b"\x11" * 32)
CONSUMER = KeyPair.from_seed(b"\x12" * 32)


async def _publish(directory: str, round_: int, out: TextIO) -> None:
    queue = await DurableQueue.open(directory, PUBLISHER, CONSUMER.public_key,
                                    config=QueueConfig())  # fsync ALWAYS
    print("opened", queue.statistics().published, file=out)

    async def publisher(n: int) -> None:
        for i in range(1_000_000):
            payload = f"r{round_}-t{n}-{i}".encode()
            position = await queue.publish(f"job-{n}", payload)
            print(f"{position} {payload.hex()}", file=out)

    async with trio.open_nursery() as nursery:
        for n in range(16):
            nursery.start_soon(publisher, n)


def publish_until_killed(directory: str, round_: int, out: TextIO) -> None:
    trio.run(_publish, directory, round_, out)
