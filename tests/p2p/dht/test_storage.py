"""The record store: seq rules, bounds and their counters, expiry, ordering."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from p2p.dht._errors import DhtUsageError
from p2p.dht._records import CLOCK_SKEW_S, PeerRecord
from p2p.dht._storage import PutResult, RecordStore
from tests.examples import examples

NOW = 1_700_000_000.0
TOPIC = b"\x0a" * 32
OTHER_TOPIC = b"\x0b" * 32


def record(key: int = 1, seq: int = 1, expires: int = int(NOW) + 600) -> PeerRecord:
    """A record for the store (unsigned: the store never checks signatures)."""
    return PeerRecord(
        public_key=key.to_bytes(32, "big"),
        addresses=(("192.0.2.1", 4000 + key % 1000),),
        relays=(),
        seq=seq,
        expires=expires,
        signature=bytes(64),
    )


def topic(n: int) -> bytes:
    return n.to_bytes(32, "big")


# --- seq rules -------------------------------------------------------------------


def test_a_new_record_is_stored_and_returned():
    store = RecordStore()
    assert store.put(TOPIC, record(), NOW) is PutResult.STORED
    assert store.get(TOPIC, NOW) == [record()]
    assert store.get(OTHER_TOPIC, NOW) == []


def test_a_higher_seq_replaces_the_stored_record():
    store = RecordStore()
    store.put(TOPIC, record(seq=1), NOW)
    assert store.put(TOPIC, record(seq=2), NOW) is PutResult.REPLACED
    assert store.get(TOPIC, NOW) == [record(seq=2)]
    assert store.statistics().replaced == 1
    assert len(store) == 1


@pytest.mark.parametrize("replayed_seq", [1, 2])
def test_a_replayed_older_or_equal_seq_is_ignored_even_if_it_lives_longer(replayed_seq):
    store = RecordStore()
    store.put(TOPIC, record(seq=2, expires=int(NOW) + 100), NOW)
    replay = record(seq=replayed_seq, expires=int(NOW) + 900)
    assert store.put(TOPIC, replay, NOW) is PutResult.IGNORED_OLDER_SEQ
    assert store.get(TOPIC, NOW) == [record(seq=2, expires=int(NOW) + 100)]
    assert store.statistics().ignored_older_seq == 1


def test_the_same_key_under_two_topics_is_two_independent_records():
    store = RecordStore()
    assert store.put(TOPIC, record(seq=5), NOW) is PutResult.STORED
    assert store.put(OTHER_TOPIC, record(seq=1), NOW) is PutResult.STORED
    assert store.statistics().topics == 2


# --- validity ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "put_topic, put_record, why",
    [
        (TOPIC, record(expires=int(NOW)), "already expired"),
        (TOPIC, record(expires=int(NOW) + 1200 + CLOCK_SKEW_S + 1), "expires too far ahead"),
        (b"\x00" * 31, record(), "short topic"),
        ("x" * 32, record(), "text topic"),
        ([1, 2], record(), "unhashable topic"),
        (TOPIC, record().to_wire(), "not a PeerRecord"),
        (TOPIC, None, "nothing"),
    ],
)
def test_invalid_puts_are_refused_and_counted(put_topic, put_record, why):
    store = RecordStore()
    assert store.put(put_topic, put_record, NOW) is PutResult.REFUSED_INVALID, why
    assert store.statistics().refused_invalid == 1
    assert len(store) == 0


def test_a_nan_clock_makes_every_put_invalid():
    assert RecordStore().put(TOPIC, record(), float("nan")) is PutResult.REFUSED_INVALID


@pytest.mark.parametrize(
    "kwargs",
    [{"max_topics": 0}, {"max_records_per_topic": -1}, {"max_ttl_s": 0}, {"max_topics": 1.5}],
)
def test_bounds_that_are_not_positive_are_refused(kwargs):
    with pytest.raises(DhtUsageError):
        RecordStore(**kwargs)


# --- bounds ------------------------------------------------------------------------


def test_a_new_topic_is_refused_when_the_store_holds_max_topics():
    store = RecordStore(max_topics=2)
    assert store.put(topic(1), record(), NOW) is PutResult.STORED
    assert store.put(topic(2), record(), NOW) is PutResult.STORED
    assert store.put(topic(3), record(), NOW) is PutResult.REFUSED_TOPICS_FULL
    # Existing topics still take records.
    assert store.put(topic(1), record(key=2), NOW) is PutResult.STORED
    assert store.statistics().refused_topics_full == 1


def test_expire_frees_topics_for_new_ones():
    store = RecordStore(max_topics=1)
    store.put(topic(1), record(expires=int(NOW) + 10), NOW)
    assert store.put(topic(2), record(), NOW) is PutResult.REFUSED_TOPICS_FULL
    assert store.expire(NOW + 10) == 1
    assert store.put(topic(2), record(), NOW + 10) is PutResult.STORED


def test_a_full_topic_evicts_the_soonest_expiring_record_for_a_longer_lived_one():
    store = RecordStore(max_records_per_topic=3)
    for key, ttl in ((1, 300), (2, 100), (3, 200)):
        store.put(TOPIC, record(key=key, expires=int(NOW) + ttl), NOW)
    assert store.put(TOPIC, record(key=4, expires=int(NOW) + 150), NOW) is PutResult.STORED
    keys = {r.public_key[-1] for r in store.get(TOPIC, NOW)}
    assert keys == {1, 3, 4}
    stats = store.statistics()
    assert (stats.evicted, stats.records) == (1, 3)


def test_a_full_topic_refuses_a_record_that_expires_no_later_than_all_stored_ones():
    store = RecordStore(max_records_per_topic=2)
    store.put(TOPIC, record(key=1, expires=int(NOW) + 300), NOW)
    store.put(TOPIC, record(key=2, expires=int(NOW) + 200), NOW)
    result = store.put(TOPIC, record(key=3, expires=int(NOW) + 200), NOW)
    assert result is PutResult.REFUSED_TOPIC_FULL
    assert store.statistics().refused_topic_full == 1
    assert len(store) == 2


def test_a_full_topic_still_accepts_a_higher_seq_from_a_stored_key():
    store = RecordStore(max_records_per_topic=1)
    store.put(TOPIC, record(key=1, seq=1), NOW)
    assert store.put(TOPIC, record(key=1, seq=2), NOW) is PutResult.REPLACED


def test_a_full_topic_whose_records_all_expired_takes_a_new_record():
    store = RecordStore(max_topics=1, max_records_per_topic=2)
    store.put(TOPIC, record(key=1, expires=int(NOW) + 10), NOW)
    store.put(TOPIC, record(key=2, expires=int(NOW) + 10), NOW)
    later = NOW + 20
    assert store.put(TOPIC, record(key=3, expires=int(later) + 10), later) is PutResult.STORED
    assert store.get(TOPIC, later) == [record(key=3, expires=int(later) + 10)]
    stats = store.statistics()
    assert (stats.topics, stats.records, stats.expired, stats.evicted) == (1, 1, 2, 0)


# --- get, expire, remove -------------------------------------------------------------


def test_get_returns_the_newest_records_first_and_at_most_limit():
    store = RecordStore()
    for key, ttl in ((1, 100), (2, 500), (3, 300), (4, 400)):
        store.put(TOPIC, record(key=key, expires=int(NOW) + ttl), NOW)
    assert [r.public_key[-1] for r in store.get(TOPIC, NOW)] == [2, 4, 3, 1]
    assert [r.public_key[-1] for r in store.get(TOPIC, NOW, limit=2)] == [2, 4]
    assert store.get(TOPIC, NOW, limit=0) == []


def test_get_defaults_to_twenty_records_like_upstream():
    store = RecordStore()
    for key in range(30):
        store.put(TOPIC, record(key=key), NOW)
    assert len(store.get(TOPIC, NOW)) == 20


def test_get_drops_expired_records():
    store = RecordStore()
    store.put(TOPIC, record(key=1, expires=int(NOW) + 10), NOW)
    store.put(TOPIC, record(key=2, expires=int(NOW) + 20), NOW)
    assert [r.public_key[-1] for r in store.get(TOPIC, NOW + 10)] == [2]
    assert store.get(TOPIC, NOW + 20) == []
    stats = store.statistics()
    assert (stats.expired, stats.records, stats.topics) == (2, 0, 0)


def test_expire_counts_what_it_drops_and_removes_empty_topics():
    store = RecordStore()
    store.put(topic(1), record(key=1, expires=int(NOW) + 10), NOW)
    store.put(topic(1), record(key=2, expires=int(NOW) + 50), NOW)
    store.put(topic(2), record(key=1, expires=int(NOW) + 10), NOW)
    assert store.expire(NOW + 9) == 0
    assert store.expire(NOW + 10) == 2
    stats = store.statistics()
    assert (stats.topics, stats.records, stats.expired) == (1, 1, 2)


def test_an_unannounce_removes_the_record_only_if_its_seq_is_not_lower():
    store = RecordStore()
    store.put(TOPIC, record(seq=5), NOW)
    key = record().public_key
    assert not store.remove(TOPIC, key, 4)
    assert len(store) == 1
    assert store.remove(TOPIC, key, 5)
    assert store.statistics().removed == 1
    assert store.statistics().topics == 0


def test_an_unannounce_with_a_higher_seq_removes_the_record():
    store = RecordStore()
    store.put(TOPIC, record(seq=5), NOW)
    assert store.remove(TOPIC, record().public_key, 6)
    assert store.get(TOPIC, NOW) == []


@pytest.mark.parametrize(
    "args",
    [
        (OTHER_TOPIC, (1).to_bytes(32, "big"), 9),
        (TOPIC, (2).to_bytes(32, "big"), 9),
        (TOPIC, (1).to_bytes(32, "big"), True),
        (TOPIC, (1).to_bytes(32, "big"), "9"),
        ([1], (1).to_bytes(32, "big"), 9),
        (TOPIC, [1], 9),
    ],
)
def test_remove_returns_false_for_unknown_or_malformed_arguments(args):
    store = RecordStore()
    store.put(TOPIC, record(key=1, seq=1), NOW)
    assert store.remove(*args) is False
    assert len(store) == 1


def test_get_of_a_malformed_topic_is_empty():
    assert RecordStore().get([1, 2], NOW) == []


# --- invariants under random operations --------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    """Random puts, removes, gets and expiries never break the store's invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.store = RecordStore(max_topics=3, max_records_per_topic=3, max_ttl_s=100)
        self.now = NOW

    @rule(
        topic_n=st.integers(0, 4),
        key=st.integers(0, 5),
        seq=st.integers(0, 6),
        ttl=st.integers(-5, 200),
    )
    def put(self, topic_n, key, seq, ttl):
        before = self._held()
        new = record(key=key, seq=seq, expires=int(self.now) + ttl)
        result = self.store.put(topic(topic_n), new, self.now)
        slot = (topic(topic_n), new.public_key)
        if result.accepted:
            # A stored key only ever moves to a strictly higher seq.
            assert slot not in before or seq > before[slot].seq
            assert new in self.store.get(topic(topic_n), self.now, limit=100)
        else:
            if result is PutResult.IGNORED_OLDER_SEQ:
                assert seq <= before[slot].seq
            assert self._held().get(slot) == before.get(slot)

    @rule(topic_n=st.integers(0, 4), key=st.integers(0, 5), seq=st.integers(0, 6))
    def remove(self, topic_n, key, seq):
        slot = (topic(topic_n), key.to_bytes(32, "big"))
        held = self._held().get(slot)
        removed = self.store.remove(topic(topic_n), key.to_bytes(32, "big"), seq)
        assert removed == (held is not None and seq >= held.seq)

    @rule(step=st.floats(0, 60))
    def advance(self, step):
        self.now += step

    @rule()
    def expire(self):
        self.store.expire(self.now)
        assert all(r.expires > self.now for r in self._held().values())

    @rule(topic_n=st.integers(0, 4), limit=st.integers(-1, 5))
    def get(self, topic_n, limit):
        got = self.store.get(topic(topic_n), self.now, limit=limit)
        assert len(got) <= max(limit, 0)
        assert all(r.expires > self.now for r in got)
        assert [r.expires for r in got] == sorted((r.expires for r in got), reverse=True)

    @invariant()
    def bounded_and_counted(self):
        stats = self.store.statistics()
        topics = self.store._topics
        assert stats.topics == len(topics) <= 3
        assert all(0 < len(records) <= 3 for records in topics.values())
        assert stats.records == len(self.store) == sum(len(r) for r in topics.values())
        assert stats.records == (stats.stored - stats.evicted - stats.removed - stats.expired)

    def _held(self) -> dict[tuple[bytes, bytes], PeerRecord]:
        return {
            (t, key): e.record
            for t, records in self.store._topics.items() for key, e in records.items()
        }


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=examples(60), stateful_step_count=30,
                                     deadline=None)
