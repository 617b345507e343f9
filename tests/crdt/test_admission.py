"""Writer admission: a pure function of the admin entries, whatever their order."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crdt import Entry, EntryId, WriteRefused
from crdt._admission import compute_admission, plan_writer_change
from tests.examples import examples

DB = b"d" * 32
CREATOR, B, C, D = (bytes([n]) * 32 for n in (1, 2, 3, 4))


def entry(writer: bytes, index: int, clock: int, *ops) -> tuple[EntryId, Entry]:
    return EntryId(writer, index), Entry.create(DB, clock, {}, list(ops))


def add(key, admin=False):
    return ("add_writer", key, admin)


def remove(key, length):
    return ("remove_writer", key, length)


def test_the_creator_is_the_first_admin_and_others_need_an_add():
    admission = compute_admission(CREATOR, [])
    assert admission.is_admin(CREATOR)
    assert admission.counts(EntryId(CREATOR, 10**6))
    assert not admission.knows(B)
    assert not admission.counts(EntryId(B, 0))


def test_an_add_by_the_creator_admits_and_admin_grants_the_right_to_add():
    admission = compute_admission(CREATOR, [
        entry(CREATOR, 0, 1, add(B, admin=True)),
        entry(B, 0, 2, add(C)),
        entry(C, 0, 3, add(D)),  # C is a writer, not an admin: this does not count
    ])
    assert admission.is_admin(B)
    assert admission.is_writer(C) and not admission.is_admin(C)
    assert not admission.knows(D)


def test_an_add_by_a_writer_that_is_not_admitted_counts_for_nothing():
    admission = compute_admission(CREATOR, [entry(B, 0, 1, add(C, admin=True))])
    assert not admission.knows(B) and not admission.knows(C)


def test_a_removed_writer_keeps_only_its_first_entries_back_dated_ones_included():
    admission = compute_admission(CREATOR, [
        entry(CREATOR, 0, 1, add(B)),
        entry(CREATOR, 1, 50, remove(B, 3)),
    ])
    assert [admission.counts(EntryId(B, i)) for i in range(5)] == [True] * 3 + [False] * 2
    assert admission.counted_length(B, 10) == 3
    assert admission.knows(B) and not admission.is_writer(B)


def test_a_removed_admin_cannot_admit_an_accomplice_with_a_back_dated_entry():
    # B's add of D sits at index 5, beyond the cap of 2, with a clock (2) far
    # below the removal's: it must not count.
    admission = compute_admission(CREATOR, [
        entry(CREATOR, 0, 1, add(B, admin=True)),
        entry(CREATOR, 1, 100, remove(B, 2)),
        entry(B, 5, 2, add(D, admin=True)),
        entry(B, 1, 3, add(C)),  # within the cap: counts
    ])
    assert admission.is_writer(C)
    assert not admission.knows(D)


def test_removing_an_admin_voids_the_removals_it_made_beyond_its_cap():
    admission = compute_admission(CREATOR, [
        entry(CREATOR, 0, 1, add(B, admin=True), add(C)),
        entry(CREATOR, 1, 10, remove(B, 1)),
        entry(B, 3, 20, remove(C, 0)),  # B's index 3 is beyond its cap of 1
    ])
    assert admission.is_writer(C)


def test_a_removed_key_is_never_readmitted():
    admission = compute_admission(CREATOR, [
        entry(CREATOR, 0, 1, add(B)),
        entry(CREATOR, 1, 2, remove(B, 4)),
        entry(CREATOR, 2, 3, add(B)),
    ])
    assert admission.counted_length(B, 100) == 4
    assert not admission.is_writer(B)


admin_ops = st.one_of(
    st.builds(add, st.sampled_from([B, C, D]), st.booleans()),
    st.builds(remove, st.sampled_from([CREATOR, B, C, D]), st.integers(0, 4)),
)


@st.composite
def admin_histories(draw):
    entries, lengths = [], {}
    for _ in range(draw(st.integers(0, 12))):
        writer = draw(st.sampled_from([CREATOR, B, C, D]))
        index = lengths.get(writer, 0)
        lengths[writer] = index + 1
        ops = draw(st.lists(admin_ops, min_size=1, max_size=3))
        entries.append(entry(writer, index, draw(st.integers(1, 20)), *ops))
    return entries


@settings(max_examples=examples(300))
@given(admin_histories(), st.randoms(use_true_random=False))
def test_every_order_of_the_same_entries_gives_the_same_admission(entries, rng):
    shuffled = list(entries)
    rng.shuffle(shuffled)
    assert compute_admission(CREATOR, entries) == compute_admission(CREATOR, shuffled)


@settings(max_examples=examples(300))
@given(admin_histories())
def test_caps_hold_whatever_the_history(entries):
    admission = compute_admission(CREATOR, entries)
    for grant in admission.writers.values():
        if grant.cap is not None:
            assert not admission.counts(EntryId(grant.key, grant.cap))
            assert not admission.is_writer(grant.key)
    # Whoever counts was admitted by a counted add of a counted admin (or is the creator).
    for grant in admission.writers.values():
        if grant.added_by is not None:
            assert admission.counts(grant.added_by)
            assert admission.writers[grant.added_by.writer].admin


def test_the_only_admin_cannot_remove_itself_or_be_removed():
    admission = compute_admission(CREATOR, [entry(CREATOR, 0, 1, add(B))])
    with pytest.raises(WriteRefused) as refused:
        plan_writer_change(admission, CREATOR, "remove_writer", CREATOR, length_seen=1)
    assert refused.value.code == "LAST_ADMIN"
    # With a second admin, either may go.
    admission = compute_admission(CREATOR, [entry(CREATOR, 0, 1, add(B, True))])
    assert plan_writer_change(admission, CREATOR, "remove_writer", CREATOR,
                              length_seen=1) == remove(CREATOR, 1)
    assert plan_writer_change(admission, B, "remove_writer", CREATOR,
                              length_seen=1) == remove(CREATOR, 1)


@settings(max_examples=examples(300))
@given(admin_histories(), st.data())
def test_a_removal_an_admin_may_plan_never_leaves_the_database_without_an_admin(entries, data):
    admission = compute_admission(CREATOR, entries)
    admins = [key for key in (CREATOR, B, C, D) if admission.is_admin(key)]
    if not admins:
        return  # a random history may already have none; nobody may plan anything then
    me = data.draw(st.sampled_from(admins))
    target = data.draw(st.sampled_from([k for k in (CREATOR, B, C, D) if admission.knows(k)]))
    lengths: dict[bytes, int] = {}
    for where, _ in entries:
        lengths[where.writer] = max(lengths.get(where.writer, 0), where.index + 1)
    try:
        op = plan_writer_change(admission, me, "remove_writer", target,
                                length_seen=lengths.get(target, 0))
    except WriteRefused as exc:
        assert exc.code == "LAST_ADMIN"
        assert admins == [target]
        return
    if op is None:
        return
    clock = 1 + max((e.clock for _, e in entries), default=0)
    after = compute_admission(CREATOR, [*entries, entry(me, lengths.get(me, 0), clock, op)])
    assert not after.is_writer(target)
    assert any(after.is_admin(key) for key in (CREATOR, B, C, D))
