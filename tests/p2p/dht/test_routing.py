"""The sans-IO routing table on kademlia's k-buckets."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import random

import kademlia.routing
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.dht._contact import Contact, node_id_for
from p2p.dht._errors import DhtUsageError
from p2p.dht._routing import AddStatus, Routing, _distance_floor, id_matches, target_id
from tests.examples import examples

LOCAL = Contact.at("192.0.2.1", 49737)


@pytest.fixture(autouse=True)
def no_asyncio_and_no_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """kademlia reaches for asyncio on full buckets and time.monotonic for stamps."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the routing table must not touch asyncio or the wall clock")

    monkeypatch.setattr(kademlia.routing.asyncio, "ensure_future", forbidden)
    monkeypatch.setattr(kademlia.routing.time, "monotonic", forbidden)
    monkeypatch.setattr(asyncio, "get_event_loop", forbidden)
    monkeypatch.setattr(asyncio, "new_event_loop", forbidden)


def _random_contact(rng: random.Random) -> Contact:
    if rng.random() < 0.5:
        host = str(ipaddress.IPv4Address(rng.randrange(0x01000000, 0xE0000000)))
    else:
        host = str(ipaddress.IPv6Address((0x2001_0DB8 << 96) | rng.getrandbits(96)))
    return Contact.at(host, rng.randint(1, 65535))


def _distance(contact: Contact, target: bytes) -> int:
    return int.from_bytes(contact.id, "big") ^ int.from_bytes(target, "big")


def _table(k: int = 20, seed: int = 0) -> Routing:
    return Routing(LOCAL.id, now=0.0, rng=random.Random(seed), k=k)


def _filled_far_bucket(k: int = 2) -> tuple[Routing, list[Contact]]:
    """A table whose bucket of far contacts is full and may not split.

    kademlia splits a bucket that does not cover our id only while the shared
    id prefix of its contacts ("depth") is not a multiple of 5 (paper §4.2,
    b = 5), so the far contacts share exactly 5 leading bits here.
    """
    prefix = (~LOCAL.id[0] >> 3) & 0b11111  # 5 bits, the first one unlike ours
    rng = random.Random(1)
    by_sixth_bit: dict[int, list[Contact]] = {0: [], 1: []}
    while len(by_sixth_bit[0]) < k + 3 or len(by_sixth_bit[1]) < k + 3:
        contact = _random_contact(rng)
        if contact.id[0] >> 3 == prefix:
            by_sixth_bit[(contact.id[0] >> 2) & 1].append(contact)
    zeros, ones = by_sixth_bit[0], by_sixth_bit[1]
    far = [zeros[0], ones[0], *zeros[1 : k + 2]][: k + 3]
    table = _table(k=k)
    for contact in far[:k]:
        assert table.add(contact, now=2.0).status is AddStatus.ADDED
    return table, far


# -- filling the table --------------------------------------------------------------------


def test_a_thousand_random_contacts_keep_at_most_k_per_bucket() -> None:
    table = _table(k=20)
    rng = random.Random(7)
    contacts = [_random_contact(rng) for _ in range(1000)]
    for i, contact in enumerate(contacts):
        table.add(contact, now=float(i))
    stats = table.statistics()
    assert stats.contacts == len(table) == len(table.contacts())
    assert 0 < len(table) <= 1000
    for lower, upper in table.bucket_ranges():
        inside = [c for c in table.contacts() if lower <= int.from_bytes(c.id, "big") <= upper]
        assert len(inside) <= 20
    assert len({c.id for c in table.contacts()}) == len(table)


def test_closest_is_sorted_by_xor_distance_and_matches_a_brute_force_sort() -> None:
    table = _table()
    rng = random.Random(3)
    for i in range(1000):
        table.add(_random_contact(rng), now=float(i))
    everyone = table.contacts()
    for _ in range(200):
        target = rng.randbytes(20)
        ranked = sorted(everyone, key=lambda c, t=target: _distance(c, t))  # once per target
        for count in (1, 3, 20, 50, 10_000):
            assert table.closest(target, count) == ranked[:count]


def test_closest_leaves_out_excluded_ids_and_handles_an_empty_table() -> None:
    table = _table()
    assert table.closest(b"\x00" * 20) == []
    rng = random.Random(4)
    for c in (_random_contact(rng) for _ in range(50)):
        table.add(c, now=0.0)
    target = rng.randbytes(20)
    nearest = table.closest(target, 3)
    assert table.closest(target, 2, exclude={nearest[0].id}) == nearest[1:3]
    assert table.closest(target, 0) == []


@settings(max_examples=examples(50), deadline=None)
@given(
    st.integers(0, 2**32),
    st.integers(1, 8),
    st.integers(0, 400),
    st.integers(0, 30),
    st.integers(0, 3),
)
def test_closest_matches_a_brute_force_sort_for_any_table_count_and_exclusions(
    seed: int, k: int, size: int, count: int, excluded: int
) -> None:
    rng = random.Random(seed)
    table = _table(k=k)
    for i in range(size):
        table.add(_random_contact(rng), now=float(i))
    everyone = table.contacts()
    for target in [rng.randbytes(20) for _ in range(5)] + [c.id for c in everyone[:3]]:
        exclude = {c.id for c in rng.sample(everyone, min(excluded, len(everyone)))}
        expected = sorted(
            (c for c in everyone if c.id not in exclude), key=lambda c: _distance(c, target)
        )[:count]
        assert table.closest(target, count, exclude=exclude) == expected


@given(st.integers(1, 10), st.data())
def test_the_distance_floor_of_any_range_is_at_most_its_nearest_id(bits: int, data) -> None:
    lower = data.draw(st.integers(0, 2**bits))
    upper = data.draw(st.integers(lower, 2**bits))
    target = data.draw(st.integers(0, 2**bits - 1))
    nearest = min(x ^ target for x in range(lower, upper + 1))
    assert _distance_floor(lower, upper, target) <= nearest


@given(st.integers(1, 10), st.lists(st.booleans(), max_size=10), st.data())
def test_the_distance_floor_of_a_kademlia_range_is_exact_when_it_starts_a_block(
    bits: int, path: list[bool], data
) -> None:
    # Split [0, 2**bits] as kademlia does; the floor must be a bound on every
    # range, and the exact minimum on the left halves ([a*2**s, (a+1)*2**s]),
    # which is what lets closest() skip far buckets.
    lower, upper = 0, 2**bits
    for right in path[:bits]:
        midpoint = (lower + upper) // 2
        lower, upper = (midpoint + 1, upper) if right else (lower, midpoint)
    target = data.draw(st.integers(0, 2**bits - 1))
    nearest = min(x ^ target for x in range(lower, upper + 1))
    floor = _distance_floor(lower, upper, target)
    assert floor <= nearest
    size = upper - lower
    if size and size & (size - 1) == 0 and lower % size == 0:
        assert floor == nearest


def test_closest_refuses_a_key_that_is_not_twenty_bytes() -> None:
    with pytest.raises(DhtUsageError):
        _table().closest(b"\x00" * 32)


def test_adding_a_known_contact_updates_it_and_adding_itself_does_nothing() -> None:
    table = _table()
    contact = Contact.at("198.51.100.1", 1000)
    assert table.add(contact, now=0.0).status is AddStatus.ADDED
    assert table.add(contact, now=1.0).status is AddStatus.UPDATED
    assert table.add(LOCAL, now=1.0).status is AddStatus.SELF
    assert len(table) == 1
    assert contact.id in table
    assert table.get(contact.id) == contact


def test_a_contact_whose_id_does_not_match_its_address_is_refused() -> None:
    table = _table()
    with pytest.raises(DhtUsageError):
        table.add(Contact(b"\x01" * 20, "198.51.100.1", 1000), now=0.0)


def test_remove_forgets_a_contact() -> None:
    table = _table()
    contact = Contact.at("198.51.100.1", 1000)
    table.add(contact, now=0.0)
    assert table.remove(contact.id)
    assert not table.remove(contact.id)
    assert len(table) == 0
    assert table.get(contact.id) is None


# -- bucket-head pings ----------------------------------------------------------------------


def test_a_full_bucket_queues_its_head_for_a_ping_once() -> None:
    table, far = _filled_far_bucket(k=2)
    result = table.add(far[2], now=3.0)
    assert result.status is AddStatus.PENDING
    assert result.head == far[0]  # the least recently seen
    assert table.pings_to_send() == [far[0]]
    assert table.pings_to_send() == []  # the outbox drains
    # A second newcomer while the ping is out does not ask again.
    assert table.add(far[3], now=4.0).status is AddStatus.PENDING
    assert table.pings_to_send() == []
    assert table.pending_pings() == [far[0].id]


def test_a_head_that_answers_stays_and_the_newcomer_waits() -> None:
    table, far = _filled_far_bucket(k=2)
    table.add(far[2], now=3.0)
    [head] = table.pings_to_send()
    assert table.ping_result(head, alive=True, now=4.0) is None
    assert head.id in table and far[2].id not in table
    assert table.pending_pings() == []
    # The head is now most recently seen, so the next newcomer pings the other one.
    assert table.add(far[3], now=5.0).head == far[1]
    assert table.pings_to_send() == [far[1]]


def test_a_head_that_stays_silent_is_replaced_by_the_newcomer() -> None:
    table, far = _filled_far_bucket(k=2)
    table.add(far[2], now=3.0)
    [head] = table.pings_to_send()
    promoted = table.ping_result(head, alive=False, now=4.0)
    assert promoted == far[2]
    assert head.id not in table and far[2].id in table
    assert table.pending_pings() == []


def test_hearing_from_a_pending_head_settles_its_ping() -> None:
    table, far = _filled_far_bucket(k=2)
    table.add(far[2], now=3.0)
    assert table.add(far[0], now=3.5).status is AddStatus.UPDATED
    assert table.pending_pings() == []
    assert table.pings_to_send() == []


def test_an_unreported_head_ping_is_asked_for_again_after_the_timeout() -> None:
    table, far = _filled_far_bucket(k=2)
    table.add(far[2], now=3.0)
    assert table.pings_to_send() == [far[0]]
    table.add(far[3], now=3.0 + table.head_ping_timeout_s)
    assert table.pings_to_send() == [far[0]]


def test_a_ping_result_for_an_unknown_contact_is_ignored() -> None:
    table = _table()
    assert table.ping_result(Contact.at("198.51.100.1", 1), alive=False, now=0.0) is None
    assert table.ping_result(b"\x05" * 20, alive=True, now=0.0) is None


# -- refresh ------------------------------------------------------------------------------


def test_stale_buckets_give_refresh_ids_inside_their_ranges() -> None:
    table = _table(seed=11)
    rng = random.Random(5)
    for c in (_random_contact(rng) for _ in range(500)):
        table.add(c, now=0.0)
    ranges = table.bucket_ranges()
    assert table.stale_buckets(now=899.0) == []
    ids = table.stale_buckets(now=900.0)
    assert len(ids) == len(ranges)
    for key, (lower, upper) in zip(ids, ranges, strict=True):
        assert len(key) == 20
        assert lower <= int.from_bytes(key, "big") <= upper
    # Returned buckets count as refreshed.
    assert table.stale_buckets(now=901.0) == []


def test_only_untouched_buckets_are_stale() -> None:
    table = _table()
    rng = random.Random(6)
    for c in (_random_contact(rng) for _ in range(300)):
        table.add(c, now=0.0)
    ranges = table.bucket_ranges()
    fresh = table.contacts()[0]
    table.add(fresh, now=500.0)
    key = rng.randbytes(20)
    table.refreshed(key, now=500.0)
    stale = table.stale_buckets(now=1000.0)
    covered = {
        i
        for i, (lo, hi) in enumerate(ranges)
        for k in stale
        if lo <= int.from_bytes(k, "big") <= hi
    }
    fresh_buckets = {
        i
        for i, (lo, hi) in enumerate(ranges)
        for k in (fresh.id, key)
        if lo <= int.from_bytes(k, "big") <= hi
    }
    assert covered == set(range(len(ranges))) - fresh_buckets


def test_refresh_ids_come_from_the_given_random_source() -> None:
    one, two = _table(seed=42), _table(seed=42)
    assert one.stale_buckets(now=1e6) == two.stale_buckets(now=1e6)


# -- identities -----------------------------------------------------------------------------


def test_id_matches_accepts_the_address_derived_id() -> None:
    assert id_matches(node_id_for("203.0.113.5", 49737), "203.0.113.5", 49737)
    assert id_matches(node_id_for("2001:db8::5", 49737), "2001:db8::5", 49737)


def test_id_matches_treats_ipv4_mapped_ipv6_as_ipv4() -> None:
    claimed = node_id_for("203.0.113.5", 49737)
    assert id_matches(claimed, "::ffff:203.0.113.5", 49737)
    assert id_matches(node_id_for("::ffff:203.0.113.5", 49737), "203.0.113.5", 49737)


@pytest.mark.parametrize(
    ("claimed", "host", "port"),
    [
        (node_id_for("203.0.113.5", 49737), "203.0.113.5", 49738),  # another port
        (node_id_for("203.0.113.5", 49737), "203.0.113.6", 49737),  # another host
        (b"\x00" * 20, "203.0.113.5", 49737),
        (node_id_for("203.0.113.5", 49737)[:19], "203.0.113.5", 49737),
        (None, "203.0.113.5", 49737),
        (node_id_for("203.0.113.5", 49737), "example.com", 49737),
        (node_id_for("203.0.113.5", 49737), "203.0.113.5", 0),
    ],
)
def test_id_matches_refuses_any_other_id(claimed: object, host: str, port: int) -> None:
    assert not id_matches(claimed, host, port)  # type: ignore[arg-type]


def test_target_id_maps_a_topic_into_the_node_id_space() -> None:
    topic = bytes(range(32))
    assert target_id(topic) == hashlib.blake2b(topic, digest_size=20).digest()
    with pytest.raises(DhtUsageError):
        target_id(b"short")


def test_a_table_refuses_a_bad_local_id_or_k() -> None:
    with pytest.raises(DhtUsageError):
        Routing(b"short", now=0.0, rng=random.Random(0))
    with pytest.raises(DhtUsageError):
        Routing(LOCAL.id, now=0.0, rng=random.Random(0), k=0)
