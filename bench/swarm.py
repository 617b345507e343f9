"""Swarm benchmarks: join-to-connection and connect-by-key, direct and relayed.

Figures (JSON lines), over fresh pairs of swarms on a local DHT (5 UDP nodes on
127.0.0.1) with a blind relay in the same process:
* ``join_to_connection_ms_direct`` / ``_relayed``: p50 (and p99) from a
  client's ``join(topic)`` to its first connection, the server having
  announced already (relayed: the server lists only its relay, no address);
* ``connect_by_key_ms_direct`` / ``_relayed``: ``connect(public_key)`` from a
  fresh swarm, DHT lookup included;
* ``simultaneous_join_ms``: two swarms that join the same topic at the same
  instant, to their connection (upstream never connects them: each lookup ends
  before the other's announce is stored, and the next look is 10 minutes away).

Upstream hyperswarm on this machine: about 3.8 ms join-to-connection; connection
set-up 5 ms direct, 15 ms relayed. Targets: p50 <= 10 ms once announced; two
simultaneous joiners within 2 s; relayed set-up <= 15 ms.

usage: python bench/swarm.py [--pairs 10]
"""

from __future__ import annotations

import argparse
import functools
import logging

import trio
from _common import emit, machine, percentile


async def run(pairs: int) -> None:
    from p2p.dht.testnet import udp_testnet
    from p2p.keys import KeyPair, derive_topic
    from p2p.swarm import Swarm, SwarmConfig
    from relay import run_relay

    async with udp_testnet(5) as dht, trio.open_nursery() as nursery:
        relay_key = KeyPair.generate()
        await nursery.start(functools.partial(
            run_relay, relay_key, host="127.0.0.1", port=0, bootstrap=dht.bootstrap
        ))
        base = SwarmConfig(host="127.0.0.1", bootstrap=tuple(dht.bootstrap))

        async def start(config: SwarmConfig, on_connection=None) -> tuple[Swarm, trio.CancelScope]:
            from p2p.host import Service

            class Hook(Service):
                protocol = "bench-hook/1"

                async def on_connection(self, connection):
                    await on_connection(connection)

            services = [Hook()] if on_connection is not None else []
            swarm = Swarm(KeyPair.generate(), config=config, services=services)
            scope = trio.CancelScope()

            async def go(task_status=trio.TASK_STATUS_IGNORED):
                with scope:
                    await swarm.run(task_status=task_status)

            await nursery.start(go)
            return swarm, scope

        async def server(relayed: bool) -> tuple[Swarm, trio.CancelScope]:
            config = base
            if relayed:
                from dataclasses import replace

                config = replace(base, relays=(relay_key.public_key,), announce_addresses=())
            swarm, scope = await start(config)
            if relayed:
                while relay_key.public_key not in swarm.reserved_relays:
                    await swarm.reservations_changed.wait()
            return swarm, scope

        for path in ("direct", "relayed"):
            joins, connects = [], []
            for n in range(pairs):
                topic = derive_topic("bench", f"{path}-{n}")
                host, host_scope = await server(path == "relayed")
                host.join(topic, server=True, client=False)
                await host.flush()
                first = trio.Event()
                client, client_scope = await start(base, lambda c, first=first: _set(first))
                start_time = trio.current_time()
                client.join(topic, server=False, client=True)
                await first.wait()
                joins.append((trio.current_time() - start_time) * 1000)
                dialer, dialer_scope = await start(base)
                start_time = trio.current_time()
                connection = await dialer.connect(host.public_key)
                connects.append((trio.current_time() - start_time) * 1000)
                assert connection.relayed == (path == "relayed")
                for scope in (host_scope, client_scope, dialer_scope):
                    scope.cancel()
            for name, values in (("join_to_connection_ms", joins),
                                 ("connect_by_key_ms", connects)):
                emit("swarm", f"{name}_{path}", percentile(values, 0.5), "ms",
                     p99=round(percentile(values, 0.99), 3), n=len(values))

        together = []
        for n in range(max(3, pairs // 3)):
            topic = derive_topic("bench", f"together-{n}")
            met = trio.Event()
            (a, a_scope), (b, b_scope) = (await start(base, lambda c, met=met: _set(met)),
                                          await start(base))
            start_time = trio.current_time()
            a.join(topic)
            b.join(topic)
            await met.wait()
            together.append((trio.current_time() - start_time) * 1000)
            a_scope.cancel()
            b_scope.cancel()
        emit("swarm", "simultaneous_join_ms", percentile(together, 0.5), "ms",
             max=round(max(together), 3), n=len(together))
        nursery.cancel_scope.cancel()


async def _set(event: trio.Event) -> None:
    event.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args()
    logging.disable(logging.INFO)
    emit("swarm", "machine", 0, "-", machine=machine())
    trio.run(run, args.pairs)


if __name__ == "__main__":
    main()
