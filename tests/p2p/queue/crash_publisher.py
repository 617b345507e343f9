"""A publisher killed with -9 by test_crash.py: many tasks publish to one queue end.

Prints ``opened <published>`` then, for every publish that returned,
``<position> <payload hex>``, flushed at once (what the test checks survives).
"""

from __future__ import annotations

import sys

import trio

from p2p.keys import KeyPair
from p2p.queue import DurableQueue, QueueConfig

PUBLISHER = KeyPair.from_seed(b"\x11" * 32)
CONSUMER = KeyPair.from_seed(b"\x12" * 32)


async def main(directory: str, round_: int) -> None:
    queue = await DurableQueue.open(directory, PUBLISHER, CONSUMER.public_key,
                                    config=QueueConfig())  # fsync ALWAYS
    print("opened", queue.statistics().published, flush=True)

    async def publisher(n: int) -> None:
        for i in range(1_000_000):
            payload = f"r{round_}-t{n}-{i}".encode()
            position = await queue.publish(f"job-{n}", payload)
            sys.stdout.write(f"{position} {payload.hex()}\n")
            sys.stdout.flush()

    async with trio.open_nursery() as nursery:
        for n in range(16):
            nursery.start_soon(publisher, n)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
