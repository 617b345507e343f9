"""Blind relay benchmarks: relayed against direct throughput, set-up time, relay memory.

Three processes: the relay (spawned), the target peer (spawned; it keeps a
reservation on the relay and also listens directly) and this one, the dialer.
Figures (JSON lines):

- ``direct_throughput`` / ``relayed_throughput`` (MB/s): ``--mib`` MiB one way
  over a secret stream in 64 KiB writes, timed from the first write to a
  1-byte ack, as bench/stream.py does; direct to the target's TCP port and
  through the relay, alternately. ``relayed_throughput`` carries
  ``ratio_to_direct``.
- ``relay_cpu_per_gb`` (s/GB): the relay process's CPU time per GB it
  forwarded during those runs.
- ``setup_p50`` / ``setup_p99`` (ms): a relayed connection from nothing to an
  open secret stream (``dial_via_relay``: pair over the existing control
  connection, attach, end-to-end handshake), ``--setups`` times in a row.
- ``relay_rss_baseline`` / ``relay_rss_idle_pairs`` / ``relay_rss_streaming_pairs``
  (MB, VmRSS of the relay process from /proc): after start with the two
  control connections, with ``--idle-pairs`` open idle pairs, and at the peak
  while ``--streaming-pairs`` pairs send at once for ``--stream-seconds``
  (that line also gives their aggregate MB/s).

Targets: relayed >= 200 MB/s and >= 0.5x direct; set-up <= 15 ms;
1,000 idle pairs within 200 MB of relay RSS.

usage: python bench/relay.py [--mib 256] [--reps 3] [--setups 200]
                             [--idle-pairs 1000] [--streaming-pairs 100]
                             [--stream-seconds 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import time

import trio
from _common import ChildServer, emit, machine, percentile, receive_and_ack, send_and_time, summary

# `import relay` below means the project's relay package: _common put the
# project root ahead of bench/ on sys.path (this file is bench/relay.py).

RELAY_SEED = b"\x03" * 32
TARGET_SEED = b"\x04" * 32
DIALER_SEED = b"\x05" * 32
CHUNK = 64 * 1024
ACK = b"\x01"
#: First byte the dialer sends on each connection: what the target does with it.
SINK, IDLE, STREAM = b"T", b"I", b"S"


def _lift_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _serve_relay(queue, max_pairs: int) -> None:
    from p2p.keys import KeyPair
    from relay import RelayConfig, RelayServer

    _lift_fd_limit()
    # A capacity benchmark: one dialer holds every pairing with one target, so
    # the fairness limit per (dialer, target) is lifted with the others.
    config = RelayConfig(max_pairs_per_key=max_pairs, max_pairs=max_pairs,
                         max_pairs_per_dialer_target=max_pairs,
                         max_pending_pairs=max_pairs, max_connections=4 * max_pairs)

    async def main() -> None:
        server = RelayServer(KeyPair.from_seed(RELAY_SEED), config)
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
            queue.put((port, os.getpid()))

    trio.run(main)


def _serve_target(queue, relay_port: int) -> None:
    from p2p.connection import dial_tcp
    from p2p.keys import KeyPair
    from p2p.noise import SecretStream
    from p2p.relay import accept_via_relay, keep_reservation

    _lift_fd_limit()
    keypair = KeyPair.from_seed(TARGET_SEED)
    relay_key = KeyPair.from_seed(RELAY_SEED).public_key
    relay_address = ("127.0.0.1", relay_port)

    async def serve(stream) -> None:
        try:
            command = await stream.receive_some(1)
            if command == SINK:
                header = b""
                while len(header) < 8:
                    header += await stream.receive_some(8 - len(header))
                total = int.from_bytes(header, "big")
                if not await receive_and_ack(stream, total, ACK):
                    return
            # IDLE and STREAM: read (and drop) until the dialer closes.
            while await stream.receive_some(256 * 1024):
                pass
        except trio.BrokenResourceError:
            pass
        finally:
            await trio.aclose_forcefully(stream)

    async def main() -> None:
        connection = await dial_tcp(*relay_address, keypair, relay_key)
        async with trio.open_nursery() as nursery:
            await nursery.start(connection.run)

            async def accept(incoming) -> None:
                relayed = await accept_via_relay(relay_address, incoming, keypair)
                await serve(relayed.stream)

            await nursery.start(keep_reservation, connection,
                                lambda incoming: nursery.start_soon(accept, incoming))

            async def direct(raw) -> None:
                await serve(await SecretStream.responder(raw, keypair))

            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            queue.put(listeners[0].socket.getsockname()[1])
            await trio.serve_listeners(direct, listeners)

    trio.run(main)


class Dialer:
    """This process's side: a control connection to the relay, streams to the target."""

    def __init__(self, relay_port: int, target_port: int) -> None:
        from p2p.keys import KeyPair

        self.keypair = KeyPair.from_seed(DIALER_SEED)
        self.target_key = KeyPair.from_seed(TARGET_SEED).public_key
        self.relay_key = KeyPair.from_seed(RELAY_SEED).public_key
        self.relay_address = ("127.0.0.1", relay_port)
        self.target_port = target_port
        self.control = None

    async def open_control(self, nursery: trio.Nursery) -> None:
        from p2p.connection import dial_tcp

        self.control = await dial_tcp(*self.relay_address, self.keypair, self.relay_key)
        await nursery.start(self.control.run)

    async def relayed(self):
        from p2p.relay import dial_via_relay

        connection = await dial_via_relay(self.control, self.relay_address, self.keypair,
                                          self.target_key)
        return connection.stream

    async def direct(self):
        from p2p.noise import SecretStream

        raw = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        return await SecretStream.initiator(raw, self.keypair, self.target_key)


async def _send_one(dialer: Dialer, relayed: bool, total: int) -> float:
    stream = await (dialer.relayed() if relayed else dialer.direct())
    await stream.send_all(SINK + total.to_bytes(8, "big"))
    return await send_and_time(stream, total, b"\x07" * CHUNK, ACK)


async def _throughput(
    dialer: Dialer, relay_pid: int, total: int, reps: int
) -> tuple[list[float], list[float], float]:
    # Direct and relayed runs alternate, so a busy neighbour on the machine
    # slows both alike instead of skewing the ratio.
    direct, relayed = [], []
    relay_cpu = 0.0
    async with trio.open_nursery() as nursery:
        await dialer.open_control(nursery)
        for _ in range(reps):
            direct.append(await _send_one(dialer, False, total))
            before = _cpu_s(relay_pid)
            relayed.append(await _send_one(dialer, True, total))
            relay_cpu += _cpu_s(relay_pid) - before
        nursery.cancel_scope.cancel()
    return direct, relayed, relay_cpu / (reps * total / 1e9)


async def _setups(dialer: Dialer, count: int) -> list[float]:
    samples = []
    async with trio.open_nursery() as nursery:
        await dialer.open_control(nursery)
        for index in range(count + 10):
            start = time.perf_counter()
            stream = await dialer.relayed()
            elapsed = time.perf_counter() - start
            await stream.aclose()
            if index >= 10:  # warm-up, as bench/stream.py's handshakes
                samples.append(elapsed * 1000)
        nursery.cancel_scope.cancel()
    return samples


async def _open_pairs(dialer: Dialer, count: int, command: bytes, parallel: int = 32) -> list:
    streams = []
    limiter = trio.CapacityLimiter(parallel)

    async def one() -> None:
        async with limiter:
            stream = await dialer.relayed()
            await stream.send_all(command)
            streams.append(stream)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return streams


async def _memory(dialer: Dialer, relay_pid: int, idle_pairs: int, streaming_pairs: int,
                  seconds: float) -> dict:
    figures = {}
    async with trio.open_nursery() as nursery:
        await dialer.open_control(nursery)
        await trio.sleep(0.2)
        figures["baseline"] = _rss_mb(relay_pid)

        idle = await _open_pairs(dialer, idle_pairs, IDLE)
        await trio.sleep(0.5)
        figures["idle"] = _rss_mb(relay_pid)
        figures["idle_pairs"] = len(idle)
        for stream in idle:
            await trio.aclose_forcefully(stream)
        await trio.sleep(0.5)

        streams = await _open_pairs(dialer, streaming_pairs, STREAM)
        chunk = b"\x09" * CHUNK
        sent = [0]
        peak = [0.0]
        deadline = trio.current_time() + seconds

        async def pump(stream) -> None:
            while trio.current_time() < deadline:
                await stream.send_all(chunk)
                sent[0] += CHUNK

        async def sample() -> None:
            while trio.current_time() < deadline:
                peak[0] = max(peak[0], _rss_mb(relay_pid))
                await trio.sleep(0.1)

        start = time.perf_counter()
        async with trio.open_nursery() as pumps:
            pumps.start_soon(sample)
            for stream in streams:
                pumps.start_soon(pump, stream)
        figures["streaming_MBps"] = sent[0] / 1e6 / (time.perf_counter() - start)
        figures["streaming"] = peak[0]
        figures["streaming_pairs"] = len(streams)
        for stream in streams:
            await trio.aclose_forcefully(stream)
        nursery.cancel_scope.cancel()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--setups", type=int, default=200)
    parser.add_argument("--idle-pairs", type=int, default=1000)
    parser.add_argument("--streaming-pairs", type=int, default=100)
    parser.add_argument("--stream-seconds", type=float, default=3.0)
    args = parser.parse_args()
    _lift_fd_limit()
    total = args.mib * 1024 * 1024
    max_pairs = max(args.idle_pairs, args.streaming_pairs) + 64
    with ChildServer(_serve_relay, max_pairs) as (relay_port, relay_pid), \
            ChildServer(_serve_target, relay_port) as target_port:
        dialer = Dialer(relay_port, target_port)
        how = (f"{args.mib} MiB one way in 64 KiB writes over a secret stream, to a 1-byte "
               f"ack; dialer, relay and target in 3 processes on 127.0.0.1")
        direct, relayed, cpu_per_gb = trio.run(_throughput, dialer, relay_pid, total,
                                               args.reps)
        emit("relay", "direct_throughput", summary(direct)["median"], "MB/s", **summary(direct),
             how=how, machine=machine())
        ratio = summary(relayed)["median"] / summary(direct)["median"]
        emit("relay", "relayed_throughput", summary(relayed)["median"], "MB/s",
             **summary(relayed), ratio_to_direct=round(ratio, 3), target=">= 200 and >= 0.5x",
             how=how)
        emit("relay", "relay_cpu_per_gb", cpu_per_gb, "s/GB",
             how="user+system CPU of the relay process per GB relayed (/proc/<pid>/stat)")
        samples = trio.run(_setups, dialer, args.setups)
        how = "dial_via_relay: pair + attach + end-to-end handshake, sequential"
        emit("relay", "setup_p50", percentile(samples, 0.5), "ms", n=len(samples),
             target="<= 15", how=how)
        emit("relay", "setup_p99", percentile(samples, 0.99), "ms", n=len(samples))
        memory = trio.run(functools.partial(
            _memory, dialer, relay_pid, args.idle_pairs, args.streaming_pairs,
            args.stream_seconds,
        ))
        emit("relay", "relay_rss_baseline", memory["baseline"], "MB",
             how="VmRSS of the relay process, 2 control connections, no pairs")
        emit("relay", "relay_rss_idle_pairs", memory["idle"], "MB",
             pairs=memory["idle_pairs"], target="<= 200 with 1000 pairs")
        emit("relay", "relay_rss_streaming_pairs", memory["streaming"], "MB",
             pairs=memory["streaming_pairs"], seconds=args.stream_seconds,
             aggregate_MBps=round(memory["streaming_MBps"], 1),
             how="peak VmRSS sampled every 0.1 s while every pair sends 64 KiB writes")


if __name__ == "__main__":
    main()
