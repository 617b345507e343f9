"""Shared-database benchmarks: durable append + apply, catch-up, convergence after a partition.

Figures (JSON lines):
* ``append_apply_ops_per_s``: one replica, ``--writers`` tasks each appending
  one-op entries (usage increments) in a loop; every append returns only once
  its entry is fsynced and applied to the SQLite view (group commit batches
  the appends that arrive during a write);
* ``append_many_ops_per_s``: the same with the caller batching (256 entries
  per ``append_many``);
* ``catch_up_entries_per_s``: a fresh replica, in its own process, fetches
  ``--catch-up`` entries written by two writers over a real swarm connection
  on 127.0.0.1, verifying every chain and signature, and applies them to its
  view (time from its start to having them all applied);
* ``partition_convergence_s``: three replicas, one cut off; each side writes
  ``--partition`` entries; the time from healing to all three holding the
  same logs and views;
* ``reopen_s``: opening a replica of ``--catch-up`` entries, with the gate
  snapshot saved on close and without it (every entry replayed);
* ``fast_forward_s``: a fresh replica, in its own process, over a real swarm
  connection on 127.0.0.1, until its view holds the ``--fast-forward``
  entries two writers wrote (the admin's signed checkpoint fetched, checked
  and installed; time from its start, the swarm's lookup and connection
  included; ``after_open_s``: from its replica open and swarm topic joined,
  so from the lookup on); beside it ``writable_s``, until its gate is
  restored too (the checkpoint's second step: writes wait until then),
  ``logs_complete_s``, until it also holds every log (fetched and verified in
  the background, not replayed), and the admin's ``checkpoint_make_s`` (open,
  then its first checkpoint).
  ``--fast-forward 1000000`` builds a million entries first (about two
  minutes). Upstream Autobase's figure is its third peer's fast-forward
  (``autobase.js`` in ../shared/anchors/holepunch: "third-peer sync from
  scratch"): 0.17-0.24 s at 100,000 ops on this machine.

Upstream Autobase applying into a Hyperbee view on this machine: about 2,400
ops/s (two writers, 100,000 small ops); a peer replaying every op about 2,500
ops/s. Targets: durable append + apply >= 12,000 ops/s; catch-up >= 20,000
entries/s with every signature and chain verified.

After the fast-forward, the same database size in upstream Autobase, run from
the anchors in the same sitting (bench/_anchors.py): ``upstream_apply_ops_per_s``,
``upstream_fast_forward_s``, ``upstream_replay_s`` and
``fast_forward_s_ratio_to_upstream`` (> 1: ours is faster).

usage: python bench/crdt.py [--writers 64] [--ops 20000] [--catch-up 100000]
                            [--partition 10000] [--fast-forward 100000] [--reps 3]
                            [--only fast-forward] [--no-upstream]
                            [--only fast-forward]
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio
from _anchors import run_holepunch, upstream_figure
from _common import emit, machine, summary

DAY = "2026-11-29"


def written(db) -> dict[bytes, int]:
    """The logs a replica holds entries of (a replica that never wrote keeps an
    empty log of its own, which its peers do not list)."""
    return {writer: n for writer, n in db.lengths.items() if n}


async def until(condition, db, limit_s: float) -> None:
    """Wait until ``condition()`` holds, waking on every write to ``db`` (and every 5 ms)."""
    with trio.fail_after(limit_s):
        while not condition():
            await db.wait_changed(db.lengths, 0.005)


def usage_entry(n: int) -> list:
    from crdt import AddTokenUsage

    return [AddTokenUsage(f"key-{n % 100}", f"model-{n % 5}", DAY, prompt=n % 50,
                          completion=7, total=n % 50 + 7, requests=1)]


async def bench_append(folder: Path, writers: int, ops: int) -> None:
    from crdt import Database, FsyncPolicy
    from p2p.keys import KeyPair

    async with await Database.open(folder / "append", KeyPair.generate(),
                                   fsync=FsyncPolicy.ALWAYS) as db:
        per_writer = ops // writers

        async def writer(offset: int) -> None:
            for n in range(per_writer):
                await db.append(usage_entry(offset + n))

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for w in range(writers):
                nursery.start_soon(writer, w * per_writer)
        elapsed = time.perf_counter() - started
        batches = db.metrics.registry.get_sample_value("crdt_append_batches_total")
        emit("crdt", "append_apply_ops_per_s", per_writer * writers / elapsed, "ops/s",
             writers=writers, ops=per_writer * writers, fsyncs=batches, durable=True,
             **machine())

    async with await Database.open(folder / "append-many", KeyPair.generate(),
                                   fsync=FsyncPolicy.ALWAYS) as db:
        started = time.perf_counter()
        for first in range(0, ops, 256):
            await db.append_many([usage_entry(n) for n in range(first, min(ops, first + 256))])
        elapsed = time.perf_counter() - started
        emit("crdt", "append_many_ops_per_s", ops / elapsed, "ops/s", batch=256, ops=ops,
             durable=True, **machine())


def _write_two_writers(folder: Path, total: int) -> tuple[bytes, bytes]:
    """Two writers' logs of ``total`` entries together, in two storage folders."""
    from crdt import AddWriter, FsyncPolicy
    from crdt._base import Base
    from p2p.keys import load_or_create_keypair

    a_key = load_or_create_keypair(folder / "a")
    b_key = load_or_create_keypair(folder / "b")
    with Base.open(folder / "a", a_key, fsync=FsyncPolicy.NEVER) as a, \
            Base.open(folder / "b", b_key, bootstrap=a_key.public_key,
                      fsync=FsyncPolicy.NEVER) as b:
        a.append([[AddWriter(b_key.public_key)]])
        _copy(b, a)
        half = total // 2
        for first in range(0, half, 1000):
            a.append([usage_entry(n) for n in range(first, min(half, first + 1000))])
            b.append([usage_entry(n) for n in range(first, min(half, first + 1000))])
        _copy(b, a)
        _copy(a, b)
    return a_key.public_key, b_key.public_key


def _copy(into, source) -> None:
    for writer in sorted(into.wanted()):
        source_log = source.logs.get(writer)
        while source_log is not None and into.lengths().get(writer, 0) < source_log.length:
            start = into.lengths().get(writer, 0)
            entries, head = source.segment(writer, start, 1 << 20)
            into.ingest(writer, start, entries, head)


async def replica_on_swarm(storage, keypair, config, *, firewall=None,
                           task_status=trio.TASK_STATUS_IGNORED, **options) -> None:
    """A daemon's shape: one swarm, the database a service on it; reports the service."""
    from crdt import run_database_service
    from p2p.swarm import Swarm

    swarm = Swarm(keypair, config=config, firewall=firewall)
    async with trio.open_nursery() as nursery:
        await nursery.start(swarm.run)
        await run_database_service(storage, swarm=swarm, task_status=task_status, **options)


def _catch_up_child(queue, folder: str, bootstrap, db_key: bytes, expected: int) -> None:
    """The catching-up replica, in a process of its own: report (seconds, entries)."""
    logging.basicConfig(level=logging.WARNING)

    async def main() -> None:
        from crdt import FsyncPolicy, ReplicationConfig
        from p2p.keys import load_or_create_keypair
        from p2p.swarm import SwarmConfig

        config = SwarmConfig(host="127.0.0.1", bootstrap=tuple(bootstrap), lookup_max_s=1.0)
        async with trio.open_nursery() as nursery:
            started = time.perf_counter()
            service = await nursery.start(functools.partial(
                replica_on_swarm, folder, load_or_create_keypair(folder), config,
                bootstrap=db_key,
                fsync=FsyncPolicy.ALWAYS, replication=ReplicationConfig(request_admission=False)))
            db = service.db
            await until(lambda: sum(db.lengths.values()) >= expected, db, 600)
            elapsed = time.perf_counter() - started
            rows = await db.read(lambda v: v.counts())
            queue.put((elapsed, sum(db.lengths.values()), rows))
            nursery.cancel_scope.cancel()

    trio.run(main)


async def bench_catch_up(folder: Path, total: int) -> None:
    from crdt import FsyncPolicy
    from p2p.dht.testnet import udp_testnet
    from p2p.keys import load_or_create_keypair
    from p2p.swarm import SwarmConfig

    a_public, _ = await trio.to_thread.run_sync(_write_two_writers, folder, total)
    expected = total + 1  # the add_writer entry
    async with udp_testnet(3) as dht, trio.open_nursery() as nursery:
        config = SwarmConfig(host="127.0.0.1", bootstrap=tuple(dht.bootstrap))
        # The catching-up replica is a reader the first one is configured to serve.
        reader = load_or_create_keypair(folder / "c").public_key
        await nursery.start(functools.partial(
            replica_on_swarm, folder / "a", load_or_create_keypair(folder / "a"), config,
            fsync=FsyncPolicy.NEVER, readers=frozenset({reader})))
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=_catch_up_child, daemon=True, args=(
            queue, str(folder / "c"), list(dht.bootstrap), a_public, expected))
        child.start()
        elapsed, entries, rows = await trio.to_thread.run_sync(queue.get, True, 700)
        await trio.to_thread.run_sync(child.join, 30)
        emit("crdt", "catch_up_entries_per_s", entries / elapsed, "entries/s", entries=entries,
             seconds=round(elapsed, 3), writers=2, verified="chain+signature",
             view_rows=rows, **machine())
        nursery.cancel_scope.cancel()


def _fast_forward_child(queue, folder: str, bootstrap, db_key: bytes, expected: int) -> None:
    """The fresh replica, in a process of its own: report when its view holds
    ``expected`` entries (usable) and when its logs do too."""
    logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)d %(name)s %(message)s")
    if os.environ.get("CRDT_BENCH_DEBUG"):
        logging.getLogger("crdt").setLevel(logging.INFO)
        logging.getLogger("p2p").setLevel(logging.DEBUG)

    async def main() -> None:
        from crdt import FsyncPolicy, ReplicationConfig
        from crdt._checkpoint import view_digest
        from p2p.keys import load_or_create_keypair
        from p2p.swarm import SwarmConfig

        config = SwarmConfig(host="127.0.0.1", bootstrap=tuple(bootstrap), lookup_max_s=1.0)
        async with trio.open_nursery() as nursery:
            started = time.perf_counter()
            service = await nursery.start(functools.partial(
                replica_on_swarm, folder, load_or_create_keypair(folder), config,
                bootstrap=db_key, fsync=FsyncPolicy.ALWAYS,
                replication=ReplicationConfig(request_admission=False)))
            db = service.db
            opened = time.perf_counter()  # the replica open and its topic joined
            logging.getLogger("crdt.bench").info("opened after %.3f s", opened - started)
            await until(lambda: sum(db.applied.values()) >= expected, db, 600)
            usable = time.perf_counter() - started
            logging.getLogger("crdt.bench").info("usable after %.3f s", usable)
            digest = await db.read(lambda v: view_digest(v.rows()))

            def installed() -> float:
                return db.metrics.registry.get_sample_value(
                    "crdt_checkpoints_total", {"outcome": "installed"}) or 0
            # Writes wait for the second step (the gate's clocks); a full
            # catch-up (no checkpoint installed) is writable when usable.
            await until(lambda: installed() or sum(db.lengths.values()) >= expected, db, 600)
            writable = time.perf_counter() - started
            await until(lambda: sum(db.lengths.values()) >= expected, db, 600)
            complete = time.perf_counter() - started
            queue.put((usable, complete, digest, installed(), usable - (opened - started),
                       writable))
            nursery.cancel_scope.cancel()

    trio.run(main)


async def bench_fast_forward(folder: Path, total: int, reps: int) -> float:
    """A fresh replica from the admin's checkpoint (see ``fast_forward_s`` above)."""
    from crdt import FsyncPolicy
    from crdt._checkpoint import view_digest
    from p2p.dht.testnet import udp_testnet
    from p2p.keys import load_or_create_keypair
    from p2p.swarm import SwarmConfig

    built = time.perf_counter()
    a_public, _ = await trio.to_thread.run_sync(_write_two_writers, folder, total)
    build_s = time.perf_counter() - built
    expected = total + 1  # the add_writer entry
    usable, complete, identical, installed, after_open, writable = [], [], [], [], [], []
    async with udp_testnet(3) as dht, trio.open_nursery() as nursery:
        config = SwarmConfig(host="127.0.0.1", bootstrap=tuple(dht.bootstrap))
        readers = [load_or_create_keypair(folder / f"c{rep}").public_key for rep in range(reps)]
        opened = time.perf_counter()
        service = await nursery.start(functools.partial(
            replica_on_swarm, folder / "a", load_or_create_keypair(folder / "a"), config,
            fsync=FsyncPolicy.NEVER, readers=frozenset(readers)))
        db = service.db
        await until(lambda: db.checkpoint is not None, db, 600)
        checkpoint_s = time.perf_counter() - opened
        checkpoint = db.checkpoint
        digest = await db.read(lambda v: view_digest(v.rows()))
        context = multiprocessing.get_context("spawn")
        for rep in range(reps):
            queue = context.Queue()
            child = context.Process(target=_fast_forward_child, daemon=True, args=(
                queue, str(folder / f"c{rep}"), list(dht.bootstrap), a_public, expected))
            child.start()
            result = await trio.to_thread.run_sync(queue.get, True, 1300)
            await trio.to_thread.run_sync(child.join, 30)
            usable.append(result[0])
            complete.append(result[1])
            identical.append(result[2] == digest)
            installed.append(result[3])
            after_open.append(result[4])
            writable.append(result[5])
        emit("crdt", "fast_forward_s", statistics.median(usable), "s", entries=expected,
             reps=summary(usable), after_open_s=summary(after_open),
             writable_s=summary(writable),
             logs_complete_s=summary(complete),
             identical_views=all(identical), checkpoints_installed=installed,
             checkpoint_make_s=round(checkpoint_s, 3),
             checkpoint_bytes=sum(map(len, checkpoint.pages)) + len(checkpoint.header_bytes),
             writers=2, build_s=round(build_s, 1),
             reference="upstream autobase third peer, default fast-forward (autobase.js)",
             **machine())
        nursery.cancel_scope.cancel()
    return statistics.median(usable)


def bench_upstream(ops: int, ours_fast_forward_s: float | None) -> None:
    """Upstream Autobase (the anchors' autobase.js) of ``ops`` ops in this run: its
    two writers' apply rate, a third peer's fast-forward and a replaying peer."""
    got = run_holepunch("autobase.js", "--ops", str(ops), "--reps", "1", timeout_s=1800)
    if isinstance(got, str):
        print(json.dumps({"bench": "crdt", "metric": "upstream", "skipped": got}), flush=True)
        return
    figures, _cpu = got
    how = f"Autobase + Hyperbee, {ops} ops (../shared/anchors/holepunch autobase.js), this run"
    for metric, theirs, unit in (
            ("upstream_apply_ops_per_s", "autobase 2-writer apply rate", "ops/s"),
            ("upstream_fast_forward_s", "autobase third-peer sync from scratch", "s"),
            ("upstream_replay_s", "autobase third-peer replay from scratch", "s")):
        value = upstream_figure(figures, theirs)
        if value is None:
            continue
        emit("crdt", metric, value, unit, how=how)
        if metric == "upstream_fast_forward_s" and ours_fast_forward_s:
            emit("crdt", "fast_forward_s_ratio_to_upstream", value / ours_fast_forward_s, "x",
                 better="higher", how="upstream's time / ours")


async def bench_partition(folder: Path, per_side: int) -> None:
    from crdt import FsyncPolicy, ReplicationConfig
    from p2p.dht.testnet import udp_testnet
    from p2p.keys import KeyPair
    from p2p.swarm import SwarmConfig

    keys = [KeyPair.generate() for _ in range(3)]
    blocked: set[frozenset[bytes]] = set()
    replication = ReplicationConfig(poll_s=5.0, join_retry_s=0.2)
    async with udp_testnet(3) as dht, trio.open_nursery() as nursery:
        config = SwarmConfig(host="127.0.0.1", bootstrap=tuple(dht.bootstrap), lookup_max_s=1.0)
        services = []
        for i, keypair in enumerate(keys):
            me = keypair.public_key
            services.append(await nursery.start(functools.partial(
                replica_on_swarm, folder / f"p{i}", keypair, config,
                bootstrap=None if i == 0 else keys[0].public_key,
                allow=frozenset(k.public_key for k in keys[1:]),
                fsync=FsyncPolicy.ALWAYS, replication=replication,
                firewall=lambda peer, how, me=me: frozenset((me, peer)) not in blocked)))
        dbs = [s.db for s in services]
        await until(lambda: all(db.is_writer for db in dbs), dbs[2], 60)
        lone = keys[2].public_key
        blocked.update(frozenset((lone, k.public_key)) for k in keys[:2])
        for service in services:
            for key, connection in list(service.swarm.connections.items()):
                if frozenset((service.db.key, key)) in blocked:
                    await connection.aclose()
        # Side one: replicas 0 and 1 write per_side entries between them; side two: replica 2.
        for first in range(0, per_side, 500):
            await dbs[first // 500 % 2].append_many(
                [usage_entry(n) for n in range(first, min(per_side, first + 500))])
            await dbs[2].append_many(
                [usage_entry(n) for n in range(first, min(per_side, first + 500))])
        await until(lambda: written(dbs[0]) == written(dbs[1]), dbs[1], 120)
        healed = time.perf_counter()
        blocked.clear()
        await until(lambda: written(dbs[0]) == written(dbs[1]) == written(dbs[2]), dbs[2], 300)
        elapsed = time.perf_counter() - healed
        dumps = [await db.read(lambda v: v.dump()) for db in dbs]
        emit("crdt", "partition_convergence_s", elapsed, "s", replicas=3,
             entries_per_side=per_side, identical_views=dumps[0] == dumps[1] == dumps[2],
             **machine())
        nursery.cancel_scope.cancel()


def bench_reopen(folder: Path, total: int) -> None:
    from crdt import FsyncPolicy
    from crdt._base import Base
    from p2p.keys import KeyPair

    keypair = KeyPair.generate()
    with Base.open(folder / "reopen", keypair, fsync=FsyncPolicy.NEVER) as base:
        for first in range(0, total, 1000):
            base.append([usage_entry(n) for n in range(first, min(total, first + 1000))])
    for how in ("snapshot", "full replay"):
        if how == "full replay":
            (folder / "reopen" / "db" / "gate.snapshot").unlink()
        started = time.perf_counter()
        with Base.open(folder / "reopen", keypair):
            elapsed = time.perf_counter() - started
        emit("crdt", "reopen_s", elapsed, "s", entries=total, how=how, **machine())


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="crdt-bench-") as tmp:
        folder = Path(tmp)
        if args.only in (None, "fast-forward"):
            (folder / "ff").mkdir()
            ours = await bench_fast_forward(folder / "ff", args.fast_forward, args.reps)
            if not args.no_upstream:
                await trio.to_thread.run_sync(bench_upstream, args.fast_forward, ours)
        if args.only is None:
            await bench_append(folder, args.writers, args.ops)
            await bench_catch_up(folder, args.catch_up)
            await bench_partition(folder, args.partition)
            await trio.to_thread.run_sync(bench_reopen, folder, args.catch_up)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--catch-up", type=int, default=100_000)
    parser.add_argument("--partition", type=int, default=10_000)
    parser.add_argument("--fast-forward", type=int, default=100_000,
                        help="entries of the database a fresh replica fast-forwards to")
    parser.add_argument("--reps", type=int, default=3, help="fresh replicas, one after another")
    parser.add_argument("--only", choices=["fast-forward"], default=None)
    parser.add_argument("--no-upstream", action="store_true",
                        help="leave out Autobase (bench/_anchors.py runs it)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    trio.run(run, args)


if __name__ == "__main__":
    main()
