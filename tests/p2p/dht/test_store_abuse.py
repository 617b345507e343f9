"""The record store under floods: per-source and per-key bounds, fair topics, key topics.

10,500 announces from one key and port filled a node's store
(``STORE_FULL`` for 20 minutes), and 64 throwaway keys evicted a peer's record
from the topic ``find_peer`` reads.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from p2p.dht._records import PeerRecord, record_topic_for_key
from p2p.dht._storage import PutResult, RecordStore
from tests.examples import examples

NOW = 1_700_000_000.0
FLOODER = "203.0.113.66"


def record(key: int, seq: int = 1, ttl: int = 600) -> PeerRecord:
    return PeerRecord(
        public_key=key.to_bytes(32, "big"),
        addresses=(("192.0.2.1", 4000),),
        relays=(),
        seq=seq,
        expires=int(NOW) + ttl,
        signature=bytes(64),
    )


def topic(n: int) -> bytes:
    return (n + 1).to_bytes(32, "big")


def honest_source(n: int) -> str:
    return f"198.51.100.{n + 1}"


# --- regressions ------------------------------------------------------------------------


def test_a_flood_from_one_key_and_port_stops_at_the_key_bound_and_others_still_store():
    store = RecordStore()
    results = [store.put(topic(n), record(key=1, seq=n + 1), NOW, FLOODER)
               for n in range(10_500)]
    assert results.count(PutResult.STORED) == store.max_records_per_key
    assert results.count(PutResult.REFUSED_KEY_FULL) == 10_500 - store.max_records_per_key
    for n in range(100):
        assert store.put(topic(20_000 + n), record(key=1000 + n), NOW,
                         honest_source(n)) is PutResult.STORED
    assert store.statistics().refused_key_full == 10_500 - store.max_records_per_key


def test_a_flood_from_one_address_with_fresh_keys_stops_at_the_source_bound():
    store = RecordStore(max_topics=1_000)
    results = [store.put(topic(n), record(key=n), NOW, FLOODER) for n in range(5_000)]
    assert results.count(PutResult.STORED) == store.max_records_per_source
    assert store.held_by_source(FLOODER) == store.max_records_per_source
    assert store.statistics().refused_source_full == 5_000 - store.max_records_per_source
    # The store is far from its topic bound: everyone else still stores.
    assert store.put(topic(9_999), record(key=99_999), NOW, "198.51.100.7") is PutResult.STORED


def test_an_ipv6_flooder_counts_as_one_source_per_slash_64():
    store = RecordStore(max_records_per_source=4)
    results = [store.put(topic(n), record(key=n), NOW, f"2001:db8:0:1::{n + 1:x}")
               for n in range(10)]
    assert results.count(PutResult.STORED) == 4
    assert store.put(topic(50), record(key=50), NOW, "2001:db8:0:2::1") is PutResult.STORED


def test_a_source_at_its_bound_may_still_refresh_its_records():
    store = RecordStore(max_records_per_source=2)
    store.put(topic(1), record(key=1), NOW, FLOODER)
    store.put(topic(2), record(key=2), NOW, FLOODER)
    assert store.put(topic(3), record(key=3), NOW, FLOODER) is PutResult.REFUSED_SOURCE_FULL
    assert store.put(topic(1), record(key=1, seq=2), NOW, FLOODER) is PutResult.REPLACED
    # A record that moves to a full group is refused and stays where it was.
    store.put(topic(4), record(key=4), NOW, "198.51.100.1")
    assert store.put(topic(4), record(key=4, seq=2), NOW, FLOODER) is \
        PutResult.REFUSED_SOURCE_FULL
    assert store.held_by_source("198.51.100.1") == 1
    # Expiry and removal give the room back.
    assert store.remove(topic(2), record(key=2).public_key, 1)
    assert store.put(topic(3), record(key=3), NOW, FLOODER) is PutResult.STORED


def test_64_throwaway_keys_cannot_evict_a_record_from_its_own_key_topic():
    owner = 7
    own_topic = record_topic_for_key(record(owner).public_key)
    store = RecordStore()
    assert store.put(own_topic, record(owner), NOW, "198.51.100.1") is PutResult.STORED
    for n in range(64):
        result = store.put(own_topic, record(1000 + n, ttl=1200), NOW, f"203.0.113.{n}")
        assert result is PutResult.REFUSED_TOPIC_OWNED
    assert store.get(own_topic, NOW) == [record(owner)]
    assert store.statistics().refused_topic_owned == 64


def test_a_key_topic_filled_before_its_owner_came_is_cleared_by_the_owner():
    owner = 7
    own_topic = record_topic_for_key(record(owner).public_key)
    store = RecordStore()
    for n in range(64):
        store.put(own_topic, record(1000 + n, ttl=1200), NOW, f"203.0.113.{n}")
    assert store.put(own_topic, record(owner, ttl=10), NOW, "198.51.100.1") is PutResult.STORED
    assert store.get(own_topic, NOW) == [record(owner, ttl=10)]
    assert store.statistics().evicted == 64
    # Once the owner's record is gone, the topic is an ordinary one again.
    assert store.expire(NOW + 10) == 1
    assert store.put(own_topic, record(1), NOW + 10, FLOODER) is PutResult.STORED


def test_in_a_full_topic_the_largest_source_loses_first_and_cannot_evict_others():
    store = RecordStore(max_records_per_topic=4)
    for n in range(3):  # the flooder takes three slots, fresher than anyone's
        store.put(topic(0), record(100 + n, ttl=1200), NOW, FLOODER)
    store.put(topic(0), record(1, ttl=100), NOW, honest_source(1))
    # Full. The flooder may not evict the (staler) honest record: it is the largest.
    assert store.put(topic(0), record(104, ttl=1200), NOW, FLOODER) is \
        PutResult.REFUSED_TOPIC_FULL
    # A newcomer from another source evicts one of the flooder's records.
    assert store.put(topic(0), record(2, ttl=100), NOW, honest_source(2)) is PutResult.STORED
    held = {r.public_key[-1] for r in store.get(topic(0), NOW)}
    assert {1, 2} <= held and len(held) == 4


def test_among_equal_sources_the_stalest_record_makes_room_for_a_fresher_one():
    store = RecordStore(max_records_per_topic=2)
    store.put(topic(0), record(1, ttl=100), NOW, honest_source(1))
    store.put(topic(0), record(2, ttl=200), NOW, honest_source(2))
    assert store.put(topic(0), record(3, ttl=300), NOW, honest_source(3)) is PutResult.STORED
    assert {r.public_key[-1] for r in store.get(topic(0), NOW)} == {2, 3}
    assert store.put(topic(0), record(4, ttl=150), NOW, honest_source(4)) is \
        PutResult.REFUSED_TOPIC_FULL


# --- properties -------------------------------------------------------------------------

MAX_TOPICS, PER_SOURCE, PER_KEY, PER_TOPIC = 12, 5, 6, 4

flood_op = st.tuples(st.just("flood"), st.integers(0, 15), st.integers(0, 30),
                     st.integers(1, 1200))
honest_op = st.tuples(st.just("honest"), st.integers(0, 5), st.integers(0, 6),
                      st.integers(200, 1200))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.one_of(flood_op, honest_op), max_size=80))
@example([("flood", 0, 0, 200), ("honest", 0, 0, 200), ("honest", 1, 6, 200),
          ("honest", 2, 0, 200), ("honest", 3, 6, 201)])
def test_a_flood_from_one_source_never_costs_an_honest_announce_its_place(ops):
    """Honest announcers (one source each, one record per topic each, their
    topics fit next to the flooder's bound, each topic has room for one more
    source) are always stored and never evicted, whatever one source floods."""
    store = RecordStore(max_topics=MAX_TOPICS, max_records_per_topic=PER_TOPIC,
                        max_records_per_source=PER_SOURCE, max_records_per_key=PER_KEY)
    # Honest source s announces key 10_000 + s in topics of its parity among
    # 0..6: at most 7 honest topics + PER_SOURCE flooded ones = MAX_TOPICS,
    # at most 3 = PER_TOPIC - 1 honest sources per topic, at most 4 records
    # per honest source and key (< PER_SOURCE, PER_KEY). Nothing expires.
    seq: dict[tuple[int, int], int] = {}
    for kind, a, b, ttl in ops:
        if kind == "flood":
            # Any key of the flooder's, any topic (shared with honest ones or not).
            store.put(topic(a), record(50_000 + b, seq=1, ttl=ttl), NOW, FLOODER)
            continue
        source, t = a, b
        if source % 2 != t % 2:
            # Down one, not up modulo 7: 6 -> 0 gave an odd source an even topic,
            # a fourth honest source in topic 0 (hypothesis found it).
            t = t - 1 if t > 0 else 1
        slot = (source, t)
        seq[slot] = seq.get(slot, 0) + 1
        result = store.put(topic(t), record(10_000 + source, seq=seq[slot], ttl=ttl), NOW,
                           honest_source(source))
        assert result.accepted, (result, slot)
    held = {(r.public_key, t) for t in range(16) for r in store.get(topic(t), NOW, 100)}
    for source, t in seq:
        assert ((10_000 + source).to_bytes(32, "big"), t) in held


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 200), st.integers(0, 20),
                          st.integers(1, 1200)), max_size=100))
def test_only_the_owner_ever_holds_its_key_topic_once_it_announced(ops):
    owner = record(7).public_key
    own_topic = record_topic_for_key(owner)
    store = RecordStore(max_records_per_topic=8, max_records_per_source=20)
    owner_seq = 0
    for is_owner, key, source, ttl in ops:
        if is_owner:
            owner_seq += 1
            result = store.put(own_topic, record(7, seq=owner_seq, ttl=1200), NOW,
                               honest_source(1))
            assert result.accepted, result
        else:
            store.put(own_topic, record(1000 + key, ttl=ttl), NOW, f"203.0.113.{source}")
        if owner_seq:
            assert [r.public_key for r in store.get(own_topic, NOW, 100)] == [owner]
