"""RPC benchmarks: round trips per second with 1 and with 64 calls in flight.

The server (its own process, spawned) serves a 32-byte echo over TCP on
127.0.0.1 through the whole stack: secret stream, mux channel, RPC. Figures
(JSON lines): ``calls_per_s_1`` / ``calls_per_s_64`` (req/s, median of reps)
and ``latency_p50_1`` / ``latency_p99_1`` / ``latency_p50_64`` /
``latency_p99_64`` (ms). Compare with @hyperswarm/rpc across two processes:
about 7,500 req/s with 1 in flight and 75,000 with 64.

usage: python bench/rpc.py [--reps 3] [--calls 3000] [--parallel-calls 20000]
"""

from __future__ import annotations

import argparse
import time

import pydantic
import trio
from _common import ChildServer, emit, machine, percentile, summary

PROTOCOL = "cosmicac/bench-rpc"
SERVER_SEED = b"\x02" * 32


class Blob(pydantic.BaseModel):
    data: bytes


def _echo_method():
    from p2p.rpc import Method

    return Method("echo", params=Blob, result=Blob)


def _serve(port_queue) -> None:
    from p2p.host import serve_tcp
    from p2p.keys import KeyPair
    from p2p.rpc import Router, serve_rpc

    router = Router()

    async def echo(params: Blob, ctx) -> Blob:
        return params

    router.add(_echo_method(), echo)

    async def serve(channel) -> None:
        await serve_rpc(channel, router)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _host, port = await nursery.start(
                serve_tcp, KeyPair.from_seed(SERVER_SEED), {PROTOCOL: serve}
            )
            port_queue.put(port)

    trio.run(main)


async def _measure(port: int, reps: int, calls: int, parallel_calls: int, in_flight: int):
    from p2p.connection import dial_tcp
    from p2p.keys import KeyPair
    from p2p.rpc import RpcClient

    echo = _echo_method()
    server_key = KeyPair.from_seed(SERVER_SEED).public_key
    connection = await dial_tcp("127.0.0.1", port, KeyPair.generate(), server_key)
    rates, p50s, p99s = [], [], []
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        channel = await connection.open_channel(PROTOCOL)
        client = RpcClient(channel)
        await nursery.start(client.run)
        payload = Blob(data=b"x" * 32)
        for _ in range(50):  # warm-up
            await client.call(echo, payload)
        total = calls if in_flight == 1 else parallel_calls
        for _ in range(reps):
            latencies: list[float] = []

            async def worker(count: int, latencies: list[float] = latencies) -> None:
                for _ in range(count):
                    start = time.perf_counter()
                    await client.call(echo, payload)
                    latencies.append(time.perf_counter() - start)

            began = time.perf_counter()
            async with trio.open_nursery() as workers:
                for index in range(in_flight):
                    share = total // in_flight + (1 if index < total % in_flight else 0)
                    workers.start_soon(worker, share)
            elapsed = time.perf_counter() - began
            rates.append(total / elapsed)
            p50s.append(percentile(latencies, 0.5) * 1000)
            p99s.append(percentile(latencies, 0.99) * 1000)
        await client.aclose()
        await connection.aclose()
        nursery.cancel_scope.cancel()
    return rates, p50s, p99s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000, help="calls per rep, 1 in flight")
    parser.add_argument("--parallel-calls", type=int, default=20000,
                        help="calls per rep, 64 in flight")
    args = parser.parse_args()
    with ChildServer(_serve) as port:
        for in_flight in (1, 64):
            rates, p50s, p99s = trio.run(
                _measure, port, args.reps, args.calls, args.parallel_calls, in_flight
            )
            how = (f"32-byte echo, {in_flight} in flight, secret stream + mux + RPC over TCP "
                   "127.0.0.1, server in a spawned process")
            emit("rpc", f"calls_per_s_{in_flight}", summary(rates)["median"], "req/s",
                 **summary(rates), how=how, machine=machine())
            emit("rpc", f"latency_p50_{in_flight}", summary(p50s)["median"], "ms")
            emit("rpc", f"latency_p99_{in_flight}", summary(p99s)["median"], "ms")


if __name__ == "__main__":
    main()
