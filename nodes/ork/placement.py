"""Placement: which rack, which nodes and how many GPUs each, for one job.

The rules (seeds/architecture.txt, "Racks, nodes, and GPUs"):

- find a rack in the job's location and claim GPUs on the nodes of that rack
  the team may use: a team that has reserved nodes only on those, every other
  team only on unreserved nodes; unschedulable nodes get nothing new;
- a GPU Container Job runs on one node; so does a Parakeet or ``local``
  replica, and a vLLM replica that fits one node (runs as one VMI);
- a vLLM replica larger than every schedulable node of a rack the team may
  use takes k nodes of that rack, each giving gpus/k GPUs, on a rack with the
  overlay network and on InfiniBand nodes only; k is the smallest divisor
  ≥ 2 of the replica's GPUs for which k such nodes have gpus/k free each
  (fewest VMIs);
- a team that has reserved nodes anywhere runs only on its reserved nodes,
  so its jobs in a location where it reserved none are Unplaceable;
- all replicas of a job go on ONE rack, and placement is all-or-nothing:
  either every replica has a place now or nothing is placed.

Two ways to fail, because the orchestrator treats them differently:
:class:`Unplaceable` when the job could not run even if every GPU of the
location were free and every node schedulable (no rack there, a single-node
replica larger than any node the team may use, a vLLM replica no rack can
split, more replicas than one rack holds): the job becomes Failed with the
reason. :class:`NoCapacity` when it could, just not now: the job stays Pending
and holds nothing.

Best fit, to keep whole nodes whole for big replicas: a replica goes to the
node with the fewest free GPUs that still holds it, ties broken by rack key
then node name; for several replicas, racks are tried in order of their
tightest fitting node (then key) and packed best fit within the rack. The
answer is deterministic for a given capacity and its claims.

Placement is functions over a :class:`~nodes.ork.capacity.Capacity`:
:func:`place` only reads it and answers; :meth:`Capacity.claim` books the
answer (and re-checks it, since capacity may change between the two), and
:meth:`Capacity.unclaim` gives the GPUs back when replicas are deleted.
Falls short: packing several replicas is greedy, so a job that fits only with
a cleverer arrangement is reported as not fitting; the "could it ever fit"
check packs the same greedy way on an empty rack.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping

from contracts.model import JobSpec, JobType, NodeShare, ReplicaPlacement

from .capacity import (
    Capacity,
    LocationPool,
    NoCapacity,
    PlacementError,
    Rack,
    Unplaceable,
)

__all__ = [
    "NoCapacity",
    "PlacementError",
    "Unplaceable",
    "never_fits",
    "pack_single",
    "pack_spanning",
    "place",
]

#: Answers to "could this job ever fit" kept in ``Capacity.shape_memo`` between
#: capacity changes; the key has the team in it (for the message), so the bound
#: holds many teams' shapes.
NEVER_CACHE_SIZE = 4096

#: One replica's shares as (node name, GPUs), before they become a ReplicaPlacement.
Shares = list[tuple[str, int]]


@functools.cache
def spans(gpus: int) -> tuple[int, ...]:
    """The node counts k ≥ 2 a replica of ``gpus`` GPUs can be split into evenly."""
    return tuple(k for k in range(2, gpus + 1) if gpus % k == 0)


def pack_single(candidates: list[tuple[int, str]], gpus: int, replicas: int) -> list[Shares] | None:
    """Best-fit ``replicas`` single-node replicas onto one rack's nodes.

    Args:
        candidates: (free GPUs, node name) of the usable nodes, sorted; consumed.
        gpus: GPUs per replica.
        replicas: how many.

    Returns:
        One share list per replica, or None when they do not all fit.
    """
    placed: list[Shares] = []
    for _ in range(replicas):
        i = bisect.bisect_left(candidates, (gpus, ""))
        if i == len(candidates):
            return None
        free, name = candidates.pop(i)
        if free - gpus >= gpus:
            bisect.insort(candidates, (free - gpus, name))
        placed.append([(name, gpus)])
    return placed


def pack_spanning(candidates: list[tuple[int, str]], gpus: int,
                  replicas: int) -> list[Shares] | None:
    """Place ``replicas`` multi-node replicas on one rack's InfiniBand nodes.

    Each replica takes the smallest k (see :func:`spans`) for which k distinct
    nodes have ``gpus // k`` free, choosing the k tightest such nodes.

    Args:
        candidates: (free GPUs, node name) of the usable InfiniBand nodes,
            sorted; consumed.

    Returns:
        One share list per replica (equal shares, distinct nodes, by node
        name), or None when they do not all fit.
    """
    placed: list[Shares] = []
    for _ in range(replicas):
        for k in spans(gpus):
            share = gpus // k
            i = bisect.bisect_left(candidates, (share, ""))
            if len(candidates) - i >= k:
                taken = candidates[i:i + k]
                del candidates[i:i + k]
                for free, name in taken:
                    if free > share:
                        bisect.insort(candidates, (free - share, name))
                placed.append(sorted((name, share) for _, name in taken))
                break
        else:
            return None
    return placed


def _placements(rack: str, packed: list[Shares]) -> tuple[ReplicaPlacement, ...]:
    return tuple(ReplicaPlacement(rack=rack, shares=tuple(
        NodeShare(node=name, gpus=gpus) for name, gpus in shares)) for shares in packed)


def _what(spec: JobSpec) -> str:
    if spec.type is JobType.CONTAINER:
        return "a GPU Container Job"
    return f"a {spec.runtime.value if spec.runtime else ''} replica".replace("vllm", "vLLM")


def place(capacity: Capacity, spec: JobSpec) -> tuple[ReplicaPlacement, ...]:
    """Where each replica of ``spec`` would run now; nothing is claimed.

    Args:
        capacity: the racks, reservations and claims to place on; only read
            (its ``shape_memo`` may learn an answer).
        spec: the job.

    Returns:
        One placement per replica, all on one rack; book them with
        :meth:`Capacity.claim` before publishing the create operations.

    Raises:
        Unplaceable: the job can never run as the location is registered.
        NoCapacity: it could, but not with the GPUs free now.
    """
    racks = capacity.racks_in(spec.location)
    if not racks:
        raise Unplaceable(f"no rack is registered in location {spec.location}")
    owner = capacity.owner_for(spec.team)
    gpus = spec.gpus
    if spec.replicas == 1 and not spec.isolated_network:
        # The common case, in O(log sizes): the globally tightest node. A
        # node holding the replica means its rack places it on one node,
        # which ranks before every multi-node option.
        lpool = capacity.pool(spec.location, owner)
        if lpool is not None:
            frees = lpool.frees
            i = bisect.bisect_left(frees, gpus)
            if i < len(frees):
                free = frees[i]
                key = min(lpool.racks_at[free])
                name = min(racks[key].pools[owner].at[free])
                return (ReplicaPlacement(rack=key, shares=(NodeShare(node=name, gpus=gpus),)),)
    if spec.replicas > 1 or spec.may_span_nodes or spec.isolated_network:
        # (an isolated network: only racks that offer one, so the walk filters them)
        found = _search(capacity.pool(spec.location, owner), spec, owner, racks)
        if found is not None:
            return found
    reason = never_fits(capacity, spec)
    if reason is not None:
        raise Unplaceable(reason)
    raise NoCapacity(_no_room(capacity.pool(spec.location, owner), spec, owner))


def never_fits(capacity: Capacity, spec: JobSpec) -> str | None:
    """Why ``spec`` could not run even on an empty location, or None if it could.

    Memoised in ``capacity.shape_memo`` until racks, nodes or reservations
    change, so Pending jobs retried on every release cost one dict lookup here.
    """
    owner = capacity.owner_for(spec.team)
    key = (spec.location, owner, spec.may_span_nodes, spec.type, spec.runtime, spec.gpus,
           spec.replicas, spec.team, spec.isolated_network)
    memo = capacity.shape_memo
    try:
        return memo[key]
    except KeyError:
        pass
    reason = _never_reason(spec, owner, capacity.racks_in(spec.location))
    if len(memo) >= NEVER_CACHE_SIZE:
        memo.clear()  # at the bound: recompute; each answer is one pass
    memo[key] = reason
    return reason


def _search(lpool: LocationPool | None, spec: JobSpec, owner: str | None,
            racks: Mapping[str, Rack]) -> tuple[ReplicaPlacement, ...] | None:
    """The first rack, in preference order, that holds the whole job now.

    Single-node racks come first, by their tightest fitting node then key;
    then (vLLM only) racks every usable node of which is smaller than the
    replica, by the fewest nodes the first replica would take, then key.
    Both walks start from the location's free buckets, so racks without
    room are never visited.
    """
    if lpool is None:
        return None
    gpus, replicas = spec.gpus, spec.replicas
    frees = lpool.frees
    seen: set[str] = set()
    for free in frees[bisect.bisect_left(frees, gpus):]:
        for key in sorted(lpool.racks_at[free]):
            if key in seen:
                continue
            seen.add(key)
            if spec.isolated_network and not racks[key].isolated:
                continue
            rpool = racks[key].pools[owner]
            room = 0
            for f, names in rpool.at.items():
                if f >= gpus:
                    room += len(names) * (f // gpus)
            if room >= replicas:
                packed = pack_single(sorted((f, name) for f, names in rpool.at.items()
                                            if f >= gpus for name in names), gpus, replicas)
                if packed is not None:  # always, given the room
                    return _placements(key, packed)
    if not spec.may_span_nodes:
        return None
    ib_frees = lpool.ib_frees
    for k in spans(gpus):
        share = gpus // k
        counts: dict[str, int] = {}
        for free in ib_frees[bisect.bisect_left(ib_frees, share):]:
            for key, count in lpool.ib_racks_at[free].items():
                counts[key] = counts.get(key, 0) + count
        for key in sorted(key for key, count in counts.items() if count >= k):
            if key in seen:
                continue  # tried already: at a smaller k, or it places single-node
            seen.add(key)
            rack = racks[key]
            rpool = rack.pools[owner]
            if not rack.overlay or rpool.largest >= gpus:
                continue
            packed = pack_spanning(sorted((f, name) for f, names in rpool.ib_at.items()
                                          for name in names), gpus, replicas)
            if packed is not None:
                return _placements(key, packed)
    return None

def _never_reason(spec: JobSpec, owner: str | None, racks: Mapping[str, Rack]) -> str | None:
    gpus, replicas, span = spec.gpus, spec.replicas, spec.may_span_nodes
    location = spec.location
    largest = 0
    reserved_elsewhere = False
    overlay = False
    if spec.isolated_network:
        racks = {key: rack for key, rack in racks.items() if rack.isolated}
        if not racks:
            return (f"an isolated network needs a rack whose worker runs WireGuard gateways "
                    f"(kubevirt.wireguard_endpoint set), and no rack in location {location} "
                    "has one")
    for rack in racks.values():
        nodes = []
        for node in rack.nodes.values():
            if node.present and node.gpus:
                if node.owner == owner:
                    nodes.append(node)
                else:
                    reserved_elsewhere = True
        if not nodes:
            continue
        overlay = overlay or rack.overlay
        size = max(node.gpus for node in nodes)
        largest = max(largest, size)
        if size >= gpus:
            if sum(node.gpus // gpus for node in nodes) >= replicas:
                return None
        elif span and rack.overlay:
            candidates = sorted((node.gpus, node.name) for node in nodes if node.infiniband)
            if pack_spanning(candidates, gpus, replicas) is not None:
                return None
    if owner is not None:
        scope = f"reserved by team {owner} "
    else:
        scope = "not reserved by a team " if reserved_elsewhere else ""
    if not largest:
        if owner is not None:
            return (f"team {owner} runs its jobs only on the nodes it reserved, and none of "
                    f"them with GPUs is in location {location}")
        return (f"every node with GPUs in location {location} is reserved by a team, and "
                f"team {spec.team} has reserved none")
    if gpus > largest and not span:
        return (f"{_what(spec)} runs on one node: {gpus} GPUs asked, the largest node "
                f"{scope}in location {location} holds {largest}")
    if gpus > largest:
        if not overlay:
            return (f"a vLLM replica of {gpus} GPUs is larger than any node {scope}in location "
                    f"{location} (the largest holds {largest}), so it must span nodes, and "
                    "no rack there has an overlay network")
        return (f"a vLLM replica of {gpus} GPUs must span nodes (the largest {scope}in "
                f"location {location} holds {largest}), each giving the same number of "
                "GPUs over InfiniBand, and no rack there with an overlay network has enough "
                f"InfiniBand nodes {scope}for {replicas} such replica(s)")
    return (f"the {replicas} replicas of {gpus} GPUs must all run on one rack, and no rack in "
            f"location {location} holds that many on nodes {scope}even when empty")

def _no_room(lpool: LocationPool | None, spec: JobSpec, owner: str | None) -> str:
    total = lpool.free_total if lpool is not None else 0
    most = lpool.frees[-1] if lpool is not None and lpool.frees else 0
    who = f"the nodes team {owner} reserved" if owner is not None else "unreserved nodes"
    many = f"{spec.replicas} replicas" if spec.replicas > 1 else "1 replica"
    return (f"no room now in location {spec.location} for {many} of {spec.gpus} GPUs: "
            f"{total} GPUs free on {who}, at most {most} on one node; the job waits "
            "until GPUs are released")
