"""Start a network of DHT nodes in one process, for tests and benchmarks.

Like hyperdht's ``testnet.js``: one bootstrap node and N-1 nodes that joined
through it, all persistent, either on real UDP sockets (loopback IPv4 or IPv6),
on a :class:`~._transport.MemoryNetwork` (no sockets; loss and latency
configurable; runs under trio's autojump clock, so large N and long TTLs cost
no real time), or one node on each of some :class:`p2p.net.Network` hosts (a
``MemoryInternet``'s, next to swarms and relays on the same internet). Each node runs in its own
cancel scope, so a test can stop nodes to simulate churn.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from ._driver import DhtNode
from ._node import NodeConfig
from ._transport import LinkProfile, MemoryNetwork, UdpTransport

if TYPE_CHECKING:
    from ..net import Network

__all__ = ["Testnet", "hosts_testnet", "memory_testnet", "udp_testnet"]


@dataclass
class Testnet:
    """The running nodes; ``nodes[0]`` is the bootstrap node."""

    nodes: list[DhtNode]
    network: MemoryNetwork | None = None
    _scopes: dict[int, trio.CancelScope] = field(default_factory=dict)

    @property
    def bootstrap(self) -> list[tuple[str, int]]:
        return [self.nodes[0].address]

    def stop(self, node: DhtNode) -> None:
        """Stop one node at once (its socket closes; it answers no more)."""
        self._scopes[id(node)].cancel()


async def _start(nursery: trio.Nursery, net: Testnet, node: DhtNode) -> None:
    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            net._scopes[id(node)] = scope
            await node.run(task_status=task_status)

    await nursery.start(run)
    net.nodes.append(node)


@asynccontextmanager
async def memory_testnet(
    size: int,
    *,
    profile: LinkProfile | None = None,
    seed: int = 0,
    config: NodeConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> AsyncIterator[Testnet]:
    """``size`` nodes on an in-memory network; cancelled on exit.

    ``progress(built, size)`` is called after each node joined (large networks
    take minutes to build)."""
    network = MemoryNetwork(profile or LinkProfile(), seed=seed)
    net = Testnet([], network)
    async with trio.open_nursery() as nursery:
        await nursery.start(network.run)
        first = DhtNode(network.transport(), persistent=True, reachable=True, config=config,
                        rng=random.Random(seed))
        await _start(nursery, net, first)
        for index in range(1, size):
            node = DhtNode(network.transport(), bootstrap=net.bootstrap, persistent=True,
                           config=config, rng=random.Random(seed * 100_003 + index))
            await _start(nursery, net, node)
            if progress is not None:
                progress(index + 1, size)
        yield net
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def udp_testnet(
    size: int, *, host: str = "127.0.0.1", seed: int = 0, config: NodeConfig | None = None
) -> AsyncIterator[Testnet]:
    """``size`` nodes on real UDP sockets on ``host`` (loopback); cancelled on exit."""
    net = Testnet([])
    async with trio.open_nursery() as nursery:
        first = DhtNode(await UdpTransport.bind(host), persistent=True, reachable=True,
                        config=config,
                        rng=random.Random(seed))
        await _start(nursery, net, first)
        for index in range(1, size):
            node = DhtNode(await UdpTransport.bind(host), bootstrap=net.bootstrap,
                           persistent=True, config=config,
                           rng=random.Random(seed * 100_003 + index))
            await _start(nursery, net, node)
        yield net
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def hosts_testnet(
    hosts: Sequence[Network], *, port: int = 0, seed: int = 0, config: NodeConfig | None = None
) -> AsyncIterator[Testnet]:
    """One node on each of ``hosts`` (``p2p.net`` networks, such as a
    ``MemoryInternet``'s hosts, whose ``run`` the caller starts), bound on the
    wildcard at ``port`` (0: a free one); cancelled on exit."""
    net = Testnet([])
    async with trio.open_nursery() as nursery:
        for index, host in enumerate(hosts):
            transport = await host.bind_datagram("0.0.0.0", port)
            rng = random.Random(seed * 100_003 + index)
            if index == 0:
                node = DhtNode(transport, persistent=True, reachable=True, config=config, rng=rng)
            else:
                node = DhtNode(transport, bootstrap=net.bootstrap, persistent=True,
                               config=config, rng=rng)
            await _start(nursery, net, node)
        yield net
        nursery.cancel_scope.cancel()
