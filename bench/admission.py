"""Admission under load: a configured peer connects while a stranger holds on.

The daemon (its own process, spawned) is a swarm with the defaults every
daemon runs (64 handshakes, 64 connections, 16 of them reserved), on
127.0.0.1, with one reserved key: the configured peer. In this process a
stranger first connects ``--keys`` fresh keys (1,000) and keeps every
connection the daemon lets it keep, then opens ``--sockets`` silent TCP
sockets (10,000) from 50 loopback addresses and holds them. Two legs, each
against a fresh daemon:

* ``hold``: the stranger keeps every socket it opened (those the daemon
  closed stay closed on its side);
* ``churn``: ``--churn-sockets`` (1,000) sockets, each opened again
  ``--reopen-ms`` (100 ms) after the daemon closes it, so the flood goes on
  while the peer connects (a connect flood: its rate, not its count, is
  what costs the daemon; the peer waits behind what the accept queue holds);
* ``bytes``: one-byte churn from 127.0.0.1 (the red team's): ``--bytes-per-s``
  (60) sockets a second, each sending one byte and held ``--bytes-hold-s``
  (2 s); a handshake that merely sent a byte is no progress, so these keep
  no peer out (before, each looked "progressed" and was spared for 1 s: every
  slot of loopback stayed taken and the peer was refused ``busy``). The peer
  starts after ``--bytes-lead-s`` (a second) of it.

As soon as the stranger's sockets are open (the daemon may still be taking
them from its accept queue), the peer (a process of its own) connects
``--tries`` times, one after another (TCP connect, handshake, a channel's
round trip, close).

Figures (JSON lines, ``bench: admission``):
* ``peer_connect_ms_first`` / ``_p50`` / ``_max``: the peer's connects under
  the flood (the first one waits behind what is left of the burst);
  ``peer_connects_within_1s``: how many of ``--tries`` took at most 1 s, and
  ``peer_connect_failures`` (refused or over 10 s; ``reasons`` says how each ended);
* ``stranger_sockets_opened``; ``stranger_sockets_still_open`` and
  ``stranger_keys_held``: those the daemon had not closed when the peer
  started; ``stranger_reopens_per_s``: the flood's rate of new sockets meanwhile;
* ``refused_<reason>``: the daemon's ``swarm_connections_refused_total`` by
  reason at the end (``evicted``, ``full``, ``address_full``, …).

Everything is bounded: counts by the arguments, time by ``--limit-s`` (120 s
per leg);
only 127.0.0.0/8 is used. RLIMIT_NOFILE is raised in both processes.

usage: python bench/admission.py [--sockets 10000] [--keys 1000] [--tries 20]
                                 [--legs hold churn bytes] [--reopen-ms 100]
                                 [--bytes-per-s 60] [--bytes-hold-s 2] [--bytes-lead-s 1]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import resource
import time

import trio
from _common import ChildServer, emit, machine, percentile

DAEMON_SEED = b"\x0a" * 32
PEER_SEED = b"\x0b" * 32
ECHO = "bench-echo/1"
STATS = "bench-stats/1"
SOURCES = 50


def raise_fd_limit(wanted: int) -> int:
    """Raise RLIMIT_NOFILE to ``wanted`` (the hard limit too, as root); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(hard, wanted)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def serve(port_queue) -> None:
    """The daemon: a swarm with the defaults, the peer's key reserved."""
    raise_fd_limit(4096)
    trio.run(_serve, port_queue)


async def _serve(port_queue) -> None:
    from p2p.host import ChannelService
    from p2p.keys import KeyPair
    from p2p.swarm import Swarm, SwarmConfig

    peer = KeyPair.from_seed(PEER_SEED).public_key

    async def echo(channel, connection):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            async for message in channel:
                await channel.send(message)

    async def stats(channel, connection):
        if connection.remote_public_key != peer:
            return
        refused = {}
        for metric in swarm.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name == "swarm_connections_refused_total":
                    refused[sample.labels["reason"]] = sample.value
        await channel.send(json.dumps({"refused": refused,
                                       "connections": len(swarm.connections)}).encode())

    swarm = Swarm(KeyPair.from_seed(DAEMON_SEED),
                  config=SwarmConfig(host="127.0.0.1", announce_key=False),
                  services=[ChannelService(ECHO, echo), ChannelService(STATS, stats)])
    swarm.add_reserved({peer})
    async with trio.open_nursery() as nursery:
        _host, port = await nursery.start(swarm.run)
        port_queue.put(port)


class Stranger:
    """The flood: held keys and silent sockets, with counters."""

    def __init__(self, port: int, daemon_key: bytes, reopen_s: float | None) -> None:
        self.port = port
        self.daemon_key = daemon_key
        self.reopen_s = reopen_s
        self.sockets_open = 0
        self.opens = 0
        self.keys_held = 0

    async def hold_key(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Connect one fresh key; keep the connection as long as the daemon does."""
        from p2p.connection import dial_tcp
        from p2p.keys import KeyPair

        try:
            connection = await dial_tcp("127.0.0.1", self.port, KeyPair.generate(),
                                        self.daemon_key)
        except Exception:
            task_status.started()
            return
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(connection.run)
            except Exception:
                task_status.started()
                return
            task_status.started()
            self.keys_held += 1
            try:
                await connection.mux.wait_closed()
            finally:
                self.keys_held -= 1
            nursery.cancel_scope.cancel()

    async def hold_socket(self, source: str, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """One silent socket, opened again whenever the daemon closes it."""
        started = False
        while True:
            sock = trio.socket.socket()
            try:
                await sock.bind((source, 0))
                await sock.connect(("127.0.0.1", self.port))
                self.opens += 1
                self.sockets_open += 1
                if not started:
                    started = True
                    task_status.started()
                stream = trio.SocketStream(sock)
                try:
                    while await stream.receive_some(1024):
                        pass
                finally:
                    self.sockets_open -= 1
            except OSError:
                pass
            finally:
                sock.close()
            if not started:
                started = True
                task_status.started()
            if self.reopen_s is None:
                return  # holds what it opened, no more
            await trio.sleep(self.reopen_s)


    async def byte_flood(self, per_s: float, hold_s: float, lead_s: float = 1.0,
                         task_status=trio.TASK_STATUS_IGNORED) -> None:
        """``per_s`` sockets a second from 127.0.0.1, each sending one byte and
        held ``hold_s`` (or until the daemon closes it); started once ``lead_s``
        of it has gone by."""
        async def one() -> None:
            with contextlib.suppress(OSError, trio.BrokenResourceError):
                sock = trio.socket.socket()
                with sock:
                    await sock.connect(("127.0.0.1", self.port))
                    self.opens += 1
                    self.sockets_open += 1
                    try:
                        stream = trio.SocketStream(sock)
                        await stream.send_all(b"\x00")
                        with trio.move_on_after(hold_s):
                            while await stream.receive_some(1024):
                                pass
                    finally:
                        self.sockets_open -= 1

        async with trio.open_nursery() as nursery:
            began = trio.current_time()
            started = False
            while True:
                nursery.start_soon(one)
                await trio.sleep(1 / per_s)
                if not started and trio.current_time() - began >= lead_s:
                    started = True
                    task_status.started()


async def start_in_batches(nursery: trio.Nursery, count: int, batch: int, make) -> None:
    """Start ``count`` holders, ``batch`` at a time (each started before the next batch)."""
    for first in range(0, count, batch):
        async with trio.open_nursery() as starting:
            for index in range(first, min(count, first + batch)):
                starting.start_soon(nursery.start, make(index))


async def peer_connects(port: int, daemon_key: bytes,
                        tries: int) -> tuple[list[float], list[str]]:
    from p2p.connection import dial_tcp
    from p2p.keys import KeyPair

    peer = KeyPair.from_seed(PEER_SEED)
    took: list[float] = []
    failures: list[str] = []
    for _ in range(tries):
        start = time.perf_counter()
        try:
            with trio.fail_after(10):
                connection = await dial_tcp("127.0.0.1", port, peer, daemon_key)
                async with trio.open_nursery() as nursery:
                    await nursery.start(connection.run)
                    channel = await connection.open_channel(ECHO)
                    await channel.send(b"ping")
                    assert await channel.receive() == b"ping"
                    took.append(time.perf_counter() - start)
                    await connection.aclose()
                    nursery.cancel_scope.cancel()
        except Exception as error:  # every way a connect fails is a figure here
            failures.append(f"{time.perf_counter() - start:.2f}s {type(error).__name__}: {error}")
        await trio.sleep(0.05)
    return took, failures


async def daemon_stats(port: int, daemon_key: bytes) -> dict:
    from p2p.connection import dial_tcp
    from p2p.keys import KeyPair

    for _ in range(5):
        try:
            with trio.fail_after(10):
                connection = await dial_tcp("127.0.0.1", port, KeyPair.from_seed(PEER_SEED),
                                            daemon_key)
                async with trio.open_nursery() as nursery:
                    await nursery.start(connection.run)
                    channel = await connection.open_channel(STATS)
                    stats = json.loads(await channel.receive())
                    await connection.aclose()
                    nursery.cancel_scope.cancel()
            return stats
        except Exception:
            await trio.sleep(0.1)
    return {"refused": {}, "connections": -1}


def peer(result_queue, port: int, tries: int) -> None:
    """The configured peer, a process of its own (as a real one would be: the
    stranger's flood must not slow its own writes): its connects, then the
    daemon's counters."""
    from p2p.keys import KeyPair

    daemon_key = KeyPair.from_seed(DAEMON_SEED).public_key

    async def main() -> None:
        took, failures = await peer_connects(port, daemon_key, tries)
        stats = await daemon_stats(port, daemon_key)
        result_queue.put((took, failures, stats))

    trio.run(main)


async def run(args: argparse.Namespace, port: int, leg: str) -> None:
    from p2p.keys import KeyPair

    daemon_key = KeyPair.from_seed(DAEMON_SEED).public_key
    stranger = Stranger(port, daemon_key, None if leg == "hold" else args.reopen_ms / 1000)
    sockets = {"hold": args.sockets, "churn": args.churn_sockets}.get(leg, 0)
    extra = {"leg": leg, "sockets": sockets, "keys": args.keys, **machine()}
    if leg == "bytes":
        extra.update(bytes_per_s=args.bytes_per_s, bytes_hold_s=args.bytes_hold_s,
                     bytes_lead_s=args.bytes_lead_s)
    with trio.fail_after(args.limit_s):
        async with trio.open_nursery() as flood:
            began = time.perf_counter()
            await start_in_batches(flood, args.keys, 20, lambda i: stranger.hold_key)
            keys_s = time.perf_counter() - began
            if leg == "bytes":
                await flood.start(stranger.byte_flood, args.bytes_per_s, args.bytes_hold_s,
                                  args.bytes_lead_s)
            else:
                await start_in_batches(
                    flood, sockets, 500,
                    lambda i: lambda task_status: stranger.hold_socket(
                        f"127.0.0.{2 + i % SOURCES}", task_status=task_status))
            sockets_open, keys_held = stranger.sockets_open, stranger.keys_held
            opens_before, measure_began = stranger.opens, time.perf_counter()
            context = multiprocessing.get_context("spawn")
            results = context.Queue()
            process = context.Process(target=peer, args=(results, port, args.tries),
                                      daemon=True)
            process.start()
            took, failures, stats = await trio.to_thread.run_sync(
                functools.partial(results.get, timeout=args.limit_s), abandon_on_cancel=True)
            process.join(timeout=10)
            reopen_rate = (stranger.opens - opens_before) / (time.perf_counter() - measure_began)
            flood.cancel_scope.cancel()
    ms = [t * 1000 for t in took] or [float("nan")]
    emit("admission", "peer_connect_ms_first", ms[0], "ms", **extra)
    emit("admission", "peer_connect_ms_p50", percentile(ms, 0.5), "ms", **extra)
    emit("admission", "peer_connect_ms_max", max(ms), "ms", **extra)
    emit("admission", "peer_connects_within_1s", sum(t <= 1.0 for t in took), "count",
         tries=args.tries, **extra)
    emit("admission", "peer_connect_failures", len(failures), "count", tries=args.tries,
         reasons=failures, **extra)
    emit("admission", "stranger_sockets_opened", stranger.opens, "count", **extra)
    emit("admission", "stranger_sockets_still_open", sockets_open, "count", **extra)
    emit("admission", "stranger_keys_held", keys_held, "count", **extra)
    emit("admission", "stranger_keys_s", keys_s, "s", **extra)
    emit("admission", "stranger_reopens_per_s", reopen_rate, "1/s", **extra)
    emit("admission", "daemon_connections", stats["connections"], "count", **extra)
    for reason, value in sorted(stats["refused"].items()):
        emit("admission", f"refused_{reason}", value, "count", **extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sockets", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--reopen-ms", type=float, default=100.0,
                        help="churn leg: pause before the stranger reopens a socket the "
                             "daemon closed")
    parser.add_argument("--churn-sockets", type=int, default=1_000,
                        help="churn leg: sockets the stranger keeps reopening")
    parser.add_argument("--bytes-per-s", type=float, default=60.0,
                        help="bytes leg: one-byte sockets opened a second, from 127.0.0.1")
    parser.add_argument("--bytes-hold-s", type=float, default=2.0,
                        help="bytes leg: how long each one-byte socket is held")
    parser.add_argument("--bytes-lead-s", type=float, default=1.0,
                        help="bytes leg: how long the flood runs before the peer starts")
    parser.add_argument("--legs", nargs="+", choices=("hold", "churn", "bytes"),
                        default=["hold", "churn", "bytes"])
    parser.add_argument("--limit-s", type=float, default=120.0)
    args = parser.parse_args()
    raise_fd_limit(args.sockets + args.keys + 1024)
    for leg in args.legs:
        with ChildServer(serve) as port:  # a fresh daemon per leg
            trio.run(run, args, port, leg)


if __name__ == "__main__":
    main()
