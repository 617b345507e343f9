"""The causal gate: entries in any order come out once their dependencies are in."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdt import BadEntry, Entry, EntryId
from crdt._causal import CausalGate

DB = b"d" * 32
WRITERS = [bytes([n]) * 32 for n in range(1, 5)]


@st.composite
def histories(draw):
    """A causally valid history: each entry saw a random subset of what existed."""
    writers = WRITERS[: draw(st.integers(2, 4))]
    lengths = dict.fromkeys(writers, 0)
    clocks: dict[bytes, list[int]] = {w: [] for w in writers}
    history = []
    for _ in range(draw(st.integers(1, 40))):
        writer = draw(st.sampled_from(writers))
        seen = draw(st.lists(st.sampled_from(writers), unique=True))
        deps = {w: draw(st.integers(0, lengths[w])) for w in seen if w != writer}
        floor = max([clocks[writer][-1]] if clocks[writer] else [0])
        floor = max([floor] + [clocks[w][n - 1] for w, n in deps.items() if n])
        clock = floor + draw(st.integers(1, 3))
        history.append((EntryId(writer, lengths[writer]), Entry.create(DB, clock, deps, [])))
        clocks[writer].append(clock)
        lengths[writer] += 1
    return history, lengths


@settings(max_examples=200)
@given(histories(), st.randoms(use_true_random=False), st.integers(0, 10))
def test_any_delivery_order_releases_everything_in_a_causal_order(story, rng, dupes):
    history, lengths = story
    deliveries = history + [rng.choice(history) for _ in range(dupes)]
    rng.shuffle(deliveries)
    gate = CausalGate(DB)
    released, have = [], {}
    for where, entry in deliveries:
        for item in gate.offer(where, entry):
            where_done, entry_done = item
            # Everything it depends on was released before it.
            assert have.get(where_done.writer, 0) == where_done.index
            for writer, length in entry_done.deps:
                assert have.get(writer, 0) >= length
            have[where_done.writer] = where_done.index + 1
            released.append(item)
    assert sorted(released, key=lambda i: (i[0].writer, i[0].index)) == sorted(
        history, key=lambda i: (i[0].writer, i[0].index))
    assert gate.lengths() == {w: n for w, n in lengths.items() if n}
    assert gate.waiting == 0


def test_a_clock_not_above_a_dependency_is_refused():
    gate = CausalGate(DB)
    a, b = WRITERS[:2]
    assert gate.offer(EntryId(a, 0), Entry.create(DB, 5, {}, []))
    with pytest.raises(BadEntry) as caught:
        gate.offer(EntryId(b, 0), Entry.create(DB, 5, {a: 1}, []))  # saw clock 5, claims 5
    assert caught.value.code == "BAD_CLOCK"
    with pytest.raises(BadEntry):
        gate.offer(EntryId(a, 1), Entry.create(DB, 3, {}, []))  # below its own previous
    assert gate.lengths() == {a: 1} and gate.refused == 2


def test_an_entry_of_another_database_is_refused():
    with pytest.raises(BadEntry) as caught:
        CausalGate(DB).offer(EntryId(WRITERS[0], 0), Entry.create(b"x" * 32, 1, {}, []))
    assert caught.value.code == "WRONG_DB"


def test_waiting_entries_are_bounded():
    gate = CausalGate(DB, max_waiting=3)
    for index in range(1, 4):  # index 0 never arrives
        assert gate.offer(EntryId(WRITERS[0], index), Entry.create(DB, index + 1, {}, [])) == []
    with pytest.raises(BadEntry) as caught:
        gate.offer(EntryId(WRITERS[0], 4), Entry.create(DB, 5, {}, []))
    assert caught.value.code == "TOO_MANY_WAITING"
    released = gate.offer(EntryId(WRITERS[0], 0), Entry.create(DB, 1, {}, []))
    assert [where.index for where, _ in released] == [0, 1, 2, 3]
