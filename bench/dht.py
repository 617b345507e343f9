"""DHT benchmarks: announce-then-lookup latency, hops, messages, memory per node.

Figures (JSON lines):
* real UDP nodes on 127.0.0.1 in one process (30 and 100 nodes): ``announce_ms``,
  ``lookup_first_ms`` (to the first verified record) and ``lookup_end_ms`` (to
  the end of the lookup), p50 and p99, ``lookup_cpu_ms`` (the process's CPU
  time, user + system, during one lookup: all nodes share the process, so this
  is the whole lookup's cost, both sides, and it moves much less than the wall
  time when the machine is loaded), and ``lookup_hops``;
* in-memory network under a virtual clock (1,000 and 10,000 nodes):
  ``memory_lookup_hops`` (p50, max, and the ⌈log2 N⌉ + 1 bound) and
  ``memory_lookup_messages`` per lookup;
* ``rss_per_node`` in MiB (resident memory growth / nodes, idle).

Upstream HyperDHT on this machine (30 / 100 nodes), quiet (anchors' RESULTS.md):
announce 4.0 / 5.0 ms, lookup to first record 0.43 / 0.73 ms, to the end
1.7 / 2.8 ms, ~0.3 MiB/node. Same sitting as ours on 2026-12-07 (issue 26),
load average about 3, dht.js with 20 reps, medians of 2 rounds: announce
7.5 / 10.0 ms, first record 0.90 / 1.58 ms, end 4.1 / 5.8 ms, 0.39 / 0.27
MiB/node; CPU per lookup (process.cpuUsage around each lookup, in a copy of
dht.js) 3.4 / 4.8 ms, where ours took 4.8 / 5.7 ms (11.4 / 10.1 ms before
issue 26).

usage: python bench/dht.py [--udp 30,100] [--memory 1000,10000] [--reps 20]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import resource
import sys
import time

import trio
import trio.testing
from _anchors import run_holepunch, upstream_figure
from _common import emit, machine, percentile


def cpu_ms_now() -> float:
    """This process's CPU time so far (user + system), in milliseconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4096 / (1 << 20)


async def udp_figures(size: int, reps: int) -> dict[str, float]:
    from p2p.dht._records import _signature_valid
    from p2p.dht.testnet import udp_testnet
    from p2p.keys import KeyPair, derive_topic

    rng = random.Random(size)
    before = rss_mib()
    async with udp_testnet(size) as net:
        gc.collect()
        emit("dht", f"rss_per_node_udp_{size}", (rss_mib() - before) / size, "MiB",
             how="RSS growth after building the testnet / nodes")
        announce_ms, first_ms, end_ms, cpu_ms, hops = [], [], [], [], []
        for rep in range(reps):
            announcer, looker = rng.sample(net.nodes, 2)
            keypair, topic = KeyPair.generate(), derive_topic("bench", f"{size}-{rep}")
            began = time.perf_counter()
            await announcer.announce_once(topic, keypair, addresses=[("127.0.0.1", 1)], seq=1)
            announce_ms.append((time.perf_counter() - began) * 1000)
            # The storing nodes share this process and verify_record's memo of
            # signature checks: forget them, so the looker pays for its first
            # copy of the record as a node in a process of its own would.
            _signature_valid.cache_clear()
            cpu_began = cpu_ms_now()
            began = time.perf_counter()
            first = None
            async for _record in looker.lookup(topic):
                first = first or (time.perf_counter() - began) * 1000
            end_ms.append((time.perf_counter() - began) * 1000)
            cpu_ms.append(cpu_ms_now() - cpu_began)
            first_ms.append(first if first is not None else math.nan)
            hops.append(looker.last_lookup.hops)
        how = f"{size} real UDP nodes on 127.0.0.1 in one process, {reps} fresh topics"
        for name, values in (("announce_ms", announce_ms), ("lookup_first_ms", first_ms),
                             ("lookup_end_ms", end_ms), ("lookup_cpu_ms", cpu_ms)):
            emit("dht", f"{name}_{size}", percentile(values, 0.5), "ms",
                 p99=round(percentile(values, 0.99), 3), n=len(values), how=how)
        emit("dht", f"lookup_hops_{size}", percentile(hops, 0.5), "hops", max=max(hops))
        return {"announce_ms": percentile(announce_ms, 0.5),
                "lookup_first_ms": percentile(first_ms, 0.5),
                "lookup_end_ms": percentile(end_ms, 0.5)}


def upstream(size: int, reps: int, ours: dict[str, float]) -> None:
    """HyperDHT's testnet of ``size`` nodes (the anchors' dht.js) right after ours,
    and ours as ratios to it (> 1: ours is faster)."""
    got = run_holepunch("dht.js", "--nodes", str(size), "--reps", str(reps))
    if isinstance(got, str):
        print(json.dumps({"bench": "dht", "metric": f"upstream_{size}", "skipped": got}),
              flush=True)
        return
    figures, _cpu = got
    how = f"HyperDHT testnet of {size} nodes (../shared/anchors/holepunch dht.js), this run"
    for ours_name, theirs in (("announce_ms", "dht announce(topic).finished"),
                              ("lookup_first_ms", "dht lookup first peer"),
                              ("lookup_end_ms", "dht lookup stream end")):
        value = upstream_figure(figures, theirs)
        if value is None:
            continue
        emit("dht", f"upstream_{ours_name}_{size}", value, "ms", how=how)
        if ours.get(ours_name):
            emit("dht", f"{ours_name}_{size}_ratio_to_upstream", value / ours[ours_name], "x",
                 better="higher", how="upstream's time / ours")
    rss = upstream_figure(figures, "dht rss per node")
    if rss is not None:
        emit("dht", f"upstream_rss_per_node_udp_{size}", rss, "MiB", how=how)


async def memory_figures(size: int, lookups: int) -> None:
    from p2p.dht.testnet import memory_testnet
    from p2p.keys import KeyPair, derive_topic

    rng = random.Random(size)
    gc.collect()
    before = rss_mib()
    started = time.perf_counter()

    def progress(built: int, total: int) -> None:
        if built % 1000 == 0 or built == total:
            print(f"# building the {total}-node network: {built}/{total} "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    async with memory_testnet(size, seed=size, progress=progress) as net:
        built_s = time.perf_counter() - started
        gc.collect()
        emit("dht", f"rss_per_node_memory_{size}", (rss_mib() - before) / size, "MiB",
             how="RSS growth after building the in-memory testnet / nodes (idle)",
             build_s=round(built_s, 1))
        keypair, topic = KeyPair.generate(), derive_topic("bench", f"memory-{size}")
        await rng.choice(net.nodes).announce_once(
            topic, keypair, addresses=[("10.0.0.1", 1)], seq=1
        )
        hops, messages, found = [], [], 0
        for looker in rng.sample(net.nodes, lookups):
            found += bool([r async for r in looker.lookup(topic)])
            hops.append(looker.last_lookup.hops)
            messages.append(looker.last_lookup.queries)
        bound = math.ceil(math.log2(size)) + 1
        how = f"{size} nodes on the in-memory network (virtual clock), {lookups} lookups"
        emit("dht", f"memory_lookup_hops_{size}", percentile(hops, 0.5), "hops",
             max=max(hops), bound=bound, found=f"{found}/{lookups}", how=how)
        emit("dht", f"memory_lookup_messages_{size}", percentile(messages, 0.5), "messages",
             max=max(messages), how=how)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--udp", default="30,100")
    parser.add_argument("--memory", default=os.environ.get("DHT_BENCH_MEMORY", "1000,10000"),
                        help="sizes of in-memory networks (building 10,000 nodes takes "
                        "about 20-25 min here; DHT_BENCH_MEMORY sets the default)")
    parser.add_argument("--reps", type=int, default=20,
                        help="announce-then-lookup rounds per UDP network (medians are noisy here)")
    parser.add_argument("--no-upstream", action="store_true",
                        help="leave out HyperDHT's testnet (bench/_anchors.py runs it)")
    args = parser.parse_args()
    for size in [int(s) for s in args.udp.split(",") if s]:
        ours = trio.run(udp_figures, size, args.reps)
        if not args.no_upstream:
            upstream(size, args.reps, ours)
    for size in [int(s) for s in args.memory.split(",") if s]:
        trio.run(memory_figures, size, 20, clock=trio.testing.MockClock(autojump_threshold=0))
    emit("dht", "machine", 0, "-", machine=machine())


if __name__ == "__main__":
    main()
