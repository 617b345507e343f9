"""Placement: every rule of seeds/architecture.txt as a table row,
the bookkeeping around it, and hypothesis runs of place/claim/unclaim."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.model import JobSpec, NodeInfo, RackReport, ReplicaPlacement
from nodes.ork.capacity import Capacity
from nodes.ork.placement import NoCapacity, PlacementError, Unplaceable, never_fits, place
from tests.examples import examples

IMAGE = "docker://registry.local/img:1"


def key(alias: str) -> str:
    """Rack "a" is the worker key "aaaa…" (64 hex)."""
    return alias * 64


@dataclass(frozen=True)
class N:
    """A node of a table row: ``used`` GPUs are claimed before the job is placed."""

    name: str
    gpus: int = 8
    ib: bool = False
    cordoned: bool = False
    used: int = 0
    team: str | None = None


@dataclass(frozen=True)
class R:
    alias: str
    nodes: tuple[N, ...]
    location: str = "default"
    overlay: bool = False


def rack(alias: str, *nodes: N, location: str = "default", overlay: bool = False) -> R:
    return R(alias, nodes, location, overlay)


def container(gpus: int, team: str = "t", location: str = "default") -> JobSpec:
    return JobSpec(name="j", team=team, type="container", image=IMAGE, gpus=gpus,
                   location=location)


def inference(gpus: int, runtime: str = "vllm", replicas: int = 1, team: str = "t",
              location: str = "default") -> JobSpec:
    return JobSpec(name="j", team=team, type="inference", image=IMAGE, gpus=gpus,
                   replicas=replicas, runtime=runtime, model="m", location=location)


def build(racks: list[R]) -> Capacity:
    capacity = Capacity()
    for r in racks:
        capacity.set_rack(key(r.alias), r.location, RackReport(
            nodes=tuple(NodeInfo(name=n.name, gpus=n.gpus, infiniband=n.ib,
                                 schedulable=not n.cordoned) for n in r.nodes),
            overlay_network=r.overlay))
        for n in r.nodes:
            if n.team:
                capacity.reserve(key(r.alias), n.name, n.team)
    for r in racks:  # claims after the reservations, as a cordon would leave them
        for n in r.nodes:
            if n.used:
                capacity._book(capacity._racks[key(r.alias)].nodes[n.name], n.used)
    return capacity


def shown(placements: tuple[ReplicaPlacement, ...]) -> list[str]:
    """"a:n1=8,n2=8" per replica: rack alias, then node=GPUs per share."""
    return [f"{p.rack[0]}:" + ",".join(f"{s.node}={s.gpus}" for s in p.shares)
            for p in placements]


@dataclass(frozen=True)
class Case:
    id: str
    racks: list[R]
    job: JobSpec
    expect: list[str] | type[PlacementError]
    reason: str = ""
    extra: dict = field(default_factory=dict)


EIGHT_IB = (N("n1", ib=True), N("n2", ib=True), N("n3", ib=True), N("n4", ib=True))

CASES = [
    # -- best fit, deterministic order --------------------------------------------------
    Case("a container job takes the node with the fewest free gpus that still fits",
         [rack("a", N("n1"), N("n2", used=5), N("n3", used=7))], container(2), ["a:n2=2"]),
    Case("equally free nodes are chosen by name",
         [rack("a", N("n2"), N("n1"), N("n3"))], container(4), ["a:n1=4"]),
    Case("equally free nodes on several racks go to the first rack key",
         [rack("b", N("n1")), rack("a", N("n1"))], container(8), ["a:n1=8"]),
    Case("a tighter node on a later rack beats the rack order",
         [rack("a", N("n1")), rack("b", N("n1", used=6))], container(2), ["b:n1=2"]),
    Case("a node whose free gpus are all claimed gets nothing",
         [rack("a", N("n1", used=8), N("n2", gpus=4))], container(1), ["a:n2=1"]),
    # -- locations ----------------------------------------------------------------------
    Case("a job goes only to racks of its location",
         [rack("a", N("n1", used=6)), rack("b", N("n1"), location="eu")],
         container(4, location="eu"), ["b:n1=4"]),
    Case("a job in a location without racks can never run",
         [rack("a", N("n1"))], container(1, location="mars"), Unplaceable,
         "no rack is registered in location mars"),
    # -- single-node jobs -----------------------------------------------------------------
    Case("a container job larger than every node fails with a reason to act on",
         [rack("a", N("n1"), N("n2"))], container(9), Unplaceable,
         "a GPU Container Job runs on one node: 9 GPUs asked, the largest node in location "
         "default holds 8"),
    Case("a container job never spans nodes even with infiniband and an overlay",
         [rack("a", *EIGHT_IB, overlay=True)], container(16), Unplaceable,
         "runs on one node: 16 GPUs asked"),
    Case("a container job that fits a node but not the free gpus waits",
         [rack("a", N("n1", used=4), N("n2", used=2))], container(8), NoCapacity,
         "no room now in location default for 1 replica of 8 GPUs: 10 GPUs free"),
    Case("a parakeet replica larger than every node fails",
         [rack("a", *EIGHT_IB, overlay=True)], inference(16, "parakeet"), Unplaceable,
         "a parakeet replica runs on one node: 16 GPUs asked"),
    Case("a local runtime replica larger than every node fails",
         [rack("a", N("n1", gpus=2))], inference(3, "local"), Unplaceable,
         "a local replica runs on one node: 3 GPUs asked, the largest node in location "
         "default holds 2"),
    Case("a parakeet replica that fits takes one node",
         [rack("a", N("n1"), N("n2", used=4))], inference(4, "parakeet"), ["a:n2=4"]),
    # -- vLLM -----------------------------------------------------------------------------
    Case("a vllm replica that fits one node runs as one vmi",
         [rack("a", *EIGHT_IB, overlay=True)], inference(8), ["a:n1=8"]),
    Case("a vllm replica that fits one node waits rather than spanning",
         [rack("a", N("n1", ib=True, used=4), N("n2", ib=True, used=4), overlay=True)],
         inference(8), NoCapacity),
    Case("a vllm replica larger than a node spans nodes with equal shares",
         [rack("a", *EIGHT_IB, overlay=True)], inference(16), ["a:n1=8,n2=8"]),
    Case("a spanning vllm replica takes the fewest nodes",
         [rack("a", *EIGHT_IB, overlay=True)], inference(12), ["a:n1=6,n2=6"]),
    Case("a spanning vllm replica takes more nodes when the fewest have no room",
         [rack("a", *(N(f"n{i}", ib=True, used=4) for i in range(1, 5)), overlay=True)],
         inference(16), ["a:n1=4,n2=4,n3=4,n4=4"]),
    Case("a spanning vllm replica takes the tightest infiniband nodes",
         [rack("a", N("n1", ib=True), N("n2", ib=True, used=2), N("n3", ib=True, used=1),
               overlay=True)], inference(12), ["a:n2=6,n3=6"]),
    Case("a spanning vllm replica needs the overlay network",
         [rack("a", *EIGHT_IB)], inference(16), Unplaceable,
         "no rack there has an overlay network"),
    Case("a spanning vllm replica uses infiniband nodes only",
         [rack("a", N("n1", ib=True), N("n2", ib=True), N("n3"), N("n4"), overlay=True)],
         inference(24), Unplaceable, "enough InfiniBand nodes"),
    Case("a spanning vllm replica that could fit an empty rack waits",
         [rack("a", N("n1", ib=True, used=1), N("n2", ib=True), N("n3", ib=True, used=3),
               overlay=True)], inference(16), NoCapacity),
    Case("a spanning vllm replica takes its nodes from one rack",
         [rack("a", N("n1", ib=True), overlay=True), rack("b", N("n1", ib=True), overlay=True)],
         inference(16), Unplaceable),
    Case("a vllm replica prefers one bigger node on another rack to spanning",
         [rack("a", *EIGHT_IB, overlay=True), rack("b", N("big", gpus=16))],
         inference(16), ["b:big=16"]),
    Case("a vllm replica spans when the bigger node elsewhere is busy",
         [rack("a", *EIGHT_IB, overlay=True), rack("b", N("big", gpus=16, used=1))],
         inference(16), ["a:n1=8,n2=8"]),
    Case("a spanning vllm replica goes to the rack where it takes the fewest nodes",
         [rack("a", *(N(f"n{i}", ib=True, used=4) for i in range(1, 5)), overlay=True),
          rack("b", N("n1", ib=True), N("n2", ib=True), overlay=True)],
         inference(16), ["b:n1=8,n2=8"]),
    Case("a spanning vllm replica skips a rack without the overlay network",
         [rack("a", *EIGHT_IB), rack("b", *EIGHT_IB, overlay=True)],
         inference(16), ["b:n1=8,n2=8"]),
    Case("a spanning vllm replica skips a rack that has a node big enough",
         [rack("a", N("big", gpus=16, used=4), *EIGHT_IB, overlay=True),
          rack("b", *EIGHT_IB, overlay=True)], inference(16), ["b:n1=8,n2=8"]),
    Case("spanning vllm replicas of one job share the rack",
         [rack("a", *EIGHT_IB, overlay=True)], inference(16, replicas=2),
         ["a:n1=8,n2=8", "a:n3=8,n4=8"]),
    # -- replicas on one rack, all or nothing ---------------------------------------------
    Case("a job's replicas all go on one rack",
         [rack("a", N("n1")), rack("b", N("n1"), N("n2"))], inference(8, replicas=2),
         ["b:n1=8", "b:n2=8"]),
    Case("replicas that no rack could hold even empty fail",
         [rack("a", N("n1")), rack("b", N("n1"))], inference(8, replicas=2), Unplaceable,
         "the 2 replicas of 8 GPUs must all run on one rack"),
    Case("a job whose replicas do not all fit now takes nothing and waits",
         [rack("a", N("n1"), N("n2", used=1))], inference(8, replicas=2), NoCapacity,
         "for 2 replicas of 8 GPUs"),
    Case("replicas pack best fit within the rack",
         [rack("a", N("n1"), N("n2", used=4))], inference(2, replicas=3),
         ["a:n2=2", "a:n2=2", "a:n1=2"]),
    Case("several replicas go to the rack with the tightest fitting node",
         [rack("a", N("n1"), N("n2")), rack("b", N("n1", used=4), N("n2", used=4))],
         inference(4, replicas=2), ["b:n1=4", "b:n2=4"]),
    Case("several replicas skip a tight rack that cannot hold them all",
         [rack("a", N("n1"), N("n2")), rack("b", N("n1", used=4), N("n2", used=6))],
         inference(4, replicas=2), ["a:n1=4", "a:n1=4"]),
    # -- reservations ---------------------------------------------------------------------
    Case("a team with reserved nodes runs only on them",
         [rack("a", N("n1", used=6), N("n2", team="t"))], container(2), ["a:n2=2"]),
    Case("a team without reservations skips reserved nodes",
         [rack("a", N("n1", used=6, team="u"), N("n2"))], container(2), ["a:n2=2"]),
    Case("a team whose reserved nodes are full waits even with free shared nodes",
         [rack("a", N("n1", team="t", used=8), N("n2"))], container(2), NoCapacity,
         "on the nodes team t reserved"),
    Case("a team whose reserved nodes are all in another location fails there",
         [rack("a", N("n1", team="t")), rack("b", N("n1"), location="eu")],
         container(1, location="eu"), Unplaceable,
         "team t runs its jobs only on the nodes it reserved"),
    Case("a team without reservations fails where every node is reserved by others",
         [rack("a", N("n1", team="u"), N("n2", team="v"))], container(1), Unplaceable,
         "every node with GPUs in location default is reserved by a team"),
    Case("a reservation on a smaller node bounds the team's single-node jobs",
         [rack("a", N("n1", gpus=4, team="t"), N("n2"))], container(8), Unplaceable,
         "the largest node reserved by team t in location default holds 4"),
    # -- unschedulable nodes --------------------------------------------------------------
    Case("an unschedulable node gets nothing new",
         [rack("a", N("n1", cordoned=True, used=6), N("n2"))], container(2), ["a:n2=2"]),
    Case("a job that only a cordoned node could hold waits for it",
         [rack("a", N("n1", gpus=16, cordoned=True), N("n2"))], container(16), NoCapacity),
    Case("nodes without gpus hold nothing",
         [rack("a", N("n1", gpus=0))], container(1), Unplaceable),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id.replace(" ", "_") for c in CASES])
def test_placement_rules(case: Case) -> None:
    capacity = build(case.racks)
    before = capacity.nodes()
    if isinstance(case.expect, list):
        placements = place(capacity, case.job)
        assert shown(placements) == case.expect
        assert capacity.nodes() == before  # placing claims nothing
        capacity.claim(placements)
        capacity.unclaim(placements)
        assert capacity.nodes() == before
    else:
        with pytest.raises(case.expect) as caught:
            place(capacity, case.job)
        assert type(caught.value) is case.expect
        assert case.reason in str(caught.value)
        assert "\n" not in str(caught.value)
        assert capacity.nodes() == before


# -- bookkeeping --------------------------------------------------------------------------


def one_rack(*nodes: N, overlay: bool = False) -> Capacity:
    return build([rack("a", *nodes, overlay=overlay)])


def report(*nodes: N, overlay: bool = False) -> RackReport:
    return RackReport(nodes=tuple(NodeInfo(name=n.name, gpus=n.gpus, infiniband=n.ib,
                                           schedulable=not n.cordoned) for n in nodes),
                      overlay_network=overlay)


def test_errors_share_one_base_and_carry_a_code() -> None:
    assert issubclass(Unplaceable, PlacementError)
    assert issubclass(NoCapacity, PlacementError)
    assert (Unplaceable("x").code, NoCapacity("x").code) == ("UNPLACEABLE", "NO_CAPACITY")


def test_claim_books_the_gpus_and_unclaim_gives_them_back() -> None:
    capacity = one_rack(N("n1"))
    placements = place(capacity, container(3))
    capacity.claim(placements)
    assert capacity.free(key("a"), "n1") == 5
    assert shown(place(capacity, container(5))) == ["a:n1=5"]
    capacity.unclaim(placements)
    assert capacity.free(key("a"), "n1") == 8


def test_claim_rechecks_and_books_nothing_when_a_share_no_longer_fits() -> None:
    capacity = one_rack(N("n1"), N("n2"))
    placements = place(capacity, inference(8, replicas=2))
    capacity.claim(place(capacity, container(1)))  # n1 now has 7 free
    with pytest.raises(NoCapacity, match="node n1 of rack aaaaaaaaaaaa has 7 GPUs free"):
        capacity.claim(placements)
    assert capacity.free(key("a"), "n2") == 8  # all or nothing


def test_claim_refuses_a_node_cordoned_since_placement() -> None:
    capacity = one_rack(N("n1"))
    placements = place(capacity, container(1))
    capacity.set_rack(key("a"), "default", report(N("n1", cordoned=True)))
    with pytest.raises(NoCapacity, match="takes no new replicas"):
        capacity.claim(placements)


def test_claim_refuses_a_rack_removed_since_placement() -> None:
    capacity = one_rack(N("n1"))
    placements = place(capacity, container(1))
    capacity.remove_rack(key("a"))
    with pytest.raises(NoCapacity, match="not registered"):
        capacity.claim(placements)


def test_claim_refuses_unequal_multi_node_shares() -> None:
    capacity = one_rack(N("n1", ib=True), N("n2", ib=True), overlay=True)
    bad = ReplicaPlacement.model_validate({"rack": key("a"), "shares": [
        {"node": "n1", "gpus": 8}, {"node": "n2", "gpus": 4}]})
    with pytest.raises(PlacementError, match="equal shares"):
        capacity.claim([bad])


def test_unclaiming_more_than_was_claimed_is_refused() -> None:
    capacity = one_rack(N("n1"))
    placements = place(capacity, container(2))
    with pytest.raises(PlacementError, match="holds 0 claimed GPUs, 2 released"):
        capacity.unclaim(placements)


def test_a_rack_holding_claims_cannot_be_removed() -> None:
    capacity = one_rack(N("n1"))
    placements = place(capacity, container(2))
    capacity.claim(placements)
    with pytest.raises(PlacementError, match="still holds 2 claimed GPUs"):
        capacity.remove_rack(key("a"))
    capacity.unclaim(placements)
    capacity.remove_rack(key("a"))
    assert capacity.racks() == []
    with pytest.raises(Unplaceable, match="no rack is registered"):
        place(capacity, container(1))


def test_claims_on_a_node_that_vanished_stay_counted_until_released() -> None:
    capacity = one_rack(N("n1"), N("n2"))
    placements = place(capacity, container(8))
    capacity.claim(placements)
    capacity.set_rack(key("a"), "default", report(N("n2")))
    ghost = next(n for n in capacity.nodes() if n.name == "n1")
    assert (ghost.gpus, ghost.free, ghost.schedulable) == (0, 0, False)
    capacity.set_rack(key("a"), "default", report(N("n1"), N("n2")))  # it comes back
    assert capacity.free(key("a"), "n1") == 0
    capacity.set_rack(key("a"), "default", report(N("n2")))
    capacity.unclaim(placements)
    assert [n.name for n in capacity.nodes()] == ["n2"]
    capacity.remove_rack(key("a"))


def test_a_node_reported_smaller_than_its_claims_has_nothing_free() -> None:
    capacity = one_rack(N("n1"))
    placements = place(capacity, container(6))
    capacity.claim(placements)
    capacity.set_rack(key("a"), "default", report(N("n1", gpus=4)))
    assert capacity.free(key("a"), "n1") == 0
    with pytest.raises(NoCapacity):
        place(capacity, container(1))
    capacity.unclaim(placements)
    assert capacity.free(key("a"), "n1") == 4


def test_reservations_outlive_reports_and_refuse_another_team() -> None:
    capacity = one_rack(N("n1"), N("n2"))
    capacity.reserve(key("a"), "n1", "t")
    capacity.reserve(key("a"), "n1", "t")  # again: nothing changes
    with pytest.raises(PlacementError, match="reserved by team t"):
        capacity.reserve(key("a"), "n1", "u")
    capacity.set_rack(key("a"), "default", report(N("n2")))
    capacity.set_rack(key("a"), "default", report(N("n1"), N("n2")))
    assert [n.reserved_for for n in capacity.nodes()] == ["t", None]
    assert shown(place(capacity, container(1, team="t"))) == ["a:n1=1"]
    capacity.release(key("a"), "n1")
    capacity.release(key("a"), "n1")  # not reserved: nothing happens
    assert [n.reserved_for for n in capacity.nodes()] == [None, None]
    capacity.reserve(key("a"), "n1", "u")


def test_a_node_reserved_before_it_is_reported_is_the_teams_when_it_appears() -> None:
    capacity = one_rack(N("n1"))
    capacity.reserve(key("a"), "n9", "t")
    with pytest.raises(Unplaceable, match="team t runs its jobs only on the nodes it reserved"):
        place(capacity, container(1, team="t"))
    capacity.set_rack(key("a"), "default", report(N("n1"), N("n9")))
    assert shown(place(capacity, container(1, team="t"))) == ["a:n9=1"]
    assert shown(place(capacity, container(8, team="u"))) == ["a:n1=8"]


def test_reserving_on_an_unknown_rack_or_setting_a_bad_key_is_refused() -> None:
    capacity = one_rack(N("n1"))
    with pytest.raises(PlacementError, match="no rack bbbbbbbbbbbb"):
        capacity.reserve(key("b"), "n1", "t")
    with pytest.raises(PlacementError, match="not a worker key"):
        capacity.set_rack("nope", "default", report(N("n1")))


def test_a_rack_can_move_to_another_location() -> None:
    capacity = one_rack(N("n1"))
    capacity.set_rack(key("a"), "eu", report(N("n1")))
    assert shown(place(capacity, container(1, location="eu"))) == ["a:n1=1"]
    with pytest.raises(Unplaceable, match="location default"):
        place(capacity, container(1))


def test_views_sum_what_the_racks_report() -> None:
    capacity = build([rack("a", N("n1", ib=True, used=3), N("n2", gpus=4, cordoned=True),
                          overlay=True)])
    (view,) = capacity.racks()
    assert (view.location, view.nodes, view.gpus, view.free, view.overlay_network) == (
        "default", 2, 12, 5, True)
    n1, n2 = capacity.nodes()
    assert (n1.free, n1.infiniband, n1.schedulable) == (5, True, True)
    assert (n2.free, n2.schedulable) == (4, False)


def test_an_unchanged_report_keeps_the_answers_it_gave() -> None:
    capacity = one_rack(N("n1"))
    with pytest.raises(Unplaceable):
        place(capacity, container(9))
    generation = capacity._generation
    capacity.set_rack(key("a"), "default", report(N("n1")))
    assert capacity._generation == generation
    capacity.set_rack(key("a"), "default", report(N("n1", gpus=16)))
    assert shown(place(capacity, container(9))) == ["a:n1=9"]


# -- hypothesis: random clusters, random place/claim/unclaim/report sequences ------------

TEAMS = ("t0", "t1", "t2")  # t0 never reserves nodes
LOCATIONS = ("default", "eu")

nodes_st = st.lists(
    st.builds(N, name=st.sampled_from(["n0", "n1", "n2", "n3"]),
              gpus=st.sampled_from([0, 4, 8, 8, 8]), ib=st.sampled_from([False, True, True, True]),
              cordoned=st.sampled_from([False, False, False, True]),
              team=st.sampled_from([None, None, None, "t1"])),
    min_size=2, max_size=4, unique_by=lambda n: n.name)
racks_st = st.lists(st.builds(R, alias=st.sampled_from("abc"), nodes=nodes_st.map(tuple),
                              location=st.sampled_from(LOCATIONS[:1] * 3 + LOCATIONS),
                              overlay=st.sampled_from([False, True, True])),
                    min_size=1, max_size=3, unique_by=lambda r: r.alias)


@st.composite
def jobs(draw) -> JobSpec:
    kind = draw(st.sampled_from(["container", "vllm", "vllm", "parakeet"]))
    gpus = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 16, 24]))
    team = draw(st.sampled_from(TEAMS))
    location = draw(st.sampled_from(LOCATIONS[:1] * 3 + LOCATIONS))
    if kind == "container":
        return container(gpus, team=team, location=location)
    replicas = draw(st.sampled_from([1, 1, 2, 3]))
    return inference(gpus, kind, replicas=replicas, team=team, location=location)


places = st.tuples(st.just("place"), jobs())
ops_st = st.lists(st.one_of(
    places, places, places,
    st.tuples(st.just("unclaim"), st.integers(0, 50)),
    st.tuples(st.just("report"), st.integers(0, 2), st.integers(0, 3),
              st.sampled_from(["drop", "cordon", "restore"])),
    st.tuples(st.just("reserve"), st.integers(0, 2), st.integers(0, 3),
              st.sampled_from([None, "t1", "t2"]))), min_size=1, max_size=40)


def check_index(capacity: Capacity) -> None:
    """The incremental buckets equal buckets rebuilt from the nodes."""
    at: dict = {}
    ib_at: dict = {}
    totals: dict = {}
    for r in capacity._racks.values():
        for n in r.nodes.values():
            indexed = n.present and n.schedulable
            assert (n.rpool is not None) == indexed
            if indexed and n.free:
                for index in (at, ib_at) if n.infiniband else (at,):
                    index.setdefault((r.location, n.owner), {}).setdefault(
                        n.free, {}).setdefault(r.key, set()).add(n.name)
                totals[(r.location, n.owner)] = totals.get((r.location, n.owner), 0) + n.free
    seen: dict = {}
    ib_seen: dict = {}
    for (location, owner), pool in capacity._pools.items():
        assert pool.frees == sorted(pool.racks_at)
        assert pool.ib_frees == sorted(pool.ib_racks_at)
        assert pool.free_total == totals.get((location, owner), 0)
        for buckets, field_, found in ((pool.racks_at, "at", seen),
                                       (pool.ib_racks_at, "ib_at", ib_seen)):
            for free, racks in buckets.items():
                for rack_key, count in racks.items():
                    names = getattr(capacity._racks[rack_key].pools[owner], field_)[free]
                    assert count == len(names)
                    found.setdefault((location, owner), {}).setdefault(free, {})[rack_key] = names
    assert seen == at
    assert ib_seen == ib_at


def oracle(capacity: Capacity, spec: JobSpec, owner: str | None):
    """Best fit of a one-replica single-node job, by brute force: (free, rack, name)."""
    racks = [r for r in capacity._racks.values() if r.location == spec.location]
    if not racks:
        return Unplaceable
    usable = [(r.key, n) for r in racks for n in r.nodes.values()
              if n.present and n.owner == owner]
    fitting = sorted((n.free, k, n.name) for k, n in usable
                     if n.schedulable and n.free >= spec.gpus)
    if fitting:
        return [f"{fitting[0][1][0]}:{fitting[0][2]}={spec.gpus}"]
    return NoCapacity if any(n.gpus >= spec.gpus for _, n in usable) else Unplaceable


@settings(max_examples=examples(300), deadline=None)
@given(racks_st, ops_st)
def test_random_sequences_keep_the_books_straight(racks: list[R], ops: list[tuple]) -> None:
    capacity = build(racks)
    running: list[tuple[str, tuple[ReplicaPlacement, ...]]] = []
    for op in ops:
        reserving = set(capacity._team_nodes)
        if op[0] == "place":
            spec = op[1]
            owner = spec.team if spec.team in reserving else None
            single = spec.replicas == 1 and not spec.may_span_nodes
            try:
                placements = place(capacity, spec)
            except (Unplaceable, NoCapacity) as error:
                if single:
                    assert type(error) is oracle(capacity, spec, owner)
                continue
            if single:
                assert shown(placements) == oracle(capacity, spec, owner)
            assert len(placements) == spec.replicas
            assert len({p.rack for p in placements}) == 1
            home = capacity._racks[placements[0].rack]
            assert home.location == spec.location
            for p in placements:
                assert len({s.gpus for s in p.shares}) == 1
                assert len({s.node for s in p.shares}) == len(p.shares)
                assert sum(s.gpus for s in p.shares) == spec.gpus
                if p.multi_node:
                    assert spec.may_span_nodes and home.overlay
                for s in p.shares:
                    node = home.nodes[s.node]
                    assert node.owner == owner and node.schedulable
                    assert node.infiniband or not p.multi_node
            capacity.claim(placements)
            running.append((spec.team, placements))
        elif op[0] == "unclaim" and running:
            capacity.unclaim(running.pop(op[1] % len(running))[1])
        elif op[0] == "report":
            r = racks[op[1] % len(racks)]
            chosen = r.nodes[op[2] % len(r.nodes)]
            kept = [n for n in r.nodes if not (op[3] == "drop" and n == chosen)]
            if op[3] == "cordon":
                kept = [N(n.name, n.gpus, n.ib, True) if n == chosen else n for n in kept]
            capacity.set_rack(key(r.alias), r.location, report(*kept, overlay=r.overlay))
        elif op[0] == "reserve":
            # Only nodes without claims change hands, so the books stay checkable.
            r = racks[op[1] % len(racks)]
            name = r.nodes[op[2] % len(r.nodes)].name
            node = capacity._racks[key(r.alias)].nodes.get(name)
            if node is None or not node.claimed:
                capacity.release(key(r.alias), name)
                if op[3] is not None:
                    capacity.reserve(key(r.alias), name, op[3])
        check_index(capacity)
        claimed: dict = {}
        for team, placements in running:
            for p in placements:
                for s in p.shares:
                    node = capacity._racks[p.rack].nodes[s.node]
                    claimed[id(node)] = claimed.get(id(node), 0) + s.gpus
                    assert node.owner in (None, team)  # a reserved node: its team's only
        for r in capacity._racks.values():
            for n in r.nodes.values():
                assert n.claimed == claimed.get(id(n), 0)
                assert n.claimed <= n.gpus or not n.present
    for _, placements in running:
        capacity.unclaim(placements)
    for r in racks:
        capacity.set_rack(key(r.alias), r.location, report(*r.nodes, overlay=r.overlay))
        for n in r.nodes:
            capacity.release(key(r.alias), n.name)
            if n.team:
                capacity.reserve(key(r.alias), n.name, n.team)
    check_index(capacity)
    assert capacity.nodes() == build(racks).nodes()
    assert all(n.free == n.gpus for n in capacity.nodes())


def test_restore_books_running_replicas_without_rechecking_them() -> None:
    capacity = one_rack(N("n1", ib=True), N("n2", ib=True), overlay=True)
    spanning = place(capacity, inference(16))
    capacity.set_rack(key("a"), "default", report(N("n1", ib=True, cordoned=True)))
    capacity.restore(spanning)  # n1 cordoned, n2 gone: both still booked
    assert [(n.name, n.free, n.gpus) for n in capacity.nodes()] == [("n1", 0, 8), ("n2", 0, 0)]
    with pytest.raises(PlacementError, match="still holds 16 claimed GPUs"):
        capacity.remove_rack(key("a"))
    capacity.unclaim(spanning)
    assert [(n.name, n.free) for n in capacity.nodes()] == [("n1", 8)]
    with pytest.raises(PlacementError, match="register racks before restoring"):
        capacity.restore([ReplicaPlacement.model_validate(
            {"rack": key("b"), "shares": [{"node": "n1", "gpus": 1}]})])


span_racks_st = st.lists(
    st.builds(R, alias=st.sampled_from("abc"), overlay=st.just(True), nodes=st.lists(
        st.builds(N, name=st.sampled_from([f"n{i}" for i in range(6)]),
                  gpus=st.sampled_from([8, 8, 8, 4]), ib=st.sampled_from([True, True, False])),
        min_size=2, max_size=6, unique_by=lambda n: n.name).map(tuple)),
    min_size=1, max_size=3, unique_by=lambda r: r.alias)
span_ops_st = st.lists(st.one_of(
    st.tuples(st.just("vllm"), st.sampled_from([12, 16, 16, 24, 32]), st.integers(1, 2)),
    st.tuples(st.just("container"), st.integers(1, 8), st.just(1)),
    st.tuples(st.just("unclaim"), st.integers(0, 50), st.just(0))), min_size=1, max_size=30)


def span_oracle(capacity: Capacity, gpus: int) -> list[str] | None:
    """The fewest-nodes split of one replica larger than every node, by brute
    force: smallest k over all racks, then rack key, then the k tightest nodes."""
    best = None
    for r in sorted(capacity._racks.values(), key=lambda r: r.key):
        ib = sorted((n.free, n.name) for n in r.nodes.values() if n.infiniband and n.schedulable)
        for k in range(2, gpus + 1):
            share = gpus // k
            fitting = [name for free, name in ib if free >= share]
            if gpus % k == 0 and len(fitting) >= k:
                if best is None or k < best[0]:
                    best = (k, [f"{r.key[0]}:" + ",".join(f"{name}={share}"
                                                          for name in sorted(fitting[:k]))])
                break
    return best[1] if best else None


@settings(max_examples=examples(300), deadline=None)
@given(span_racks_st, span_ops_st)
def test_spanning_vllm_replicas_take_the_fewest_tightest_nodes(racks: list[R],
                                                               ops: list[tuple]) -> None:
    capacity = build(racks)
    running: list[tuple[ReplicaPlacement, ...]] = []
    for kind, n, replicas in ops:
        if kind == "unclaim":
            if running:
                capacity.unclaim(running.pop(n % len(running)))
            continue
        spec = inference(n, replicas=replicas) if kind == "vllm" else container(n)
        expected = span_oracle(capacity, n) if kind == "vllm" and replicas == 1 else None
        try:
            placements = place(capacity, spec)
        except (Unplaceable, NoCapacity):
            assert expected is None or kind != "vllm" or replicas > 1
            continue
        if kind == "vllm":
            assert all(p.multi_node for p in placements)
            if replicas == 1:
                assert shown(placements) == expected
        for p in placements:
            assert len({s.gpus for s in p.shares}) == 1
            assert all(capacity._racks[p.rack].nodes[s.node].infiniband or not p.multi_node
                       for s in p.shares)
        capacity.claim(placements)
        running.append(placements)
        check_index(capacity)
    for placements in running:
        capacity.unclaim(placements)
    assert all(n.free == n.gpus for n in capacity.nodes())


def test_statistics_count_the_racks_nodes_and_claims() -> None:
    capacity = one_rack(N("n1"), N("n2", gpus=4))
    capacity.claim(place(capacity, container(6)))
    stats = capacity.statistics()
    assert (stats.racks, stats.nodes, stats.gpus, stats.claimed_gpus) == (1, 2, 12, 6)


def test_place_only_reads_the_capacity_it_is_given() -> None:
    capacity = one_rack(N("n1"), N("n2", gpus=4, used=1))
    before = (capacity.statistics(), capacity.nodes(), capacity.racks(), capacity._generation)
    assert shown(place(capacity, container(3))) == shown(place(capacity, container(3))) == [
        "a:n2=3"]
    for spec, error in ((container(9), Unplaceable), (inference(4, replicas=3), NoCapacity)):
        with pytest.raises(error):
            place(capacity, spec)
    assert (capacity.statistics(), capacity.nodes(), capacity.racks(),
            capacity._generation) == before
    # Another capacity of the same shape answers the same: nothing is kept elsewhere.
    assert shown(place(one_rack(N("n1"), N("n2", gpus=4, used=1)), container(3))) == ["a:n2=3"]


def test_the_never_fits_memo_is_dropped_when_the_shape_changes() -> None:
    capacity = one_rack(N("n1"))
    assert never_fits(capacity, container(9)) is not None
    assert len(capacity.shape_memo) == 1
    capacity.claim(place(capacity, container(1)))  # a claim is not a change of shape
    assert len(capacity.shape_memo) == 1
    capacity.set_rack(key("a"), "default", report(N("n1", gpus=16)))
    assert capacity.shape_memo == {}
    assert never_fits(capacity, container(9)) is None


def test_an_isolated_network_goes_only_to_a_rack_that_offers_one() -> None:
    capacity = Capacity()
    capacity.set_rack(key("a"), "default", RackReport(nodes=(NodeInfo(name="n1", gpus=8),)))
    isolated = JobSpec(name="j", team="t", type="container", image=IMAGE, gpus=1,
                       isolated_network=True)
    with pytest.raises(Unplaceable, match="WireGuard gateways"):
        place(capacity, isolated)
    capacity.set_rack(key("b"), "default", RackReport(nodes=(NodeInfo(name="n9", gpus=8),),
                                                      isolated_networks=True))
    # Rack a's node is the tighter fit for an ordinary job; the isolated one skips it.
    assert place(capacity, container(1))[0].rack in (key("a"), key("b"))
    (placement,) = place(capacity, isolated)
    assert placement.rack == key("b")
    # Full on the isolated rack: it waits for room there, not on rack a.
    capacity.claim(place(capacity, JobSpec(name="big", team="t", type="container",
                                           image=IMAGE, gpus=8, isolated_network=True)))
    with pytest.raises(NoCapacity):
        place(capacity, isolated)
