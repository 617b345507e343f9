"""One helper to start swarms and relays around a small in-process DHT.

:func:`memory_swarm_net` puts every DHT node, swarm and relay on its own host
of one :class:`~p2p.net.MemoryInternet` (tests run under the autojump clock,
in no real time); :func:`swarm_net` puts them on real sockets on 127.0.0.1
(for the tests where real sockets are the point). Tests use the same
:class:`SwarmNet` either way.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import trio

from p2p.connection import ConnectionConfig
from p2p.dht.testnet import Testnet, hosts_testnet, udp_testnet
from p2p.keys import KeyPair
from p2p.net import MemoryInternet, Network, SocketNetwork
from p2p.noise import SecretStreamConfig
from p2p.swarm import ChannelService, Swarm, SwarmConfig
from relay import RelayAddresses, run_relay

#: Fast timers for tests: dead peers are noticed in about a second. Only for
#: swarms whose peers all use them too: a peer's idle timeout must exceed the
#: other side's keep-alive interval (a relay on defaults sends one every 5 s).
FAST_STREAMS = ConnectionConfig(
    stream=SecretStreamConfig(keepalive_interval_s=0.25, idle_timeout_s=1.0)
)

#: Memory hosts: DHT nodes on 127.0.1.x, everything else from 127.0.2.1 on.
_DHT_HOSTS = "127.0.1.{}"
_FIRST_HOST = 2 << 8 | 1


@dataclass
class SwarmNet:
    dht: Testnet
    nursery: trio.Nursery
    #: The in-memory internet, or None on real sockets.
    internet: MemoryInternet | None = None
    swarms: list[Swarm] = field(default_factory=list)
    _scopes: dict[int, trio.CancelScope] = field(default_factory=dict)
    _hosts: int = 0

    @property
    def bootstrap(self) -> tuple[tuple[str, int], ...]:
        return tuple(self.dht.bootstrap)

    def host(self) -> tuple[str, Network]:
        """A machine to run something on: ``(its address, its network)``.

        In memory each call is a new host (127.0.2.1, 127.0.2.2, ...); on real
        sockets it is always 127.0.0.1.
        """
        if self.internet is None:
            return "127.0.0.1", SocketNetwork()
        number = _FIRST_HOST + self._hosts
        self._hosts += 1
        address = f"127.0.{number >> 8}.{number & 255}"
        return address, self.internet.host(address)

    def config(self, host: str = "127.0.0.1", **changes) -> SwarmConfig:
        base = SwarmConfig(host=host, bootstrap=self.bootstrap, lookup_max_s=2.0)
        return replace(base, **changes)

    async def start(self, keypair: KeyPair | None = None, **options) -> Swarm:
        """Start one more swarm on a new host; ``options`` go to Swarm() or to its config."""
        address, network = self.host()
        swarm_args = {k: options.pop(k) for k in ("services", "firewall") if k in options}
        handlers = options.pop("handlers", {})
        swarm_args["services"] = [*swarm_args.get("services", ()),
                                  *(ChannelService.of_handler(p, h) for p, h in handlers.items())]
        swarm = Swarm(keypair or KeyPair.generate(), config=self.config(address, **options),
                      network=network, **swarm_args)
        _, self._scopes[id(swarm)] = await self._start_scoped(swarm.run)
        self.swarms.append(swarm)
        return swarm

    def stop(self, swarm: Swarm) -> None:
        self._scopes.pop(id(swarm)).cancel()
        self.swarms.remove(swarm)

    async def start_relay(self, keypair: KeyPair, **options) -> tuple[RelayAddresses,
                                                                     trio.CancelScope]:
        """Start a relay (``run_relay``) on a new host, bootstrapped on the DHT;
        return where it listens and the scope that stops it."""
        address, network = self.host()
        bootstrap = options.pop("bootstrap", self.bootstrap)
        return await self._start_scoped(functools.partial(
            run_relay, keypair, host=address, port=0, bootstrap=bootstrap,
            network=network if self.internet is not None else None, **options))

    async def _start_scoped(self, run) -> tuple[object, trio.CancelScope]:
        """Start ``run`` in the net's nursery in a scope of its own: (what it
        reported started, the scope)."""
        scope = trio.CancelScope()

        async def go(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await run(task_status=task_status)

        return await self.nursery.start(go), scope


@asynccontextmanager
async def swarm_net(dht_nodes: int = 5) -> AsyncIterator[SwarmNet]:
    """Swarms on real sockets on 127.0.0.1 around a real-UDP DHT."""
    async with udp_testnet(dht_nodes) as dht, trio.open_nursery() as nursery:
        yield SwarmNet(dht, nursery)
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def memory_swarm_net(dht_nodes: int = 5, **internet_options) -> AsyncIterator[SwarmNet]:
    """Swarms on a :class:`MemoryInternet` (``internet_options`` go to it),
    one host each, around DHT nodes on hosts of the same internet.

    Needs trio's autojump clock (or a MockClock) to run in no real time.
    """
    internet = MemoryInternet(**internet_options)
    async with trio.open_nursery() as outer:
        await outer.start(internet.run)
        hosts = [internet.host(_DHT_HOSTS.format(n)) for n in range(1, dht_nodes + 1)]
        async with hosts_testnet(hosts, port=49737) as dht, trio.open_nursery() as nursery:
            yield SwarmNet(dht, nursery, internet)
            nursery.cancel_scope.cancel()
        outer.cancel_scope.cancel()
