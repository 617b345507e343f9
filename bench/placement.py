"""Placement benchmark: wrk-ork's place()+claim() decisions on a large, busy cluster.

The cluster: ``--racks`` racks of ``--nodes`` nodes of 8 GPUs, all with
InfiniBand and the overlay network, in one location (the hardest case: every
rack is a candidate for every job); teams ``r0``..``r3`` each reserve 8 nodes.
The job mix (typical of the platform's use): mostly 1-8 GPU single-node jobs, some
two-replica inference jobs, some 16-GPU vLLM replicas that span two nodes, and
a few jobs of the reserving teams (see ``MIX``).

A *decision* is one ``place()`` and, when it succeeds, one ``claim()``; a
decision that ends in NoCapacity (the job would stay Pending) counts too.

Figures (JSON lines):
* ``fill_decisions_per_s``: placing ``--jobs`` jobs into the empty cluster;
* ``churn_decisions_per_s``: with those jobs running, ``--churn`` rounds of
  deleting a random running job (``unclaim``) and placing a new one; the time
  includes the deletions. Also its p50/p99 latency per decision (without the
  deletion) and the mean per kind of job;
* ``pending_retry_per_s``: place() of jobs that do not fit now (the retry of a
  Pending job after each release), on the full cluster.

Target: >= 2,000 decisions/s with 100 racks x 32 nodes x 8
GPUs and 10,000 running jobs.

usage: python bench/placement.py [--racks 100] [--nodes 32] [--jobs 10000]
                                 [--churn 20000] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import time

from _common import emit, machine, percentile

IMAGE = "docker://registry.local/bench:1"
#: (weight, kind, GPUs per replica, replicas, team): 2.2 GPUs per job on average,
#: so 10,000 jobs claim about 86% of 25,600 GPUs (some 16-GPU replicas wait).
MIX = [
    (55, "container", 1, 1, None),
    (20, "container", 2, 1, None),
    (8, "container", 4, 1, None),
    (4, "container", 8, 1, None),
    (6, "vllm", 2, 2, None),
    (2, "vllm", 16, 1, None),
    (3, "parakeet", 1, 1, None),
    (2, "container", 2, 1, "reserved"),
]


def build_cluster(racks: int, nodes: int):
    from contracts.model import NodeInfo, RackReport
    from nodes.ork.capacity import Capacity

    cluster = Capacity()
    keys = [f"{n:064x}" for n in range(1, racks + 1)]
    report = RackReport(nodes=tuple(NodeInfo(name=f"node-{i:02d}", gpus=8, infiniband=True,
                                             gpu_resource="nvidia.com/H100")
                                    for i in range(nodes)), overlay_network=True)
    for key in keys:
        cluster.set_rack(key, "default", report)
    for team in range(4):  # 8 nodes each on rack `team`
        for i in range(min(8, nodes)):
            cluster.reserve(keys[team % racks], f"node-{(i + 8 * (team // racks)) % nodes:02d}",
                            f"r{team}")
    return cluster


def job_specs(rng: random.Random, count: int) -> list:
    from contracts.model import JobSpec

    weights = [row[0] for row in MIX]
    specs = []
    for n, (_, kind, gpus, replicas, team) in enumerate(rng.choices(MIX, weights, k=count)):
        team = f"r{rng.randrange(4)}" if team else f"team-{rng.randrange(50)}"
        if kind == "container":
            specs.append(JobSpec(name=f"j{n}", team=team, type="container", image=IMAGE,
                                 gpus=gpus))
        else:
            specs.append(JobSpec(name=f"j{n}", team=team, type="inference", image=IMAGE,
                                 gpus=gpus, replicas=replicas, runtime=kind, model="m"))
    return specs


def decide(cluster, spec, running: list, latencies: list | None = None) -> bool:
    from nodes.ork.placement import NoCapacity, place

    started = time.perf_counter()
    try:
        placements = place(cluster, spec)
        cluster.claim(placements)
    except NoCapacity:
        placed = False
    else:
        running.append(placements)
        placed = True
    if latencies is not None:
        latencies.append(time.perf_counter() - started)
    return placed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--racks", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--churn", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    shape = {"racks": args.racks, "nodes_per_rack": args.nodes, "gpus_per_node": 8}

    cluster = build_cluster(args.racks, args.nodes)
    gpus = sum(rack.gpus for rack in cluster.racks())
    specs = job_specs(rng, args.jobs)
    running: list = []
    started = time.perf_counter()
    pending = sum(not decide(cluster, spec, running) for spec in specs)
    elapsed = time.perf_counter() - started
    used = gpus - sum(rack.free for rack in cluster.racks())
    emit("placement", "fill_decisions_per_s", len(specs) / elapsed, "decisions/s",
         jobs=len(specs), running=len(running), no_capacity=pending,
         gpus_claimed_fraction=round(used / gpus, 3), **shape, **machine())

    specs = job_specs(rng, args.churn)
    latencies: list[float] = []
    pending = 0
    started = time.perf_counter()
    for spec in specs:
        if running:
            victim = running.pop(rng.randrange(len(running)))
            cluster.unclaim(victim)
        pending += not decide(cluster, spec, running, latencies)
    elapsed = time.perf_counter() - started
    used = gpus - sum(rack.free for rack in cluster.racks())
    by_kind: dict[str, list[float]] = {}
    for spec, latency in zip(specs, latencies, strict=True):
        kind = f"{spec.runtime or 'container'}-{spec.replicas}x{spec.gpus}"
        by_kind.setdefault(kind, []).append(latency)
    emit("placement", "churn_decisions_per_s", len(specs) / elapsed, "decisions/s",
         rounds=len(specs), running=len(running), no_capacity=pending,
         p50_us=round(percentile(latencies, 0.5) * 1e6, 1),
         p99_us=round(percentile(latencies, 0.99) * 1e6, 1),
         mean_us_by_kind={kind: round(sum(v) / len(v) * 1e6, 1)
                          for kind, v in sorted(by_kind.items())},
         gpus_claimed_fraction=round(used / gpus, 3), includes="unclaim+place+claim",
         **shape, **machine())

    # Fill every unreserved GPU, then time the retries of jobs that cannot fit now.
    from contracts.model import JobSpec
    from nodes.ork.placement import NoCapacity, place

    one = JobSpec(name="fill", team="team-0", type="container", image=IMAGE, gpus=1)
    for _ in range(gpus):
        if not decide(cluster, one, running):
            break
    waiting = [spec for spec in job_specs(rng, 4000) if spec.team.startswith("team-")][:2000]
    refused = 0
    started = time.perf_counter()
    for spec in waiting:
        try:
            place(cluster, spec)
        except NoCapacity:
            refused += 1
    elapsed = time.perf_counter() - started
    emit("placement", "pending_retry_per_s", len(waiting) / elapsed, "decisions/s",
         retries=len(waiting), no_capacity=refused, running=len(running), **shape, **machine())


if __name__ == "__main__":
    main()
