"""One helper to start swarms on 127.0.0.1 around a small in-process DHT."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import trio

from p2p.connection import ConnectionConfig
from p2p.dht.testnet import Testnet, udp_testnet
from p2p.keys import KeyPair
from p2p.noise import SecretStreamConfig
from p2p.swarm import ChannelService, Swarm, SwarmConfig

#: Fast timers for tests: dead peers are noticed in about a second. Only for
#: swarms whose peers all use them too: a peer's idle timeout must exceed the
#: other side's keep-alive interval (a relay on defaults sends one every 5 s).
FAST_STREAMS = ConnectionConfig(
    stream=SecretStreamConfig(keepalive_interval_s=0.25, idle_timeout_s=1.0)
)


@dataclass
class SwarmNet:
    dht: Testnet
    nursery: trio.Nursery
    swarms: list[Swarm] = field(default_factory=list)
    _scopes: dict[int, trio.CancelScope] = field(default_factory=dict)

    @property
    def bootstrap(self) -> tuple[tuple[str, int], ...]:
        return tuple(self.dht.bootstrap)

    def config(self, **changes) -> SwarmConfig:
        base = SwarmConfig(host="127.0.0.1", bootstrap=self.bootstrap, lookup_max_s=2.0)
        return replace(base, **changes)

    async def start(self, keypair: KeyPair | None = None, **options) -> Swarm:
        """Start one more swarm; ``options`` go to Swarm() or to its config."""
        swarm_args = {k: options.pop(k) for k in ("services", "firewall", "network")
                      if k in options}
        handlers = options.pop("handlers", {})
        swarm_args["services"] = [*swarm_args.get("services", ()),
                                  *(ChannelService.of_handler(p, h) for p, h in handlers.items())]
        swarm = Swarm(keypair or KeyPair.generate(), config=self.config(**options),
                      **swarm_args)

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                self._scopes[id(swarm)] = scope
                await swarm.run(task_status=task_status)

        await self.nursery.start(run)
        self.swarms.append(swarm)
        return swarm

    def stop(self, swarm: Swarm) -> None:
        self._scopes.pop(id(swarm)).cancel()
        self.swarms.remove(swarm)


@asynccontextmanager
async def swarm_net(dht_nodes: int = 5) -> AsyncIterator[SwarmNet]:
    async with udp_testnet(dht_nodes) as dht, trio.open_nursery() as nursery:
        yield SwarmNet(dht, nursery)
        nursery.cancel_scope.cancel()
