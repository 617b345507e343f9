"""The sans-IO iterative lookup, driven over a simulated network of contacts."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.dht._contact import Contact
from p2p.dht._lookup import IterativeLookup, LookupConfig, QueryState
from p2p.errors import LocalProtocolError


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
    per distance bucket, and answers with the k closest it knows to the target."""

    def __init__(self, contacts, *, k=20, seed=0, dead=()):
        rng = random.Random(seed)
        self.by_id = {c.id: c for c in contacts}
        self.dead = set(dead)
        self.tables = {}
        ids = list(self.by_id)
        ordered = sorted(ids)
        position = {node_id: index for index, node_id in enumerate(ordered)}
        for contact in contacts:
            # Its neighbourhood (ids sharing the longest prefixes sit next to it
            # in sorted order) plus a sample of the rest, bucketed by distance.
            index = position[contact.id]
            table = set(ordered[max(0, index - k) : index + k + 1]) - {contact.id}
            buckets = {}
            for other in rng.sample(ids, min(len(ids), 10 * k)):
                if other == contact.id:
                    continue
                bucket = distance(contact.id, other).bit_length()
                buckets.setdefault(bucket, []).append(other)
            for members in buckets.values():
                members.sort(key=lambda other: distance(contact.id, other))
                table.update(members[:k])
            self.tables[contact.id] = [self.by_id[i] for i in table]
        self.k = k

    def answer(self, contact_id, target):
        known = sorted(self.tables[contact_id], key=lambda c: distance(c.id, target))
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
    lookup = IterativeLookup(bytes(20), make_network(3, seed=3),
                             config=LookupConfig(max_queries=30))
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


@settings(max_examples=40, deadline=None)
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
