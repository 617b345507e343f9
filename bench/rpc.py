"""RPC benchmarks: round trips per second and CPU per call, 1 and 64 calls in flight.

The server (its own process, spawned) serves a 32-byte echo over TCP on
127.0.0.1 through the whole stack: secret stream, mux channel, RPC. Figures
(JSON lines): ``calls_per_s_1`` / ``calls_per_s_64`` (req/s, median of reps),
``latency_p50_1`` / ``latency_p99_1`` / ``latency_p50_64`` / ``latency_p99_64``
(ms), and ``cpu_us_per_call_1`` / ``cpu_us_per_call_64``: user + system CPU of
both processes together (``resource.getrusage(RUSAGE_SELF)`` in each; the
server reports its own through a second RPC method, read before and after each
rep) divided by the calls of the rep.

``trio_floor_cpu_us_per_round_trip``: the same round trip as a bare trio echo
over plain TCP (no encryption, framing or RPC) between two processes: what the
event loop itself costs, below which no trio stack goes.

Compare with @hyperswarm/rpc across two processes (../shared/anchors/holepunch,
``node rpc.js --procs 2``): about 7,500-13,500 req/s with 1 in flight and
75,000-80,000 with 64, at ~87 µs of CPU per call with 1 in flight.

The mux's busy poller is off unless ``--busy-poll SECONDS`` is given (both
processes then poll for that long after each write; see
``p2p/mux/_scheduling.py``). It is a benchmark-only setting: it trades a core's
worth of CPU for latency.

Then the same figures of @hyperswarm/rpc across two processes, run in the same
sitting from ../shared/anchors/holepunch (bench/_anchors.py; ``upstream_*``),
and ours as ratios to them (``*_ratio_to_upstream``).

usage: python bench/rpc.py [--reps 3] [--calls 3000] [--parallel-calls 20000]
                           [--busy-poll 0.0005] [--in-flight 1 64] [--no-upstream]
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import time

import pydantic
import trio
from _anchors import run_holepunch, upstream_figure
from _common import ChildServer, emit, machine, percentile, summary

PROTOCOL = "cosmicac/bench-rpc"
SERVER_SEED = b"\x02" * 32


class Blob(pydantic.BaseModel):
    data: bytes


class Nothing(pydantic.BaseModel):
    pass


class Cpu(pydantic.BaseModel):
    seconds: float


def cpu_seconds() -> float:
    """User + system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _methods():
    from p2p.rpc import Method

    return Method("echo", params=Blob, result=Blob), Method("cpu", params=Nothing, result=Cpu)


def _serve_floor(port_queue) -> None:
    """The floor: a bare trio echo over plain TCP (no encryption, framing or RPC)."""

    async def echo(stream: trio.SocketStream) -> None:
        while data := await stream.receive_some(65536):
            if data == b"cpu?":
                data = repr(cpu_seconds()).encode()
            await stream.send_all(data)

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port_queue.put(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(echo, listeners)

    trio.run(main)


async def _measure_floor(port: int, reps: int, total: int) -> list[float]:
    """CPU per round trip of both processes for a 32-byte trio echo, 1 in flight."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    payload = b"x" * 32

    async def server_cpu() -> float:
        await stream.send_all(b"cpu?")
        return float(await stream.receive_some(64))

    cpus = []
    for _ in range(200):  # warm-up
        await stream.send_all(payload)
        await stream.receive_some(65536)
    for _ in range(reps):
        server_before, client_before = await server_cpu(), cpu_seconds()
        for _ in range(total):
            await stream.send_all(payload)
            await stream.receive_some(65536)
        client_cpu = cpu_seconds() - client_before
        cpus.append((client_cpu + await server_cpu() - server_before) / total * 1e6)
    await stream.aclose()
    return cpus


def _connection_config(busy_poll_s: float):
    from p2p.connection import ConnectionConfig
    from p2p.mux import MuxConfig

    return ConnectionConfig(mux=MuxConfig(busy_poll_s=busy_poll_s))


def _serve(port_queue, busy_poll_s: float) -> None:
    from p2p.host import RpcService, serve_tcp
    from p2p.keys import KeyPair
    from p2p.rpc import Router

    echo_method, cpu_method = _methods()
    router = Router()

    # Declared inline (they never wait), as @hyperswarm/rpc's respond() handler
    # of the reference is a plain function: each runs in the reader as its
    # request is parsed.
    def echo(params: Blob, ctx) -> Blob:
        return params

    def cpu(params: Nothing, ctx) -> Cpu:
        return Cpu(seconds=cpu_seconds())

    router.add(echo_method, echo, inline=True)
    router.add(cpu_method, cpu, inline=True)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _host, port = await nursery.start(
                functools.partial(
                    serve_tcp, KeyPair.from_seed(SERVER_SEED),
                    services=[RpcService(PROTOCOL, router)],  # as a daemon serves it
                    config=_connection_config(busy_poll_s),
                )
            )
            port_queue.put(port)

    trio.run(main)


async def _measure(port: int, reps: int, total: int, in_flight: int, busy_poll_s: float):
    from p2p.connection import dial_tcp
    from p2p.keys import KeyPair
    from p2p.rpc import RpcClient

    echo, cpu = _methods()
    server_key = KeyPair.from_seed(SERVER_SEED).public_key
    connection = await dial_tcp(
        "127.0.0.1", port, KeyPair.generate(), server_key, config=_connection_config(busy_poll_s)
    )
    rates, p50s, p99s, cpus = [], [], [], []
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        channel = await connection.open_channel(PROTOCOL)
        client = RpcClient(channel)
        await nursery.start(client.run)
        payload = Blob(data=b"x" * 32)
        for _ in range(200):  # warm-up
            await client.call(echo, payload)
        for _ in range(reps):
            latencies: list[float] = []

            async def worker(count: int, latencies: list[float] = latencies) -> None:
                for _ in range(count):
                    start = time.perf_counter()
                    await client.call(echo, payload)
                    latencies.append(time.perf_counter() - start)

            server_before = (await client.call(cpu, Nothing())).seconds
            client_before = cpu_seconds()
            began = time.perf_counter()
            async with trio.open_nursery() as workers:
                for index in range(in_flight):
                    share = total // in_flight + (1 if index < total % in_flight else 0)
                    workers.start_soon(worker, share)
            elapsed = time.perf_counter() - began
            client_cpu = cpu_seconds() - client_before
            server_cpu = (await client.call(cpu, Nothing())).seconds - server_before
            rates.append(total / elapsed)
            p50s.append(percentile(latencies, 0.5) * 1000)
            p99s.append(percentile(latencies, 0.99) * 1000)
            cpus.append((client_cpu + server_cpu) / total * 1e6)
        await client.aclose()
        await connection.aclose()
        nursery.cancel_scope.cancel()
    return rates, p50s, p99s, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3000, help="calls per rep, 1 in flight")
    parser.add_argument("--parallel-calls", type=int, default=20000,
                        help="calls per rep, more than 1 in flight")
    parser.add_argument("--busy-poll", type=float, default=0.0, metavar="SECONDS",
                        help="mux busy-poll window after each write (default 0: off)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--no-upstream", action="store_true",
                        help="leave out @hyperswarm/rpc (bench/_anchors.py runs it)")
    args = parser.parse_args()
    with ChildServer(_serve_floor) as port:
        cpus = trio.run(_measure_floor, port, args.reps, args.calls)
        emit("rpc", "trio_floor_cpu_us_per_round_trip", summary(cpus)["median"], "us",
             **summary(cpus), how="a bare trio echo of 32 bytes over TCP 127.0.0.1 between two "
             "processes, 1 in flight: user+sys CPU of both per round trip (the event loop's "
             "own cost, under any stack built on it)")
    ours: dict[str, float] = {}
    with ChildServer(_serve, args.busy_poll) as port:
        for in_flight in args.in_flight:
            total = args.calls if in_flight == 1 else args.parallel_calls
            rates, p50s, p99s, cpus = trio.run(
                _measure, port, args.reps, total, in_flight, args.busy_poll
            )
            how = (f"32-byte echo, {in_flight} in flight, secret stream + mux + RPC over TCP "
                   f"127.0.0.1, server in a spawned process, busy_poll_s={args.busy_poll}")
            emit("rpc", f"calls_per_s_{in_flight}", summary(rates)["median"], "req/s",
                 **summary(rates), how=how, machine=machine())
            emit("rpc", f"latency_p50_{in_flight}", summary(p50s)["median"], "ms")
            emit("rpc", f"latency_p99_{in_flight}", summary(p99s)["median"], "ms")
            emit("rpc", f"cpu_us_per_call_{in_flight}", summary(cpus)["median"], "us",
                 **summary(cpus), how="user+sys CPU of client and server processes / calls")
            ours[f"calls_per_s_{in_flight}"] = summary(rates)["median"]
            ours[f"cpu_us_per_call_{in_flight}"] = summary(cpus)["median"]
    if not args.no_upstream:
        _upstream(args, ours)


def _upstream(args: argparse.Namespace, ours: dict[str, float]) -> None:
    """@hyperswarm/rpc across two processes, in this sitting, and ours over it.

    Its CPU per call is the difference of two runs that differ only in how
    many calls they make (start-up, the test network and warm-up cancel out).
    """
    seq, pipe, reps = args.calls, args.parallel_calls, str(args.reps)
    runs = {}
    for name, (s, p) in {"base": (seq, pipe), "fewer_seq": (seq // 4, pipe),
                         "fewer_pipe": (seq, pipe // 4)}.items():
        got = run_holepunch("rpc.js", "--procs", "2", "--reps", reps, "--seq", str(s),
                            "--pipe", str(p), "--inflight", "64")
        if isinstance(got, str):
            print(json.dumps({"bench": "rpc", "metric": "upstream", "skipped": got}), flush=True)
            return
        runs[name] = got
    figures, base_cpu = runs["base"]
    upstream = {
        "calls_per_s_1": upstream_figure(figures, "rpc sequential throughput"),
        "latency_p50_1": upstream_figure(figures, "rpc sequential latency p50"),
        "calls_per_s_64": upstream_figure(figures, "rpc throughput (64 in flight)"),
        "cpu_us_per_call_1": (base_cpu - runs["fewer_seq"][1]) / (args.reps * (seq - seq // 4))
        * 1e6,
        "cpu_us_per_call_64": (base_cpu - runs["fewer_pipe"][1])
        / (args.reps * (pipe - pipe // 4)) * 1e6,
    }
    how = ("@hyperswarm/rpc over hyperdht (UDX + secret-stream + protomux), server in a "
           "child process, ../shared/anchors/holepunch rpc.js; CPU per call from two runs "
           "differing only in their number of calls")
    for metric, value in upstream.items():
        if value is None:
            continue
        unit = {"calls": "req/s", "latency": "ms", "cpu": "us"}[metric.split("_")[0]]
        emit("rpc", f"upstream_{metric}", value, unit, how=how)
    for metric in ("calls_per_s_1", "calls_per_s_64"):
        if upstream[metric] and metric in ours:
            emit("rpc", f"{metric}_ratio_to_upstream", ours[metric] / upstream[metric], "x",
                 better="higher")
    for metric in ("cpu_us_per_call_1", "cpu_us_per_call_64"):
        if upstream[metric] and upstream[metric] > 0 and metric in ours:
            emit("rpc", f"{metric}_ratio_to_upstream", ours[metric] / upstream[metric], "x",
                 better="lower")


if __name__ == "__main__":
    main()
