"""Durable queue benchmark: the log-based queue against a SQLite outbox, same run.

Two processes on one machine: the publisher (this one) and the consumer (a
spawned child), as wrk-ork and a worker would be. ``--publishers`` tasks
publish ``--ops`` operations in all (64-byte payloads, 8 job keys), each as
fast as its publishes return; the consumer applies each operation (records
its latency) and acks it.

* ``queue``: two swarms on 127.0.0.1 (real sockets, Noise, the mux), a
  ``DurableQueue`` at each end, ``QueueService`` on both. A publish returns
  once its entry is in the publisher's log and fsynced (group commit); the
  consumer's copy is verified and written (fsynced with the cursor, see
  p2p/queue/_queue.py); the consumer acks each delivery with ``ack_nowait``
  while ``run_acks`` flushes the cursor (fsync) in a task of its own.
* ``sqlite_outbox``: one WAL SQLite file, ``synchronous=FULL``; publishers
  insert rows (group commit the same way: every insert waiting goes in one
  transaction), the consumer polls every ``--poll-ms`` for rows past the
  last it applied, applies them and marks them done in one transaction
  (its fsync is the ack). The outbox needs no network: the two processes
  share the file, which is the best case for it (wrk-ork and a worker are on
  different machines in production).

Figures (JSON lines): ``<kind>_ops_per_s`` (operations applied by the
consumer per second, first publish to last applied) and
``<kind>_latency_ms`` (publish called -> applied, p50/p99/max; and
``publish_p50``/``publish_p99``, publish called -> returned durable) for each kind;
``--rate`` (5,000 by default) adds an open-loop run: a publish started every
1/rate s whatever the earlier ones do (figures ``<kind>_at_rate_...``): the
latency at the target throughput, not at saturation; ``--light`` adds a run
with one publisher (latency without queueing). ``fdatasync_ms`` is what one
small fdatasync costs on the disk just before each run: the floor under
every durable figure, which other load on the machine moves a lot.
fsync is on for both (``fdatasync``; SQLite's own ``fsync`` for FULL).

Targets: queue >= 5,000 durable operations/s, p50 publish ->
applied <= 5 ms on one machine (2 cores).

usage: python bench/durable_queue.py [--ops 20000] [--publishers 64] [--rate 5000] [--poll-ms 1]
                             [--light] [--dir DIR]
"""

from __future__ import annotations

import os
import sys

# This script is named like the standard library's ``queue``, which trio
# imports: put its folder (for ``_common``) after the standard library.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]

import argparse  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import multiprocessing  # noqa: E402
import sqlite3  # noqa: E402
import struct  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import trio  # noqa: E402
from _common import emit, machine, percentile  # noqa: E402

_STAMP = struct.Struct(">d")
PAYLOAD_BYTES = 64
KEYS = 8
# Python hands the GIL to a waiting thread only every "switch interval" (5 ms)
# while another thread runs; QUEUE_BENCH_SWITCH_MS sets it in both processes
# (README: what it does to the figures).
if os.environ.get("QUEUE_BENCH_SWITCH_MS"):
    sys.setswitchinterval(float(os.environ["QUEUE_BENCH_SWITCH_MS"]) / 1e3)


def payload_now() -> bytes:
    """A payload that carries when its publish was called (perf_counter is
    CLOCK_MONOTONIC: one clock for both processes)."""
    return _STAMP.pack(time.perf_counter()).ljust(PAYLOAD_BYTES, b".")


def cpu_seconds() -> float:
    """CPU time (user + system) of this process so far, every thread."""
    times = os.times()
    return times.user + times.system


def latency_of(payload: bytes) -> float:
    return time.perf_counter() - _STAMP.unpack_from(payload)[0]


def report(kind: str, publishers: int, ops: int, first: float, last: float,
           latencies: list[float], **extra) -> None:
    if extra.get("rate"):
        kind = f"{kind}_at_rate"
    elapsed = last - first
    emit("queue", f"{kind}_ops_per_s", ops / elapsed, "ops/s", ops=ops, publishers=publishers,
         seconds=round(elapsed, 3), fsync="on", **extra, **machine())
    ms = [x * 1e3 for x in latencies]
    emit("queue", f"{kind}_latency_ms", percentile(ms, 0.5), "ms",
         p50=round(percentile(ms, 0.5), 3), p99=round(percentile(ms, 0.99), 3),
         publish_p50=round(percentile(PUBLISH_MS, 0.5), 3),
         publish_p99=round(percentile(PUBLISH_MS, 0.99), 3),
         max=round(max(ms), 3), ops=ops,
         publishers=publishers, **extra, **machine())


async def publish_all(publish, publishers: int, ops: int) -> float:
    """Run ``publishers`` tasks sharing ``ops`` publishes; return when the first started."""
    first = time.perf_counter()
    per, extra = divmod(ops, publishers)

    async def publisher(n: int) -> None:
        for _ in range(per + (n < extra)):
            await publish(f"job-{n % KEYS}", payload_now())

    async with trio.open_nursery() as nursery:
        for n in range(publishers):
            nursery.start_soon(publisher, n)
    return first


async def publish_at_rate(publish, rate: float, ops: int, limit: int) -> float:
    """Open loop: start a publish every 1/``rate`` s (each in a task of its own, at
    most ``limit`` in flight), whatever the earlier ones do; return when it started."""
    first = time.perf_counter()
    room = trio.Semaphore(limit)

    async def one(n: int) -> None:
        try:
            await publish(f"job-{n % KEYS}", payload_now())
        finally:
            room.release()

    async with trio.open_nursery() as nursery:
        for n in range(ops):
            delay = first + n / rate - time.perf_counter()
            if delay > 0:
                await trio.sleep(delay)
            await room.acquire()
            nursery.start_soon(one, n)
    return first


def fsync_probe(folder: Path, count: int = 200) -> None:
    """What one small append + fdatasync costs on this disk now (the floor under
    every durable figure; other load on the machine moves it a lot)."""
    path = folder / "probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    times = []
    try:
        for n in range(count):
            os.pwrite(fd, bytes(200), n * 200)
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - started) * 1e3)
    finally:
        os.close(fd)
        os.unlink(path)
    emit("queue", "fdatasync_ms", percentile(times, 0.5), "ms",
         p50=round(percentile(times, 0.5), 3), p99=round(percentile(times, 0.99), 3),
         n=count, **machine())


# --- the log-based queue -------------------------------------------------------------------


def _queue_consumer(channel, folder: str, bootstrap, publisher_key: bytes, ops: int) -> None:
    """The consumer's process: a swarm, a queue end; report (last applied, latencies)."""
    logging.basicConfig(level=logging.WARNING)

    async def main() -> None:
        from p2p.keys import KeyPair
        from p2p.queue import DurableQueue, QueueService
        from p2p.swarm import Swarm, SwarmConfig

        keypair = KeyPair.generate()
        service = QueueService()
        swarm = Swarm(keypair, config=SwarmConfig(host="127.0.0.1", bootstrap=tuple(bootstrap)),
                      services=[service])
        async with trio.open_nursery() as nursery:
            await nursery.start(swarm.run)
            queue = await DurableQueue.open(folder, keypair, publisher_key)
            service.attach(queue)
            nursery.start_soon(queue.run_acks)
            channel.put((keypair.public_key, swarm.address))
            latencies = []
            cpu = None
            async with queue.deliveries() as receive:
                async for delivery in receive:
                    if cpu is None:
                        cpu = cpu_seconds()
                    latencies.append(latency_of(delivery.payload))  # "apply"
                    queue.ack_nowait(delivery.position)
                    if len(latencies) == ops:
                        await queue.ack(delivery.position)
                        break
            last = time.perf_counter()
            cpu = cpu_seconds() - cpu
            await trio.sleep(0.2)  # let the last STATUS go out
            channel.put((last, latencies, cpu))
            await queue.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)


async def bench_queue(folder: Path, ops: int, publishers: int, rate: float = 0) -> None:
    from p2p.dht.testnet import udp_testnet
    from p2p.keys import KeyPair
    from p2p.queue import DurableQueue, QueueService
    from p2p.swarm import Swarm, SwarmConfig

    async with udp_testnet(3) as dht, trio.open_nursery() as nursery:
        keypair = KeyPair.generate()
        service = QueueService()
        swarm = Swarm(keypair, config=SwarmConfig(host="127.0.0.1",
                                                  bootstrap=tuple(dht.bootstrap)),
                      services=[service])
        await nursery.start(swarm.run)
        context = multiprocessing.get_context("spawn")
        channel = context.Queue()
        child = context.Process(target=_queue_consumer, daemon=True, args=(
            channel, str(folder / "consumer"), list(dht.bootstrap), keypair.public_key, ops))
        child.start()
        consumer_key, address = await trio.to_thread.run_sync(channel.get, True, 60)
        queue = await DurableQueue.open(folder / "publisher", keypair, consumer_key)
        service.attach(queue)
        await swarm.connect(consumer_key, addresses=[address])
        await trio.sleep(0.5)  # both channels open (publishing earlier would work too)
        assert queue.statistics().connected
        cpu = cpu_seconds()
        first = await load(queue.publish, ops, publishers, rate)
        cpu = cpu_seconds() - cpu
        last, latencies, consumer_cpu = await trio.to_thread.run_sync(channel.get, True, 600)
        stats = queue.statistics()
        fsyncs = len(queue._out.head_lengths())
        report("queue", publishers, ops, first, last, latencies, rate=rate,
               appends=fsyncs, peer_acked=stats.peer_acked,
               cpu_us_per_op_publisher=round(cpu / ops * 1e6, 1),
               cpu_us_per_op_consumer=round(consumer_cpu / ops * 1e6, 1))
        await trio.to_thread.run_sync(child.join, 30)
        await queue.aclose()
        nursery.cancel_scope.cancel()


# --- the SQLite outbox ---------------------------------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY, key TEXT NOT NULL, payload BLOB NOT NULL,
    done INTEGER NOT NULL DEFAULT 0)
"""


def _connect(path: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute(_SCHEMA)
    return connection


class Outbox:
    """The publisher's side: inserts with the queue's group commit (one
    transaction, one fsync, for every publish waiting)."""

    def __init__(self, path: str) -> None:
        self._db = _connect(path)
        self._queued: list[tuple[str, bytes]] = []
        self._committing = False
        self._lot = trio.lowlevel.ParkingLot()
        self._assigned = 0
        self._committed = 0
        self.transactions = 0

    def _insert(self, rows: list[tuple[str, bytes]]) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        self._db.executemany("INSERT INTO outbox (key, payload) VALUES (?, ?)", rows)
        self._db.execute("COMMIT")

    async def publish(self, key: str, payload: bytes) -> int:
        self._assigned += 1
        position = self._assigned
        self._queued.append((key, payload))
        while self._committed < position:
            if self._committing:
                await self._lot.park()
                continue
            self._committing = True
            try:
                rows, self._queued = self._queued[:1024], self._queued[1024:]
                await trio.to_thread.run_sync(self._insert, rows)
                self._committed += len(rows)
                self.transactions += 1
            finally:
                self._committing = False
                self._lot.unpark_all()
        return position


def _outbox_consumer(channel, path: str, ops: int, poll_s: float) -> None:
    """The consumer's process: poll, apply, mark done (one transaction per poll)."""
    db = _connect(path)
    cpu = cpu_seconds()
    channel.put("ready")
    latencies: list[float] = []
    last_id = 0
    while len(latencies) < ops:
        rows = db.execute("SELECT id, key, payload FROM outbox WHERE id > ? ORDER BY id "
                          "LIMIT 4096", (last_id,)).fetchall()
        if not rows:
            time.sleep(poll_s)
            continue
        for _, _, payload in rows:
            latencies.append(latency_of(payload))  # "apply"
        last_id = rows[-1][0]
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE outbox SET done = 1 WHERE id <= ? AND done = 0", (last_id,))
        db.execute("COMMIT")
    channel.put((time.perf_counter(), latencies, cpu_seconds() - cpu))


async def bench_outbox(folder: Path, ops: int, publishers: int, poll_s: float,
                       rate: float = 0) -> None:
    path = str(folder / "outbox.sqlite")
    outbox = Outbox(path)
    context = multiprocessing.get_context("spawn")
    channel = context.Queue()
    child = context.Process(target=_outbox_consumer, daemon=True,
                            args=(channel, path, ops, poll_s))
    child.start()
    assert await trio.to_thread.run_sync(channel.get, True, 60) == "ready"
    cpu = cpu_seconds()
    first = await load(outbox.publish, ops, publishers, rate)
    cpu = cpu_seconds() - cpu
    last, latencies, consumer_cpu = await trio.to_thread.run_sync(channel.get, True, 600)
    report("sqlite_outbox", publishers, ops, first, last, latencies, rate=rate,
           appends=outbox.transactions, poll_ms=poll_s * 1e3,
           cpu_us_per_op_publisher=round(cpu / ops * 1e6, 1),
           cpu_us_per_op_consumer=round(consumer_cpu / ops * 1e6, 1))
    await trio.to_thread.run_sync(child.join, 30)


#: Publish call -> return (durable) of the last run, in ms.
PUBLISH_MS: list[float] = []


async def load(publish, ops: int, publishers: int, rate: float) -> float:
    PUBLISH_MS.clear()

    async def timed(key: str, payload: bytes) -> None:
        started = time.perf_counter()
        await publish(key, payload)
        PUBLISH_MS.append((time.perf_counter() - started) * 1e3)

    if rate:
        return await publish_at_rate(timed, rate, ops, publishers)
    return await publish_all(timed, publishers, ops)


async def run(args: argparse.Namespace) -> None:
    runs = [(args.ops, args.publishers, 0.0)] if args.publishers else []
    if args.rate:
        runs.append((args.ops, 1024, args.rate))
    if args.light:
        runs.append((min(args.ops, 2000), 1, 0.0))
    for ops, publishers, rate in runs:
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            fsync_probe(Path(folder))
            await bench_queue(Path(folder), ops, publishers, rate)
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            await bench_outbox(Path(folder), ops, publishers, args.poll_ms / 1e3, rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--publishers", type=int, default=64)
    parser.add_argument("--poll-ms", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=5000.0,
                        help="also an open-loop run at this many publishes/s (0: none)")
    parser.add_argument("--light", action="store_true", help="also one publisher")
    parser.add_argument("--dir", default=None, help="where the files go (default: /tmp)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    trio.run(functools.partial(run, args))


if __name__ == "__main__":
    main()
