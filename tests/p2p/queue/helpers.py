"""Two queue ends on two swarms, for the replication tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio.testing

from p2p.keys import KeyPair
from p2p.log import FsyncPolicy
from p2p.queue import DurableQueue, QueueConfig, QueueService
from p2p.swarm import Swarm

#: Tests do not need power-loss durability; NEVER keeps them quick on slow disks.
FAST = QueueConfig(fsync=FsyncPolicy.NEVER)


def mock_clock() -> trio.testing.MockClock:
    """The virtual clock, jumping only after 2 ms of real idleness: the queue
    works in threads (see tests/crdt/test_replication.py for why)."""
    return trio.testing.MockClock(autojump_threshold=0.002)


@dataclass
class End:
    """One daemon's shape: a swarm, the queue service on it, one queue to the peer."""

    keypair: KeyPair
    directory: Path
    swarm: Swarm
    service: QueueService
    queue: DurableQueue | None = None
    received: list = field(default_factory=list)

    async def reopen(self, peer: bytes, config: QueueConfig = FAST) -> DurableQueue:
        if self.queue is not None:
            self.service.detach(peer)
            await self.queue.aclose()
        self.queue = await DurableQueue.open(self.directory, self.keypair, peer, config=config)
        self.service.attach(self.queue)
        return self.queue


@asynccontextmanager
async def two_ends(net, tmp_path: Path, config: QueueConfig = FAST,
                   **swarm_options) -> AsyncIterator[tuple[End, End]]:
    """Ends ``a`` and ``b`` with a queue each to the other, connected."""
    ends = []
    for name in ("a", "b"):
        keypair = KeyPair.generate()
        service = QueueService()
        swarm = await net.start(keypair, services=[service], **swarm_options)
        ends.append(End(keypair, tmp_path / name, swarm, service))
    a, b = ends
    await a.reopen(b.keypair.public_key, config)
    await b.reopen(a.keypair.public_key, config)
    await a.swarm.connect(b.keypair.public_key, addresses=[b.swarm.address])
    try:
        yield a, b
    finally:
        for end in ends:
            if end.queue is not None:
                await end.queue.aclose()


async def drain(queue: DurableQueue, count: int, *, ack: bool = True) -> list:
    """The next ``count`` deliveries (acked, if ``ack``)."""
    out = []
    async with queue.deliveries() as receive:
        async for delivery in receive:
            out.append(delivery)
            if ack:
                await queue.ack(delivery.position)
            if len(out) == count:
                break
    return out
