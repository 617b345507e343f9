"""Secret-stream benchmarks: throughput against raw trio TCP, and handshake latency.

Figures (JSON lines): ``throughput`` and ``raw_tcp_throughput`` in MB/s (1 GiB
one way in 64 KiB writes over 127.0.0.1, the receiver in a spawned process,
timed from the first write to a 1-byte ack, as the upstream anchors are), and
``handshake_p50``/``handshake_p99`` in ms (TCP connect to an open stream, 200
sequential connections to a responder in another process).

usage: python bench/stream.py [--mib 1024] [--reps 3] [--handshakes 200]
"""

from __future__ import annotations

import argparse
import time

import trio
from _common import ChildServer, emit, machine, percentile, receive_and_ack, send_and_time, summary

CHUNK = 64 * 1024
ACK = b"\x01"


def _serve(port_queue, mode: str, total: int) -> None:
    from p2p.keys import KeyPair
    from p2p.noise import SecretStream

    keypair = KeyPair.from_seed(b"\x01" * 32)

    async def handle(raw: trio.SocketStream) -> None:
        stream = raw if mode == "raw" else await SecretStream.responder(raw, keypair)
        if mode == "handshake":
            await stream.aclose()
            return
        if not await receive_and_ack(stream, total, ACK):
            return
        await stream.receive_some(1)
        await stream.aclose()

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port_queue.put(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(handle, listeners)

    trio.run(main)


async def _throughput_once(port: int, mode: str, total: int) -> float:
    from p2p.keys import KeyPair
    from p2p.noise import SecretStream

    raw = await trio.open_tcp_stream("127.0.0.1", port)
    if mode == "raw":
        stream = raw
    else:
        server_key = KeyPair.from_seed(b"\x01" * 32).public_key
        stream = await SecretStream.initiator(raw, KeyPair.generate(), server_key)
    return await send_and_time(stream, total, b"\x07" * CHUNK, ACK)


def throughput(mode: str, mib: int, reps: int) -> list[float]:
    total = mib * 1024 * 1024
    with ChildServer(_serve, mode, total) as port:
        return [trio.run(_throughput_once, port, mode, total) for _ in range(reps)]


def handshakes(count: int) -> list[float]:
    from p2p.keys import KeyPair
    from p2p.noise import SecretStream

    client_key = KeyPair.generate()
    server_key = KeyPair.from_seed(b"\x01" * 32).public_key

    async def run(port: int) -> list[float]:
        samples = []
        for index in range(count + 10):
            start = time.perf_counter()
            raw = await trio.open_tcp_stream("127.0.0.1", port)
            stream = await SecretStream.initiator(raw, client_key, server_key)
            elapsed = time.perf_counter() - start
            await stream.aclose()
            if index >= 10:  # warm-up, as the upstream anchor does
                samples.append(elapsed * 1000)
        return samples

    with ChildServer(_serve, "handshake", 0) as port:
        return trio.run(run, port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--handshakes", type=int, default=200)
    args = parser.parse_args()
    how = f"{args.mib} MiB one way in 64 KiB writes, receiver in a spawned process, to 1-byte ack"
    raw = throughput("raw", args.mib, args.reps)
    emit("stream", "raw_tcp_throughput", summary(raw)["median"], "MB/s", **summary(raw),
         how=how, machine=machine())
    secret = throughput("secret", args.mib, args.reps)
    ratio = summary(secret)["median"] / summary(raw)["median"]
    emit("stream", "throughput", summary(secret)["median"], "MB/s", **summary(secret),
         ratio_to_raw_tcp=round(ratio, 3), how=how, machine=machine())
    samples = handshakes(args.handshakes)
    emit("stream", "handshake_p50", percentile(samples, 0.5), "ms", n=len(samples),
         how="TCP connect to open stream, responder in a spawned process")
    emit("stream", "handshake_p99", percentile(samples, 0.99), "ms", n=len(samples))


if __name__ == "__main__":
    main()
