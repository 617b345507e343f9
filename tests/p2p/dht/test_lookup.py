"""The sans-IO iterative lookup, driven over a simulated network of contacts."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.dht._contact import Contact
from p2p.dht._lookup import IterativeLookup, LookupConfig, QueryState
from p2p.errors import LocalProtocolError
from tests.examples import examples


def make_network(size, seed):
    rng = random.Random(seed)
    return [
        Contact(rng.randbytes(20), f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}", 1000)
        for i in range(size)
    ]


def distance(a, b):
    return int.from_bytes(a, "big") ^ int.from_bytes(b, "big")


class SimulatedNetwork:
    """Each node knows a Kademlia-like table: its k closest plus random far contacts
    per distance bucket, and answers with the k closest it knows to the target.

    A node's table is built the first time it is asked (from its own seeded
    random stream): a lookup asks a few dozen of a large network's nodes, and
    building all 3,000 tables up front was most of a test's CPU."""

    def __init__(self, contacts, *, k=20, seed=0, dead=()):
        self.by_id = {c.id: c for c in contacts}
        self.dead = set(dead)
        self.tables = {}
        self.k = k
        self._seed = seed
        self._ids = list(self.by_id)
        self._ordered = sorted(self._ids)
        self._position = {node_id: index for index, node_id in enumerate(self._ordered)}

    def table(self, contact_id):
        if contact_id not in self.tables:
            k, ids, ordered = self.k, self._ids, self._ordered
            index = self._position[contact_id]
            rng = random.Random(f"{self._seed}/{index}")
            # Its neighbourhood (ids sharing the longest prefixes sit next to it
            # in sorted order) plus a sample of the rest, bucketed by distance.
            table = set(ordered[max(0, index - k) : index + k + 1]) - {contact_id}
            buckets = {}
            for other in rng.sample(ids, min(len(ids), 10 * k)):
                if other == contact_id:
                    continue
                bucket = distance(contact_id, other).bit_length()
                buckets.setdefault(bucket, []).append(other)
            for members in buckets.values():
                members.sort(key=lambda other: distance(contact_id, other))
                table.update(members[:k])
            self.tables[contact_id] = [self.by_id[i] for i in table]
        return self.tables[contact_id]

    def answer(self, contact_id, target):
        known = sorted(self.table(contact_id), key=lambda c: distance(c.id, target))
        return known[: self.k]

    def run(self, lookup, *, now=0.0, max_rounds=10_000):
        rounds = 0
        while not lookup.finished and rounds < max_rounds:
            rounds += 1
            queries = lookup.next_queries(now)
            if not queries:
                now = lookup.next_deadline() or now + 1
                continue
            for contact in queries:
                if contact.id in self.dead:
                    continue  # no answer: it will time out
                lookup.on_response(contact.id, self.answer(contact.id, lookup.target))
        return rounds


def true_closest(contacts, target, k, dead=()):
    alive = [c for c in contacts if c.id not in set(dead)]
    return sorted(alive, key=lambda c: distance(c.id, target))[:k]


@pytest.mark.parametrize("size", [50, 1000])
def test_a_lookup_finds_the_true_k_closest_nodes(size):
    contacts = make_network(size, seed=size)
    network = SimulatedNetwork(contacts, seed=1)
    target = random.Random(7).randbytes(20)
    lookup = IterativeLookup(target, contacts[:3], config=LookupConfig(k=20))
    network.run(lookup)
    assert lookup.finished
    assert lookup.closest() == true_closest(contacts, target, 20)


def test_hops_stay_within_log2_n_plus_one_on_a_large_network():
    contacts = make_network(3_000, seed=3)
    network = SimulatedNetwork(contacts, seed=4)
    rng = random.Random(5)
    worst = 0
    for _ in range(5):
        target = rng.randbytes(20)
        lookup = IterativeLookup(target, rng.sample(contacts, 20))
        network.run(lookup)
        assert lookup.closest()[0] == true_closest(contacts, target, 1)[0]
        worst = max(worst, lookup.statistics().hops)
    assert worst <= math.ceil(math.log2(3_000)) + 1


def test_no_more_than_alpha_queries_are_in_flight():
    contacts = make_network(200, seed=9)
    lookup = IterativeLookup(bytes(20), contacts, config=LookupConfig(alpha=3))
    assert len(lookup.next_queries(0.0)) == 3
    assert lookup.next_queries(0.0) == []  # all three still waiting


def test_silent_nodes_time_out_and_the_lookup_still_settles():
    contacts = make_network(300, seed=11)
    rng = random.Random(12)
    dead = {c.id for c in rng.sample(contacts, 90)}  # 30% gone
    network = SimulatedNetwork(contacts, seed=13, dead=dead)
    target = rng.randbytes(20)
    seeds = [c for c in contacts if c.id not in dead][:5]
    lookup = IterativeLookup(target, seeds, config=LookupConfig(request_timeout_s=1.0))
    network.run(lookup)
    assert lookup.finished
    assert lookup.statistics().failures > 0
    assert all(c.id not in dead for c in lookup.closest())
    assert lookup.closest()[:5] == true_closest(contacts, target, 5, dead)


def test_a_late_answer_does_not_resurrect_a_timed_out_query():
    contacts = make_network(10, seed=1)
    lookup = IterativeLookup(bytes(20), contacts[:1], config=LookupConfig(request_timeout_s=1))
    (asked,) = lookup.next_queries(0.0)
    assert lookup.expire(1.0) == [asked]
    lookup.on_response(asked.id, contacts[1:4])
    assert lookup.state_of(asked.id) is QueryState.FAILED
    assert lookup.statistics().responses == 0
    assert lookup.state_of(contacts[1].id) is QueryState.NOT_CONTACTED  # still learned


def test_our_own_id_is_never_queried():
    contacts = make_network(5, seed=2)
    lookup = IterativeLookup(bytes(20), contacts, local_id=contacts[0].id)
    asked = []
    while queries := lookup.next_queries(0.0):
        asked += queries
        for contact in queries:
            lookup.on_response(contact.id, [])
    assert contacts[0] not in asked


def test_max_queries_bounds_a_lookup_fed_endless_fresh_contacts():
    rng = random.Random(3)
    lookup = IterativeLookup(
        bytes(20), make_network(3, seed=3), config=LookupConfig(max_queries=30)
    )
    now = 0.0
    for _ in range(1000):
        queries = lookup.next_queries(now)
        if not queries:
            break
        for contact in queries:
            hostile = [Contact(rng.randbytes(20), "10.9.9.9", 9) for _ in range(20)]
            lookup.on_response(contact.id, hostile)
    assert lookup.finished
    assert lookup.statistics().queries == 30


def test_bad_configuration_and_targets_are_refused():
    with pytest.raises(LocalProtocolError):
        LookupConfig(alpha=0)
    with pytest.raises(LocalProtocolError):
        IterativeLookup(bytes(32), [])


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 120), st.integers(1, 6))
def test_any_network_any_alpha_the_lookup_ends_with_sorted_answers(seed, size, alpha):
    contacts = make_network(size, seed=seed)
    network = SimulatedNetwork(contacts, k=8, seed=seed)
    target = random.Random(seed).randbytes(20)
    lookup = IterativeLookup(target, contacts[:2], config=LookupConfig(k=8, alpha=alpha))
    network.run(lookup)
    assert lookup.finished
    found = lookup.closest()
    assert found == sorted(found, key=lambda c: distance(c.id, target))
    assert lookup.statistics().queries <= lookup.config.max_queries


class SortingModel:
    """The lookup's rules, re-sorting every candidate on every question: the
    obvious version that IterativeLookup's kept-in-order candidates must match."""

    def __init__(self, target, seeds, config, local_id):
        self.target = int.from_bytes(target, "big")
        self.config = config
        self.local_id = local_id
        self.entries = {}  # id -> {contact, distance, depth, state, deadline}
        self.queries = 0
        for contact in seeds:
            self.add(contact, 0)

    def ordered(self):
        return sorted(self.entries.values(), key=lambda e: e["distance"])

    def waiting(self):
        return [e for e in self.entries.values() if e["state"] is QueryState.WAITING]

    def add(self, contact, depth):
        if contact.id == self.local_id or contact.id in self.entries:
            return
        self.entries[contact.id] = {
            "contact": contact,
            "depth": depth,
            "state": QueryState.NOT_CONTACTED,
            "distance": distance(contact.id, self.target.to_bytes(20, "big")),
            "deadline": 0.0,
        }
        if len(self.entries) > self.config.k * 8:
            for entry in reversed(self.ordered()):
                if entry["state"] is QueryState.NOT_CONTACTED:
                    del self.entries[entry["contact"].id]
                    break

    def expire(self, now):
        expired = [e for e in self.waiting() if e["deadline"] <= now]
        for entry in expired:
            entry["state"] = QueryState.FAILED
        return {e["contact"] for e in expired}

    def finished(self):
        if self.queries >= self.config.max_queries and not self.waiting():
            return True
        settled = [e for e in self.ordered() if e["state"] is not QueryState.FAILED]
        head = settled[: self.config.k]
        if len(head) == self.config.k:
            return all(e["state"] is QueryState.SUCCEEDED for e in head)
        return all(e["state"] is QueryState.SUCCEEDED for e in head) and not self.waiting()

    def next_queries(self, now):
        self.expire(now)
        if self.finished():
            return []
        budget = min(
            self.config.alpha - len(self.waiting()), self.config.max_queries - self.queries
        )
        fresh = [e for e in self.ordered() if e["state"] is QueryState.NOT_CONTACTED]
        chosen = fresh[: max(budget, 0)]
        for entry in chosen:
            entry["state"] = QueryState.WAITING
            entry["deadline"] = now + self.config.request_timeout_s
        self.queries += len(chosen)
        return [e["contact"] for e in chosen]

    def on_response(self, contact_id, closer):
        entry = self.entries.get(contact_id)
        if entry is not None and entry["state"] is QueryState.WAITING:
            entry["state"] = QueryState.SUCCEEDED
        for contact in closer:
            self.add(contact, entry["depth"] + 1 if entry is not None else 1)

    def on_failure(self, contact_id):
        entry = self.entries.get(contact_id)
        if entry is not None and entry["state"] is QueryState.WAITING:
            entry["state"] = QueryState.FAILED

    def closest(self):
        answered = [e for e in self.ordered() if e["state"] is QueryState.SUCCEEDED]
        return [e["contact"] for e in answered[: self.config.k]]

    def hops(self):
        answered = [e for e in self.ordered() if e["state"] is QueryState.SUCCEEDED]
        return answered[0]["depth"] + 1 if answered else 0


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 4), st.integers(1, 4), st.integers(1, 40), st.data())
def test_the_ordered_candidates_behave_like_a_full_sort_on_every_call(
    seed, k, alpha, max_queries, data
):
    pool = make_network(80, seed=seed)
    rng = random.Random(seed)
    target = rng.randbytes(20)
    config = LookupConfig(k=k, alpha=alpha, max_queries=max_queries, request_timeout_s=1.0)
    seeds, local_id = pool[:5], pool[5].id
    lookup = IterativeLookup(target, seeds, config=config, local_id=local_id)
    model = SortingModel(target, seeds, config, local_id)
    now, waiting = 0.0, []
    for _ in range(data.draw(st.integers(1, 60))):
        op = data.draw(st.sampled_from(["query", "answer", "fail", "expire", "stray"]))
        if op == "query":
            now += data.draw(st.sampled_from([0.0, 0.5, 1.0]))
            asked = lookup.next_queries(now)
            assert asked == model.next_queries(now)
            waiting += asked
        elif op == "expire":
            now += 1.0
            assert set(lookup.expire(now)) == model.expire(now)
        elif op in ("answer", "fail") and waiting:
            contact = waiting.pop(data.draw(st.integers(0, len(waiting) - 1)))
            if op == "fail":
                lookup.on_failure(contact.id)
                model.on_failure(contact.id)
            else:
                closer = rng.sample(pool, rng.randint(0, 20))
                lookup.on_response(contact.id, closer)
                model.on_response(contact.id, closer)
        elif op == "stray":
            source, closer = rng.choice(pool), rng.sample(pool, 3)
            lookup.on_response(source.id, closer)
            model.on_response(source.id, closer)
        assert lookup.finished == model.finished()
        assert lookup.closest() == model.closest()
        assert lookup.next_deadline() == min((e["deadline"] for e in model.waiting()), default=None)
        assert lookup.statistics().hops == model.hops()
        for contact in pool:
            entry = model.entries.get(contact.id)
            assert lookup.state_of(contact.id) == (entry["state"] if entry else None)
