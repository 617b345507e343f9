"""Entry payloads: round trips, refusals, and the order every replica uses."""

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crdt import BadEntry, Entry, EntryId
from crdt._entries import decode_entry, order_key

DB = b"d" * 32
keys = st.binary(min_size=32, max_size=32)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                    st.text(max_size=20), st.binary(max_size=40))
ops = st.lists(st.tuples(st.sampled_from(["put_key", "revoke_key", "add_usage"]),
                         scalars, scalars), max_size=8)


@given(st.integers(1, 2**63 - 1), st.dictionaries(keys, st.integers(0, 2**40), max_size=6),
       ops)
def test_every_entry_round_trips(clock, deps, operations):
    entry = Entry.create(DB, clock, deps, operations)
    assert decode_entry(entry.encode()) == entry
    assert [key for key, _ in entry.deps] == sorted(k for k, n in deps.items() if n)


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"\xc1", "DECODE_ERROR"),  # not msgpack
        ([1, DB, 1, []], "DECODE_ERROR"),  # four items
        ([2, DB, 1, [], []], "BAD_VERSION"),
        ([True, DB, 1, [], []], "BAD_VERSION"),
        ([1, b"short", 1, [], []], "BAD_DB"),
        ([1, DB, 0, [], []], "BAD_CLOCK"),
        ([1, DB, 2**63, [], []], "BAD_CLOCK"),
        ([1, DB, 1.5, [], []], "BAD_CLOCK"),
        ([1, DB, 1, [[b"k" * 32, 0]], []], "BAD_DEPS"),  # a zero length names nothing
        ([1, DB, 1, [[b"k" * 32, 1], [b"a" * 32, 1]], []], "BAD_DEPS"),  # unsorted
        ([1, DB, 1, [[b"k" * 32, 1], [b"k" * 32, 2]], []], "BAD_DEPS"),  # twice
        ([1, DB, 1, [[b"k" * 31, 1]], []], "BAD_DEPS"),
        ([1, DB, 1, [], [[]]], "BAD_OPS"),
        ([1, DB, 1, [], [[7, 1]]], "BAD_OPS"),  # an op starts with its name
        ([1, DB, 1, [], [["add_usage"]] * 1025], "BAD_OPS"),
    ],
)
def test_a_bad_entry_is_refused_with_its_code(wire, code):
    payload = wire if isinstance(wire, bytes) else msgpack.packb(wire, use_bin_type=True)
    with pytest.raises(BadEntry) as caught:
        decode_entry(payload)
    assert caught.value.code == code


@given(st.binary(max_size=200))
def test_arbitrary_bytes_only_ever_raise_bad_entry(payload):
    try:
        decode_entry(payload)
    except BadEntry:
        pass


def test_replicas_order_by_clock_then_writer_then_index():
    a, b = b"a" * 32, b"b" * 32
    placed = [
        (Entry.create(DB, 2, {}, []), EntryId(a, 1)),
        (Entry.create(DB, 1, {}, []), EntryId(b, 0)),
        (Entry.create(DB, 2, {}, []), EntryId(b, 1)),
        (Entry.create(DB, 1, {}, []), EntryId(a, 0)),
    ]
    ordered = sorted(placed, key=lambda pair: order_key(*pair))
    assert [(e.clock, i.writer[:1], i.index) for e, i in ordered] == [
        (1, b"a", 0), (1, b"b", 0), (2, b"a", 1), (2, b"b", 1)]
