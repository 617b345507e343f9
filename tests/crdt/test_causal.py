"""The causal gate: entries in any order come out once their dependencies are in."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdt import Entry, EntryId
from crdt._causal import CausalGate, GateResult, Refusal
from tests.examples import examples

pytestmark = pytest.mark.slow

DB = b"d" * 32
OTHER_DB = b"x" * 32
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


def _check_causal(result: GateResult, have: dict[bytes, int], released: list) -> None:
    for where, entry in result.released:
        # Everything it depends on was released before it.
        assert have.get(where.writer, 0) == where.index
        for writer, length in entry.deps:
            assert have.get(writer, 0) >= length
        have[where.writer] = where.index + 1
        released.append((where, entry))


@settings(max_examples=examples(100))
@given(histories(), st.randoms(use_true_random=False), st.integers(0, 10))
def test_any_delivery_order_releases_everything_in_a_causal_order(story, rng, dupes):
    history, lengths = story
    deliveries = history + [rng.choice(history) for _ in range(dupes)]
    rng.shuffle(deliveries)
    gate = CausalGate(DB)
    released, have = [], {}
    for where, entry in deliveries:
        result = gate.offer(where, entry)
        assert result.refused == []
        _check_causal(result, have, released)
    assert sorted(released, key=lambda i: (i[0].writer, i[0].index)) == sorted(
        history, key=lambda i: (i[0].writer, i[0].index))
    assert gate.lengths() == {w: n for w, n in lengths.items() if n}
    assert gate.waiting == 0 and gate.stopped == {} and gate.refused == 0
    assert gate.max_clock == max(entry.clock for _, entry in history)


# -- invalid entries: a reference model and random damage ----------------------------


@st.composite
def damaged_histories(draw):
    """A valid history, then some clocks changed, some dbs wrong, some payloads bad."""
    history, _ = draw(histories())
    entries = dict(history)
    ids = sorted(entries, key=lambda w: (w.writer, w.index))
    for where in draw(st.lists(st.sampled_from(ids), max_size=3, unique=True)):
        entry = entries[where]
        clock = draw(st.integers(1, entry.clock + 5))
        entries[where] = Entry(entry.db, clock, entry.deps, entry.ops)
    for where in draw(st.lists(st.sampled_from(ids), max_size=2, unique=True)):
        entry = entries[where]
        entries[where] = Entry(OTHER_DB, entry.clock, entry.deps, entry.ops)
    bad_payloads = draw(st.lists(st.sampled_from(ids), max_size=2, unique=True))
    for where in bad_payloads:
        del entries[where]  # the caller could not decode it: it reports a stop instead
    return entries, bad_payloads


def reference(entries: dict[EntryId, Entry], bad_payloads: list[EntryId]):
    """The outcome with full knowledge: a plain fixpoint over the whole set."""
    stops: dict[bytes, tuple[int, str]] = {}
    clocks: dict[bytes, list[int]] = {}

    def stop_at(writer: bytes) -> float:
        return stops[writer][0] if writer in stops else float("inf")

    def put(where: EntryId, code: str) -> None:
        if where.index < stop_at(where.writer):
            stops[where.writer] = (where.index, code)

    for where in bad_payloads:
        put(where, "BAD_PAYLOAD")
    for where, entry in entries.items():
        if entry.db != DB:
            put(where, "WRONG_DB")
    changed = True
    while changed:
        changed = False
        for where, entry in sorted(entries.items(), key=lambda i: (i[0].writer, i[0].index)):
            mine = clocks.setdefault(where.writer, [])
            if where.index < len(mine) or where.index >= stop_at(where.writer):
                continue
            if any(n > stop_at(w) for w, n in entry.deps):
                put(where, "BAD_DEPS")
                changed = True
                continue
            if where.index != len(mine) or any(
                    len(clocks.get(w, ())) < n for w, n in entry.deps):
                continue
            floor = max([mine[-1]] if mine else [0])
            floor = max([floor] + [clocks[w][n - 1] for w, n in entry.deps])
            if entry.clock > floor:
                mine.append(entry.clock)
            else:
                put(where, "BAD_CLOCK")
            changed = True
    released = {EntryId(w, i) for w, c in clocks.items() for i in range(len(c))}
    waiting = sum(1 for where in entries
                  if where not in released and where.index < stop_at(where.writer))
    return released, stops, waiting


def deliver(entries, bad_payloads, rng, dupes):
    """Feed everything in a random order, with duplicates, through offer, offer_many, stop."""
    calls = [("offer", where) for where in entries] + [("stop", w) for w in bad_payloads]
    calls += [rng.choice(calls) for _ in range(dupes)]
    rng.shuffle(calls)
    gate = CausalGate(DB)
    released, have, refused = [], {}, []
    position = 0
    while position < len(calls):
        kind, where = calls[position]
        if kind == "stop":
            result = gate.stop(where.writer, where.index, "BAD_PAYLOAD", "does not decode")
            position += 1
        elif rng.random() < 0.5:
            result = gate.offer(where, entries[where])
            position += 1
        else:
            batch = []
            while position < len(calls) and calls[position][0] == "offer" and len(batch) < 5:
                batch.append(calls[position][1])
                position += 1
            result = gate.offer_many((w, entries[w]) for w in batch)
        _check_causal(result, have, released)
        refused += result.refused
    assert len({where for where, _ in released}) == len(released)
    assert gate.refused == len(refused)
    assert all(entries[where] == entry for where, entry in released)
    # One refusal per stop point the gate went through; the last one per writer stands.
    assert {r.where.writer: (r.where.index, r.code)
            for r in sorted(refused, key=lambda r: -r.where.index)} == gate.stopped
    return {where for where, _ in released}, gate.stopped, gate.waiting


@settings(max_examples=examples(150))
@given(damaged_histories(), st.randoms(use_true_random=False),
       st.randoms(use_true_random=False), st.integers(0, 10))
def test_what_is_released_and_stopped_depends_only_on_the_set(story, rng1, rng2, dupes):
    entries, bad_payloads = story
    expected = reference(entries, bad_payloads)
    first = deliver(entries, bad_payloads, rng1, dupes)
    second = deliver(entries, bad_payloads, rng2, dupes)
    assert first == second == expected


# -- examples ------------------------------------------------------------------------


def test_a_clock_not_above_a_dependency_stops_the_writer():
    gate = CausalGate(DB)
    a, b = WRITERS[:2]
    assert gate.offer(EntryId(a, 0), Entry.create(DB, 5, {}, [])).released
    result = gate.offer(EntryId(b, 0), Entry.create(DB, 5, {a: 1}, []))  # saw 5, claims 5
    assert result.released == [] and [r.code for r in result.refused] == ["BAD_CLOCK"]
    result = gate.offer(EntryId(a, 1), Entry.create(DB, 3, {}, []))  # below its own previous
    assert [(r.where, r.code) for r in result.refused] == [(EntryId(a, 1), "BAD_CLOCK")]
    assert gate.lengths() == {a: 1} and gate.refused == 2
    assert gate.stopped == {a: (1, "BAD_CLOCK"), b: (0, "BAD_CLOCK")}
    # Later entries of a stopped writer, and duplicates, are ignored silently.
    assert gate.offer(EntryId(a, 2), Entry.create(DB, 9, {}, [])) == GateResult([], [])
    assert gate.offer(EntryId(b, 0), Entry.create(DB, 5, {a: 1}, [])) == GateResult([], [])
    assert gate.refused == 2 and gate.waiting == 0
    assert gate.clock(a, 0) == 5 and gate.max_clock == 5
    with pytest.raises(IndexError):
        gate.clock(a, 1)


def test_an_entry_of_another_database_is_refused():
    gate = CausalGate(DB)
    result = gate.offer(EntryId(WRITERS[0], 0), Entry.create(OTHER_DB, 1, {}, []))
    assert [r.code for r in result.refused] == ["WRONG_DB"]
    assert gate.stopped == {WRITERS[0]: (0, "WRONG_DB")}


def test_a_stop_drops_waiting_entries_and_cascades_to_dependents():
    a, b, c = WRITERS[:3]
    gate = CausalGate(DB)
    gate.offer(EntryId(a, 2), Entry.create(DB, 3, {}, []))  # waits for a[1]
    gate.offer(EntryId(b, 0), Entry.create(DB, 4, {a: 2}, []))  # waits for a[0..1]
    gate.offer(EntryId(b, 1), Entry.create(DB, 5, {}, []))  # waits for b[0]
    gate.offer(EntryId(c, 0), Entry.create(DB, 6, {b: 2}, []))  # waits for b[0..1]
    gate.offer(EntryId(c, 1), Entry.create(DB, 7, {a: 1}, []))  # still possible
    assert gate.waiting == 5
    assert gate.offer(EntryId(a, 0), Entry.create(DB, 1, {}, [])).released
    result = gate.stop(a, 1, "BAD_PAYLOAD")
    assert {(r.where, r.code) for r in result.refused} == {
        (EntryId(a, 1), "BAD_PAYLOAD"), (EntryId(b, 0), "BAD_DEPS"),
        (EntryId(c, 0), "BAD_DEPS")}
    assert gate.stopped == {a: (1, "BAD_PAYLOAD"), b: (0, "BAD_DEPS"), c: (0, "BAD_DEPS")}
    assert gate.waiting == 0 and gate.refused == 3
    # A later stop keeps the lower one; a stop at or above it reports nothing.
    assert gate.stop(a, 3, "BAD_PAYLOAD") == GateResult([], [])
    assert gate.stopped[a] == (1, "BAD_PAYLOAD")
    # An entry offered later that depends beyond the stop is refused at once.
    d = WRITERS[3]
    result = gate.offer(EntryId(d, 0), Entry.create(DB, 9, {a: 2}, []))
    assert [r.code for r in result.refused] == ["BAD_DEPS"]


def test_a_caller_stop_where_an_entry_waits_drops_it():
    a, b = WRITERS[:2]
    gate = CausalGate(DB)
    gate.offer(EntryId(a, 1), Entry.create(DB, 2, {b: 1}, []))
    result = gate.stop(a, 1, "BAD_PAYLOAD")
    assert [r.code for r in result.refused] == ["BAD_PAYLOAD"] and gate.waiting == 0
    # A stop at the same index by another reason keeps BAD_PAYLOAD, whatever the order.
    gate.stop(a, 1, "BAD_CLOCK")
    assert gate.stopped == {a: (1, "BAD_PAYLOAD")}


def test_stopping_below_the_released_length_is_a_caller_bug():
    gate = CausalGate(DB)
    gate.offer(EntryId(WRITERS[0], 0), Entry.create(DB, 1, {}, []))
    with pytest.raises(ValueError):
        gate.stop(WRITERS[0], 0, "BAD_PAYLOAD")
    assert gate.stopped == {}
    assert gate.stop(WRITERS[0], 1, "BAD_PAYLOAD").refused  # at the length is fine


def test_waiting_entries_are_bounded_and_the_bound_is_transient():
    a = WRITERS[0]
    gate = CausalGate(DB, max_waiting=3)
    for index in range(1, 4):  # index 0 has not arrived yet
        assert gate.offer(EntryId(a, index), Entry.create(DB, index + 1, {}, [])) == GateResult()
    result = gate.offer(EntryId(a, 4), Entry.create(DB, 5, {}, []))
    assert [r.code for r in result.refused] == ["TOO_MANY_WAITING"]
    assert gate.refused == 0 and gate.stopped == {} and gate.waiting == 3
    # A ready entry is accepted at the bound: it is what the waiting ones need.
    result = gate.offer(EntryId(a, 0), Entry.create(DB, 1, {}, []))
    assert [where.index for where, _ in result.released] == [0, 1, 2, 3]
    # Turned away is not stopped: offered again, it goes through.
    result = gate.offer(EntryId(a, 4), Entry.create(DB, 5, {}, []))
    assert [where.index for where, _ in result.released] == [4]


def test_two_long_logs_fed_one_after_the_other_take_linear_time():
    """A's entries each depend on B's previous length; all of A arrives before any of B."""
    a, b, n = WRITERS[0], WRITERS[1], 20_000
    log_a = [(EntryId(a, i), Entry.create(DB, i + 2, {b: i}, [])) for i in range(n)]
    log_b = [(EntryId(b, i), Entry.create(DB, i + 1, {}, [])) for i in range(n)]
    gate = CausalGate(DB)
    first = gate.offer_many(log_a)
    assert len(first.released) == 1 and gate.waiting == n - 1
    second = GateResult()
    for where, entry in log_b:  # one by one: each release lets one of A's go
        result = gate.offer(where, entry)
        second.released += result.released
    assert len(second.released) == 2 * n - 1 and not second.refused
    assert gate.lengths() == {a: n, b: n} and gate.waiting == 0


def test_deep_chains_do_not_recurse():
    a, n = WRITERS[0], 20_000
    log = [(EntryId(a, i), Entry.create(DB, i + 1, {}, [])) for i in range(n)]
    gate = CausalGate(DB)
    assert gate.offer_many(reversed(log[1:])) == GateResult()
    assert len(gate.offer(*log[0]).released) == n
    # A stop cascading through many writers, each depending on the previous one.
    keys = [i.to_bytes(32, "big") for i in range(1, 5_001)]
    gate = CausalGate(DB)
    gate.offer_many((EntryId(k, 0), Entry.create(DB, 2, {prev: 1}, []))
                    for prev, k in itertools.pairwise(keys))
    assert gate.waiting == len(keys) - 1
    result = gate.stop(keys[0], 0, "BAD_PAYLOAD")
    assert len(result.refused) == len(keys) and gate.waiting == 0
    assert len(gate.stopped) == len(keys)


def test_lowering_a_stop_refuses_what_depended_up_to_the_old_one():
    a, b, c = WRITERS[:3]
    gate = CausalGate(DB)
    gate.offer(EntryId(b, 0), Entry.create(DB, 9, {a: 3}, []))  # fine while a stops at 3
    gate.offer(EntryId(c, 0), Entry.create(DB, 9, {a: 2}, []))
    gate.offer(EntryId(WRITERS[3], 0), Entry.create(DB, 9, {a: 1}, []))  # still possible
    assert gate.stop(a, 3, "BAD_PAYLOAD").refused == [Refusal(EntryId(a, 3), "BAD_PAYLOAD", "")]
    assert gate.waiting == 3
    result = gate.offer(EntryId(a, 1), Entry.create(OTHER_DB, 2, {}, []))
    assert {(r.where, r.code) for r in result.refused} == {
        (EntryId(a, 1), "WRONG_DB"), (EntryId(b, 0), "BAD_DEPS"), (EntryId(c, 0), "BAD_DEPS")}
    assert gate.stopped == {a: (1, "WRONG_DB"), b: (0, "BAD_DEPS"), c: (0, "BAD_DEPS")}
    assert gate.waiting == 1


def test_an_entry_depending_on_its_own_later_entries_can_never_be_ready():
    a = WRITERS[0]
    gate = CausalGate(DB)
    result = gate.offer(EntryId(a, 0), Entry.create(DB, 1, {a: 1}, []))
    assert [r.code for r in result.refused] == ["BAD_DEPS"]
    assert gate.stopped == {a: (0, "BAD_DEPS")}
    gate = CausalGate(DB)  # on its own earlier entries: implied, and fine
    gate.offer(EntryId(a, 0), Entry.create(DB, 1, {}, []))
    assert gate.offer(EntryId(a, 1), Entry.create(DB, 2, {a: 1}, [])).released
