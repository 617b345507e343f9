"""wrk-ork's capacity model: racks, nodes, reservations, claims, and the
free-GPU index the placement functions (:mod:`nodes.ork.placement`) read.

Theory of operation
-------------------
A worker reports its cluster as a :class:`~contracts.model.RackReport`;
:meth:`Capacity.set_rack` turns it into :class:`Node` records under a
:class:`Rack` listed in one location. wrk-ork *claims* GPUs on a node when it
places a replica and releases them when the replica is deleted. Claims are
wrk-ork's own bookkeeping, not the worker's: a report never resets them, and a
node that drops out of a report keeps its claims (as a *ghost*: no GPUs, not
schedulable) until they are released, so a worker that briefly under-reports
cannot make wrk-ork hand the same GPUs out twice. :meth:`Capacity.claim`
books new claims (checking each node still takes them), :meth:`Capacity.restore`
books the claims of replicas that already run (checking nothing) and
:meth:`Capacity.unclaim` gives them back.

Reservations are per (rack, node) → team and outlive reports, so a node that
comes back is still reserved. A team that has reserved nodes runs its jobs
only on those (seeds/architecture.txt, "Racks, nodes, and GPUs"); every other
team uses the unreserved nodes. So each node belongs to one *owner*: its team,
or None for the shared pool.

The index
---------
Placement wants, for a job of g GPUs per replica in location L for owner O,
the node with the fewest free GPUs that still holds g (best fit). Walking
100 racks of 32 nodes per decision costs milliseconds in Python; instead every
placeable node (present, schedulable, at least one GPU free) sits in buckets
keyed by its free count, kept up to date on every claim:

- :class:`RackPool` (one rack, one owner): free → node names, the same for
  InfiniBand nodes only, and a histogram of node sizes (the largest tells
  whether a replica "fits one node" there);
- :class:`LocationPool` (one location, one owner): free → {rack: how many of
  its nodes have exactly that many free}, plus the sorted list of free values
  present, so a best fit is one bisect, one ``min`` over the racks of that
  bucket and one ``min`` over that rack's names; the same for InfiniBand
  nodes, so the racks that could give a multi-node replica k shares are
  found without visiting the others.

Invariants (tests/nodes/ork/test_placement.py checks them with hypothesis):
``0 <= claimed``; a node is in exactly the buckets of its current free count
and owner, or in none when it is not placeable; ``LocationPool.free_total`` is
the sum of the free GPUs of its nodes. Falls short: ``min`` over a bucket is
linear in its size, which is fine for racks of tens of nodes and slow (but
correct) for racks of thousands.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contracts.model import RackReport, ReplicaPlacement, key_hex

__all__ = [
    "Capacity",
    "CapacityStatistics",
    "LocationPool",
    "NoCapacity",
    "Node",
    "NodeView",
    "PlacementError",
    "Rack",
    "RackPool",
    "RackView",
    "Unplaceable",
]

# Exception tree:
#
#   PlacementError            misuse: unknown rack/node, double reservation,
#   │                         removing a rack that holds claims, over-release
#   ├── Unplaceable           the job can never fit: fail it (code UNPLACEABLE)
#   └── NoCapacity            not now: keep it Pending (code NO_CAPACITY)


class PlacementError(Exception):
    """A placement or capacity operation was refused; ``str()`` is one line a
    user or operator can act on."""

    code = "PLACEMENT"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Unplaceable(PlacementError):
    """The job cannot run even on an empty cluster as registered: fail it."""

    code = "UNPLACEABLE"


class NoCapacity(PlacementError):
    """The job could run, but not with the GPUs free now: keep it Pending and
    try again when GPUs are released or capacity grows."""

    code = "NO_CAPACITY"


def short(rack: str) -> str:
    """A rack key as messages show it (like a git hash)."""
    return rack[:12]


class Node:
    """One node as wrk-ork books it (mutable; never handed out)."""

    __slots__ = ("claimed", "gpus", "infiniband", "lpool", "name", "owner", "present", "rack",
                 "rpool", "schedulable")

    def __init__(self, rack: str, name: str) -> None:
        self.rack = rack
        self.name = name
        self.gpus = 0
        self.claimed = 0
        self.schedulable = False
        self.infiniband = False
        #: False: a ghost, gone from the report but still holding claims.
        self.present = False
        self.owner: str | None = None
        #: The pools whose buckets hold this node; None when not indexed.
        self.rpool: RackPool | None = None
        self.lpool: LocationPool | None = None

    @property
    def free(self) -> int:
        # A node reported smaller than its claims has nothing free, not less.
        return max(0, self.gpus - self.claimed)


class RackPool:
    """The placeable nodes of one rack that one owner may use, by free GPUs."""

    __slots__ = ("at", "ib_at", "sizes")

    def __init__(self) -> None:
        self.at: dict[int, set[str]] = {}
        self.ib_at: dict[int, set[str]] = {}
        #: node size (GPUs) → how many schedulable nodes of that size.
        self.sizes: dict[int, int] = {}

    @property
    def largest(self) -> int:
        return max(self.sizes, default=0)


class LocationPool:
    """The placeable nodes of one location that one owner may use, by free GPUs."""

    __slots__ = ("free_total", "frees", "ib_frees", "ib_racks_at", "racks_at")

    def __init__(self) -> None:
        self.racks_at: dict[int, dict[str, int]] = {}
        #: The keys of ``racks_at``, sorted: best fit for g is bisect(frees, g).
        self.frees: list[int] = []
        #: The same for InfiniBand nodes only: which racks could give k shares.
        self.ib_racks_at: dict[int, dict[str, int]] = {}
        self.ib_frees: list[int] = []
        self.free_total = 0


class Rack:
    """One worker's cluster as last reported, plus wrk-ork's claims on it."""

    __slots__ = ("claimed", "isolated", "key", "location", "nodes", "overlay", "pools",
                 "report")

    def __init__(self, key: str, location: str) -> None:
        self.key = key
        self.location = location
        self.overlay = False
        #: Its worker runs isolated job networks (a WireGuard gateway each).
        self.isolated = False
        self.report: RackReport | None = None
        self.nodes: dict[str, Node] = {}
        self.pools: dict[str | None, RackPool] = {}
        #: GPUs claimed on this rack; a rack holding claims cannot be removed.
        self.claimed = 0


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as ``cosmicac nodes list`` shows it. ``free`` is GPUs not claimed
    (0 when the node reports fewer GPUs than are claimed on it); a node gone
    from its rack's report but still holding claims shows ``gpus=0`` and
    ``schedulable=False`` until they are released."""

    rack: str
    location: str
    name: str
    gpus: int
    free: int
    reserved_for: str | None
    schedulable: bool
    infiniband: bool


@dataclass(frozen=True, slots=True)
class RackView:
    """A rack as ``cosmicac racks list`` shows it: ``nodes`` is a count,
    ``gpus`` the reported total, ``free`` the unclaimed GPUs on schedulable
    nodes (whoever may use them)."""

    rack: str
    location: str
    nodes: int
    gpus: int
    free: int
    overlay_network: bool


@dataclass(frozen=True, slots=True)
class CapacityStatistics:
    """The size of the model (trio's ``statistics()`` convention)."""

    racks: int
    nodes: int
    gpus: int
    #: GPUs booked by claim()/restore() and not yet released.
    claimed_gpus: int


class Capacity:
    """Racks, nodes, reservations and claims, with the free-GPU index.

    Usage::

        capacity.set_rack(worker_key_hex, "default", report)
        placements = place(capacity, spec)   # Unplaceable → fail; NoCapacity → Pending
        capacity.claim(placements)           # NoCapacity if it raced; place again
        ...
        capacity.unclaim(placements)         # when the replicas are deleted
        capacity.restore(placements)         # on restart, for replicas already running

    Not thread-safe: wrk-ork drives it from one trio task. Where jobs go is
    decided by the functions of :mod:`nodes.ork.placement`, which only read it.
    """

    def __init__(self) -> None:
        self._racks: dict[str, Rack] = {}
        #: location → {rack key: Rack}, kept in rack-key order.
        self._by_location: dict[str, dict[str, Rack]] = {}
        self._pools: dict[tuple[str, str | None], LocationPool] = {}
        self._reservations: dict[tuple[str, str], str] = {}
        #: team → how many nodes it has reserved (present or not).
        self._team_nodes: dict[str, int] = {}
        #: Bumped whenever what could ever fit changes (not on claims).
        self._generation = 0
        #: Answers that depend only on what could ever fit (racks, nodes,
        #: reservations; not claims), kept for the placement functions and
        #: dropped with every change of those ("can this job ever fit" is asked
        #: again for every Pending job on every release).
        self.shape_memo: dict[tuple, str | None] = {}

    # -- racks -------------------------------------------------------------------

    def set_rack(self, rack: str, location: str, report: RackReport) -> None:
        """Add a rack or replace its capacity with a newer report.

        Args:
            rack: the worker's public key (hex).
            location: where the rack is listed.
            report: the worker's nodes; claims on nodes it no longer lists
                stay counted until released.

        Raises:
            PlacementError: ``rack`` is not a key.
        """
        try:
            key = key_hex(rack)
        except ValueError:
            raise PlacementError(f"rack {rack[:16]!r} is not a worker key (64 hex)") from None
        old = self._racks.get(key)
        if old is not None and old.location == location and old.report == report:
            return  # the common case: a periodic report that changed nothing
        if old is None:
            target = Rack(key, location)
            self._racks[key] = target
        else:
            target = old
            for node in old.nodes.values():
                self._unindex(node)
            if old.location != location:
                self._unlist(old)
                target.location = location
        racks = self._by_location.setdefault(location, {})
        if key not in racks:
            racks[key] = target
            self._by_location[location] = dict(sorted(racks.items()))
        target.overlay = report.overlay_network
        target.isolated = report.isolated_networks
        target.report = report
        nodes: dict[str, Node] = {}
        for info in report.nodes:
            node = target.nodes.get(info.name) or Node(key, info.name)
            node.gpus, node.schedulable = info.gpus, info.schedulable
            node.infiniband, node.present = info.infiniband, True
            nodes[info.name] = node
        for name, node in target.nodes.items():
            if name not in nodes and node.claimed:
                node.gpus, node.schedulable, node.infiniband, node.present = 0, False, False, False
                nodes[name] = node
        target.nodes = nodes
        for node in nodes.values():
            node.owner = self._reservations.get((key, node.name))
            self._index(node)
        self._changed()

    def remove_rack(self, rack: str) -> None:
        """Forget a rack and its reservations.

        Raises:
            PlacementError: unknown rack, or it still holds claims (delete its
                jobs' replicas first).
        """
        target = self._rack(rack)
        if target.claimed:
            raise PlacementError(f"rack {short(target.key)} still holds {target.claimed} claimed "
                                 "GPUs; delete the replicas running on it first")
        for node in target.nodes.values():
            self._unindex(node)
        for (key, name), team in list(self._reservations.items()):
            if key == target.key:
                self._unreserve(key, name, team)
        self._unlist(target)
        del self._racks[target.key]
        self._changed()

    def _unlist(self, rack: Rack) -> None:
        racks = self._by_location[rack.location]
        del racks[rack.key]
        if not racks:
            del self._by_location[rack.location]

    # -- reservations ------------------------------------------------------------

    def reserve(self, rack: str, node: str, team: str) -> None:
        """Reserve a node for a team: from now on only that team's jobs are
        placed on it, and that team's jobs only on its reserved nodes.
        Replicas already running on it stay until deleted.

        The node need not be in the rack's last report: a reservation belongs
        to (rack, node) and outlives reports, so wrk-ork restarting while a
        reserved node is briefly missing keeps the team on its own nodes. Check
        :meth:`nodes` first to refuse names that were never reported.

        Raises:
            PlacementError: unknown rack, or the node is reserved by another team.
        """
        key = self._rack(rack).key
        holder = self._reservations.get((key, node))
        if holder == team:
            return
        if holder is not None:
            raise PlacementError(f"node {node} of rack {short(key)} is reserved by "
                                 f"team {holder}; release it first")
        self._reservations[(key, node)] = team
        self._team_nodes[team] = self._team_nodes.get(team, 0) + 1
        target = self._racks[key].nodes.get(node)
        if target is not None:
            self._unindex(target)
            target.owner = team
            self._index(target)
        self._changed()

    def release(self, rack: str, node: str) -> None:
        """End a node's reservation (nothing happens if it has none).

        Raises:
            PlacementError: unknown rack.
        """
        key = self._rack(rack).key
        team = self._reservations.get((key, node))
        if team is not None:
            self._unreserve(key, node, team)
            self._changed()

    def _unreserve(self, key: str, name: str, team: str) -> None:
        del self._reservations[(key, name)]
        left = self._team_nodes[team] - 1
        if left:
            self._team_nodes[team] = left
        else:
            del self._team_nodes[team]
        node = self._racks[key].nodes.get(name)
        if node is not None:
            self._unindex(node)
            node.owner = None
            self._index(node)

    def owner_for(self, team: str) -> str | None:
        """The pool a team's jobs draw from: its reserved nodes, or the shared ones."""
        return team if team in self._team_nodes else None

    # -- views -------------------------------------------------------------------

    def free(self, rack: str, node: str) -> int:
        """GPUs of a node not claimed (whether or not it is schedulable)."""
        return self._node(rack, node).free

    def nodes(self) -> list[NodeView]:
        """Every node, by rack key then node name."""
        return [NodeView(r.key, r.location, n.name, n.gpus, n.free, n.owner, n.schedulable,
                         n.infiniband)
                for r in sorted(self._racks.values(), key=lambda r: r.key)
                for n in sorted(r.nodes.values(), key=lambda n: n.name)]

    def racks(self) -> list[RackView]:
        """Every rack, by rack key."""
        return [RackView(r.key, r.location, sum(n.present for n in r.nodes.values()),
                         sum(n.gpus for n in r.nodes.values()),
                         sum(n.free for n in r.nodes.values() if n.schedulable), r.overlay)
                for r in sorted(self._racks.values(), key=lambda r: r.key)]

    def statistics(self) -> CapacityStatistics:
        """A snapshot of the model's size and of the GPUs claimed."""
        racks = self._racks.values()
        return CapacityStatistics(
            racks=len(self._racks), nodes=sum(len(r.nodes) for r in racks),
            gpus=sum(n.gpus for r in racks for n in r.nodes.values()),
            claimed_gpus=sum(r.claimed for r in racks))

    def racks_in(self, location: str) -> Mapping[str, Rack]:
        """The racks listed in ``location``, by key (empty: none). Read only."""
        return self._by_location.get(location, {})

    def pool(self, location: str, owner: str | None) -> LocationPool | None:
        """The free-GPU index of ``owner``'s nodes in ``location`` (None: no such
        node was ever placeable). Read only."""
        return self._pools.get((location, owner))

    def _rack(self, rack: str) -> Rack:
        try:
            return self._racks[key_hex(rack)]
        except (KeyError, ValueError):
            raise PlacementError(f"no rack {short(rack)} is registered") from None

    def _node(self, rack: str, node: str) -> Node:
        target = self._rack(rack)
        found = target.nodes.get(node)
        if found is None or not found.present:
            raise PlacementError(f"rack {short(target.key)} reports no node {node}")
        return found

    # -- claims ------------------------------------------------------------------

    def claim(self, placements: Iterable[ReplicaPlacement]) -> None:
        """Book the GPUs of ``placements`` (all or none).

        Raises:
            NoCapacity: a rack or node is gone, unschedulable, or no longer has
                the GPUs free; nothing was booked: place the job again.
            PlacementError: a multi-node placement with unequal or repeated shares.
        """
        wanted = self._tally(placements, NoCapacity)
        for node, gpus in wanted.items():
            if not (node.present and node.schedulable):
                raise NoCapacity(f"node {node.name} of rack {short(node.rack)} takes no new "
                                 "replicas now (unschedulable or gone)")
            if node.free < gpus:
                raise NoCapacity(f"node {node.name} of rack {short(node.rack)} has {node.free} "
                                 f"GPUs free, {gpus} asked")
        for node, gpus in wanted.items():
            self._book(node, gpus)

    def restore(self, placements: Iterable[ReplicaPlacement]) -> None:
        """Book the GPUs of replicas that already run, e.g. when wrk-ork starts
        again and reloads its jobs after registering the racks.

        Running replicas are facts, so nothing is re-checked: a node that is
        now cordoned, smaller, or missing from the report still gets the
        claims (a missing one is kept as a ghost until they are released).

        Raises:
            PlacementError: a rack is not registered (call :meth:`set_rack`
                first), or a multi-node placement has unequal shares.
        """
        wanted: dict[tuple[Rack, str], int] = {}
        for placement in placements:
            rack = self._racks.get(placement.rack)
            if rack is None:
                raise PlacementError(f"rack {short(placement.rack)} is not registered; "
                                     "register racks before restoring their claims")
            _check_shares(placement)
            for share in placement.shares:
                wanted[(rack, share.node)] = wanted.get((rack, share.node), 0) + share.gpus
        for (rack, name), gpus in wanted.items():
            node = rack.nodes.get(name)
            if node is None:
                node = rack.nodes[name] = Node(rack.key, name)
                node.owner = self._reservations.get((rack.key, name))
            self._book(node, gpus)

    def unclaim(self, placements: Iterable[ReplicaPlacement]) -> None:
        """Give back the GPUs of ``placements`` (all or none), e.g. when their
        replicas are deleted; pending jobs may fit afterwards.

        Raises:
            PlacementError: a rack or node unknown, or more GPUs released than
                are claimed there.
        """
        wanted = self._tally(placements, PlacementError)
        for node, gpus in wanted.items():
            if node.claimed < gpus:
                raise PlacementError(f"node {node.name} of rack {short(node.rack)} holds "
                                     f"{node.claimed} claimed GPUs, {gpus} released")
        for node, gpus in wanted.items():
            self._book(node, -gpus)

    def _tally(self, placements: Iterable[ReplicaPlacement],
               missing: type[PlacementError]) -> dict[Node, int]:
        wanted: dict[Node, int] = {}
        for placement in placements:
            rack = self._racks.get(placement.rack)
            if rack is None:
                raise missing(f"rack {short(placement.rack)} is not registered")
            _check_shares(placement)
            for share in placement.shares:
                node = rack.nodes.get(share.node)
                if node is None:
                    raise missing(f"rack {short(rack.key)} has no node {share.node}")
                wanted[node] = wanted.get(node, 0) + share.gpus
        return wanted

    def _book(self, node: Node, gpus: int) -> None:
        """Add ``gpus`` (negative: release) to a node's claims, moving it between buckets."""
        before = node.free
        node.claimed += gpus
        self._racks[node.rack].claimed += gpus
        after = node.free
        if node.rpool is not None and before != after:
            self._take(node, before)
            self._put(node, after)
        if not node.present and not node.claimed:
            del self._racks[node.rack].nodes[node.name]  # a ghost whose last claim went

    # -- the index ---------------------------------------------------------------

    def _changed(self) -> None:
        self._generation += 1
        self.shape_memo.clear()

    def _index(self, node: Node) -> None:
        if not (node.present and node.schedulable):
            return
        rack = self._racks[node.rack]
        rpool = rack.pools.get(node.owner)
        if rpool is None:
            rpool = rack.pools[node.owner] = RackPool()
        lpool = self._pools.get((rack.location, node.owner))
        if lpool is None:
            lpool = self._pools[(rack.location, node.owner)] = LocationPool()
        rpool.sizes[node.gpus] = rpool.sizes.get(node.gpus, 0) + 1
        node.rpool, node.lpool = rpool, lpool
        self._put(node, node.free)

    def _unindex(self, node: Node) -> None:
        rpool = node.rpool
        if rpool is None:
            return
        self._take(node, node.free)
        left = rpool.sizes[node.gpus] - 1
        if left:
            rpool.sizes[node.gpus] = left
        else:
            del rpool.sizes[node.gpus]
        node.rpool = node.lpool = None

    @staticmethod
    def _put(node: Node, free: int) -> None:
        if free <= 0:
            return
        rpool, lpool = node.rpool, node.lpool
        assert rpool is not None and lpool is not None
        names = rpool.at.get(free)
        if names is None:
            names = rpool.at[free] = set()
        names.add(node.name)
        if node.infiniband:
            names = rpool.ib_at.get(free)
            if names is None:
                names = rpool.ib_at[free] = set()
            names.add(node.name)
        _count_in(lpool.racks_at, lpool.frees, free, node.rack)
        if node.infiniband:
            _count_in(lpool.ib_racks_at, lpool.ib_frees, free, node.rack)
        lpool.free_total += free

    @staticmethod
    def _take(node: Node, free: int) -> None:
        if free <= 0:
            return
        rpool, lpool = node.rpool, node.lpool
        assert rpool is not None and lpool is not None
        names = rpool.at[free]
        names.discard(node.name)
        if not names:
            del rpool.at[free]
        if node.infiniband:
            names = rpool.ib_at[free]
            names.discard(node.name)
            if not names:
                del rpool.ib_at[free]
        _count_out(lpool.racks_at, lpool.frees, free, node.rack)
        if node.infiniband:
            _count_out(lpool.ib_racks_at, lpool.ib_frees, free, node.rack)
        lpool.free_total -= free


def _check_shares(placement: ReplicaPlacement) -> None:
    shares = placement.shares
    if len(shares) > 1 and (len({s.node for s in shares}) != len(shares)
                            or len({s.gpus for s in shares}) != 1):
        raise PlacementError("a multi-node replica takes equal shares on distinct nodes")


def _count_in(racks_at: dict[int, dict[str, int]], frees: list[int], free: int,
              rack: str) -> None:
    racks = racks_at.get(free)
    if racks is None:
        racks = racks_at[free] = {}
        bisect.insort(frees, free)
    racks[rack] = racks.get(rack, 0) + 1


def _count_out(racks_at: dict[int, dict[str, int]], frees: list[int], free: int,
               rack: str) -> None:
    racks = racks_at[free]
    left = racks[rack] - 1
    if left:
        racks[rack] = left
    else:
        del racks[rack]
        if not racks:
            del racks_at[free]
            del frees[bisect.bisect_left(frees, free)]
