"""The SQLite view: each table's rule, the queries, and convergence under any order."""

import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crdt import ApiKey, Entry, EntryId, ModelMaster, Usage, hash_secret
from crdt._view import View, ViewMismatch
from tests.examples import examples

DB = b"d" * 32
W1, W2, W3 = (bytes([n]) * 32 for n in (1, 2, 3))
DAY = "2024-05-01"


def e(writer, index, clock, *ops):
    return EntryId(writer, index), Entry.create(DB, clock, {}, ops)


def key_put(id_, team="t", secret="s", name="n", scopes=("chat",), created=1):
    return ("key_put", id_, team, name, hash_secret(secret), list(scopes), created)


def usage(key_id, model, day, p=0, c=0, t=0, a=0, r=1):
    return ("usage_add", key_id, model, day, p, c, t, a, r)


@pytest.fixture
def view(tmp_path):
    with View.open(tmp_path / "view.db", db=DB) as v:
        yield v


def apply_each(view, *entries):
    """Apply each entry in its own call (separate transactions)."""
    return sum(view.apply([entry]) for entry in entries)


# --- model_masters: LWW register by stamp ------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
def test_model_higher_clock_wins(view, reverse):
    entries = [e(W2, 0, 1, ("model_put", "m", "old", {})),
               e(W1, 0, 2, ("model_put", "m", "new", {"t": 1}))]
    apply_each(view, *(entries[::-1] if reverse else entries))
    assert view.model("m") == ModelMaster("m", "new", {"t": 1})


@pytest.mark.parametrize("reverse", [False, True])
def test_model_equal_clock_larger_writer_wins(view, reverse):
    entries = [e(W2, 0, 5, ("model_put", "m", "two", {})),
               e(W1, 0, 5, ("model_put", "m", "one", {}))]
    apply_each(view, *(entries[::-1] if reverse else entries))
    assert view.model("m").runtime == "two"


def test_model_delete_then_later_put_revives(view):
    apply_each(view, e(W1, 1, 3, ("model_put", "m", "r2", {})),
               e(W1, 0, 2, ("model_delete", "m")))
    assert view.model("m").runtime == "r2"  # the delete is older than the put
    apply_each(view, e(W2, 0, 4, ("model_delete", "m")))
    assert view.model("m") is None
    assert view.models() == []
    apply_each(view, e(W1, 2, 1, ("model_put", "m", "stale", {})))
    assert view.model("m") is None  # an older put does not revive
    apply_each(view, e(W1, 3, 5, ("model_put", "m", "r5", {"b": [1], "a": "x"})))
    assert view.models() == [ModelMaster("m", "r5", {"a": "x", "b": [1]})]


def test_within_one_entry_the_later_op_wins(view):
    view.apply([e(W1, 0, 1, ("model_put", "m", "first", {}), ("model_delete", "m"),
                  ("model_put", "m", "last", {}), key_put("k", team="a"),
                  key_put("k", team="b"))])
    assert view.model("m").runtime == "last"
    assert view.key("k").team == "b"


def test_defaults_are_stored_as_canonical_json(view):
    view.apply([e(W1, 0, 1, ("model_put", "m", "r", {"z": 1, "a": {"y": 2, "b": 0.5}}))])
    assert view.dump()["model_masters"][0][2] == '{"a":{"b":0.5,"y":2},"z":1}'


# --- api_keys: LWW fields, revocation wins -----------------------------------


def test_key_fields_are_last_writer_wins(view):
    apply_each(view, e(W1, 0, 7, key_put("k", team="late")),
               e(W2, 0, 3, key_put("k", team="early")))
    assert view.key("k").team == "late"
    assert view.keys_of_team("early") == []


def test_revoke_before_put_keeps_the_key_revoked(view):
    view.apply([e(W1, 0, 1, ("key_revoke", "k", 50))])
    assert view.key("k") is None  # nothing to show yet, but the tombstone is kept
    assert view.counts()["api_keys"] == 0
    view.apply([e(W2, 0, 9, key_put("k", secret="s"))])
    key = view.key("k")
    assert key.revoked and key.revoked_ms == 50
    assert view.key_by_secret("s").revoked


def test_revoke_beats_a_concurrent_later_stamped_put(view):
    apply_each(view, e(W1, 0, 1, key_put("k", team="a")),
               e(W1, 1, 2, ("key_revoke", "k", 10)),
               e(W2, 0, 9, key_put("k", team="b")))
    key = view.key("k")
    assert key.revoked and key.team == "b"


def test_revoked_ms_is_the_minimum(view):
    view.apply([e(W1, 0, 1, key_put("k"))])
    apply_each(view, e(W1, 1, 2, ("key_revoke", "k", 30)),
               e(W2, 0, 3, ("key_revoke", "k", 20)),
               e(W3, 0, 4, ("key_revoke", "k", 40)))
    assert view.key("k").revoked_ms == 20


def test_key_by_secret(view):
    view.apply([e(W1, 0, 1, key_put("k1", secret="alpha", scopes=["chat", "audio"],
                                   created=123)),
                e(W1, 1, 2, key_put("k2", secret="beta"))])
    key = view.key_by_secret("alpha")
    assert key == ApiKey("k1", "t", "n", hash_secret("alpha"), ("chat", "audio"), 123,
                         False, None)
    assert not hasattr(key, "secret")
    assert view.key_by_secret("beta").id == "k2"
    assert view.key_by_secret("alphA") is None
    assert view.key_by_secret("") is None
    view.apply([e(W1, 2, 3, ("key_revoke", "k1", 9))])
    assert view.key_by_secret("alpha").revoked


def test_the_secret_is_never_stored(tmp_path):
    with View.open(tmp_path / "v.db", db=DB) as v:
        v.apply([e(W1, 0, 1, key_put("k", secret="very-secret-string"))])
    for name in ("v.db", "v.db-wal"):
        path = tmp_path / name
        assert not path.exists() or b"very-secret-string" not in path.read_bytes()


def test_keys_of_team(view):
    view.apply([e(W1, 0, 1, key_put("b", team="t1"), key_put("a", team="t1"),
                  key_put("c", team="t2"), ("key_revoke", "a", 5), ("key_revoke", "z", 5))])
    assert [k.id for k in view.keys_of_team("t1")] == ["a", "b"]
    assert [k.revoked for k in view.keys_of_team("t1")] == [True, False]
    assert [k.id for k in view.keys_of_team("t2")] == ["c"]
    assert view.keys_of_team("none") == []


# --- token_usage and key_last_used --------------------------------------------


def test_usage_sums_are_exact(view):
    big = 2**53 - 1
    view.apply([e(W1, 0, 1, usage("k", "m", DAY, p=big, a=1)),
                e(W2, 0, 1, usage("k", "m", DAY, p=big, c=3, a=2))])
    view.apply([e(W1, 1, 2, usage("k", "m", DAY, p=1, t=7, a=3), usage("k", "m", DAY, r=5))])
    [row] = view.usage("k")
    assert row == Usage("k", "m", DAY, 2 * big + 1, 3, 7, 6, 1 + 1 + 1 + 5)
    assert isinstance(row.audio_ms, int)


def test_usage_saturates_instead_of_overflowing(view):
    cap = 2**63 - 1
    ops = [usage("k", "m", DAY, p=2**53 - 1) for _ in range(600)]
    view.apply([e(W1, 0, 1, *ops)])
    view.apply([e(W1, 1, 2, *ops)])
    view.apply([e(W1, 2, 3, *ops)])
    [row] = view.usage("k")
    assert row.prompt == cap and isinstance(row.prompt, int)
    assert row.requests == 1800


def test_usage_ranges(view):
    view.apply([e(W1, 0, 1, usage("k", "b", "2024-01-02", p=1),
                  usage("k", "a", "2024-01-02", p=2), usage("k", "a", "2024-01-01", p=3),
                  usage("k", "a", "2024-01-03", p=4), usage("other", "a", "2024-01-02", p=5))])
    assert [(u.day, u.model) for u in view.usage("k")] == [
        ("2024-01-01", "a"), ("2024-01-02", "a"), ("2024-01-02", "b"), ("2024-01-03", "a")]
    assert [u.prompt for u in view.usage("k", model="a")] == [3, 2, 4]
    assert [u.prompt for u in view.usage("k", day_from="2024-01-02")] == [2, 1, 4]
    assert [u.prompt for u in view.usage("k", day_to="2024-01-02")] == [3, 2, 1]
    assert [u.prompt for u in view.usage("k", "a", "2024-01-02", "2024-01-02")] == [2]
    assert view.usage("nobody") == []


def test_key_last_used_is_the_maximum(view):
    assert view.last_used("k") is None
    apply_each(view, e(W1, 0, 1, ("key_used", "k", 100), ("key_used", "k", 300)),
               e(W2, 0, 1, ("key_used", "k", 200)))
    assert view.last_used("k") == 300


# --- bookkeeping ---------------------------------------------------------------


def test_invalid_ops_are_skipped_and_counted(view):
    applied = view.apply([e(W1, 0, 1, ("model_put", "m", "r", {}), ("model_put", "", "r", {}),
                            ("bogus", 1), ("key_used", "k", -1), ("key_used", "k", 1))])
    assert applied == 2
    assert view.skipped_ops == 3
    assert view.counts()["model_masters"] == 1
    assert view.applied_lengths() == {W1: 1}


def test_admin_ops_are_ignored(view):
    applied = view.apply([e(W1, 0, 1, ("add_writer", W2, True), ("remove_writer", W3, 0),
                            ("add_writer", "garbage"))])
    assert applied == 0 and view.skipped_ops == 0
    assert all(n == 0 for n in view.counts().values())
    assert view.applied_lengths() == {W1: 1}


def test_applied_lengths_cover_each_writers_prefix(view):
    assert view.applied_lengths() == {}
    view.apply([e(W1, 0, 1), e(W1, 1, 2), e(W2, 0, 1)])
    view.apply([e(W1, 2, 3)])
    view.apply([])
    assert view.applied_lengths() == {W1: 3, W2: 1}


def test_counts_reset_and_reopen(tmp_path):
    path = tmp_path / "v.db"
    with View.open(path, db=DB) as v:
        v.apply([e(W1, 0, 1, key_put("k"), ("key_revoke", "ghost", 1), ("model_put", "m", "r", {}),
                    usage("k", "m", DAY), ("key_used", "k", 1))])
        assert v.counts() == {"api_keys": 1, "model_masters": 1, "token_usage": 1,
                              "key_last_used": 1}
        before = v.dump()
    with View.open(path, db=DB) as v:  # the rows survive a reopen
        assert v.dump() == before
        assert v.applied_lengths() == {W1: 1}
        v.reset()
        assert all(n == 0 for n in v.counts().values())
        assert v.dump() == {t: [] for t in before}
        assert v.applied_lengths() == {}
    with View.open(path, db=DB) as v:
        assert v.dump() == {t: [] for t in before}


def test_a_failed_apply_leaves_nothing(view):
    class Boom(Exception):
        pass

    def entries():
        yield e(W1, 0, 1, ("key_used", "k", 1))
        raise Boom

    with pytest.raises(Boom):
        view.apply(entries())
    view.apply([e(W2, 0, 1, ("key_used", "j", 1))])
    assert view.applied_lengths() == {W2: 1}
    assert view.last_used("k") is None


# --- opening ------------------------------------------------------------------


def test_a_view_of_another_db_is_refused(tmp_path):
    path = tmp_path / "v.db"
    View.open(path, db=DB).close()
    with pytest.raises(ViewMismatch) as info:
        View.open(path, db=b"o" * 32)
    assert info.value.code == "OTHER_DB"
    with pytest.raises(ViewMismatch):
        View.open(path)
    View.open(path, db=DB).close()


def test_another_format_version_is_refused(tmp_path):
    path = tmp_path / "v.db"
    View.open(path, db=DB).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET v = 99 WHERE k = 'format'")
    conn.close()
    with pytest.raises(ViewMismatch) as info:
        View.open(path, db=DB)
    assert info.value.code == "BAD_FORMAT"
    assert "99" in info.value.message


def test_foreign_and_garbage_files_are_refused_and_can_be_deleted(tmp_path):
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(ViewMismatch) as info:
        View.open(foreign, db=DB)
    assert info.value.code == "BAD_FORMAT"
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(ViewMismatch) as info:
        View.open(garbage, db=DB)
    assert info.value.code == "UNREADABLE"
    View.delete(garbage)
    View.delete(garbage)  # already gone: fine
    assert not garbage.exists()
    View.open(garbage, db=DB).close()


def test_db_must_be_a_key(tmp_path):
    with pytest.raises(ValueError):
        View.open(tmp_path / "v.db", db=b"short")


def test_read_only_open_sees_the_rows_and_refuses_writes(tmp_path):
    path = tmp_path / "dir with space?" / "v.db"
    path.parent.mkdir()
    with View.open(path, db=DB) as writer:
        writer.apply([e(W1, 0, 1, ("key_used", "k", 5))])
        with View.open_read_only(path) as reader:
            assert reader.last_used("k") == 5
            assert reader.applied_lengths() == {W1: 1}
            assert reader.counts()["key_last_used"] == 1
            with pytest.raises(sqlite3.OperationalError):
                reader.apply([e(W1, 1, 2, ("key_used", "k", 6))])
        View.open_read_only(path, db=DB).close()
        with pytest.raises(ViewMismatch):
            View.open_read_only(path, db=b"o" * 32)
    with pytest.raises(sqlite3.OperationalError):
        View.open_read_only(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()


# --- convergence ----------------------------------------------------------------

IDS = ["k1", "k2", "k3"]
MODELS = ["m1", "m2"]
DAYS = ["2024-01-01", "2024-01-02"]
WRITERS = [bytes([n]) * 32 for n in range(1, 6)]

ops_strategy = st.one_of(
    st.builds(lambda i, t, s, c: key_put(i, team=t, secret=s, created=c),
              st.sampled_from(IDS), st.sampled_from(["t1", "t2"]), st.sampled_from("xyz"),
              st.integers(0, 100)),
    st.tuples(st.just("key_revoke"), st.sampled_from(IDS), st.integers(0, 100)),
    st.tuples(st.just("model_put"), st.sampled_from(MODELS), st.sampled_from(["r1", "r2"]),
              st.fixed_dictionaries({}, optional={"t": st.integers(0, 3)})),
    st.tuples(st.just("model_delete"), st.sampled_from(MODELS)),
    st.builds(usage, st.sampled_from(IDS), st.sampled_from(MODELS), st.sampled_from(DAYS),
              *[st.integers(0, 2**53 - 1)] * 2, st.integers(0, 1000),
              st.integers(0, 10**9), st.integers(0, 3)),
    st.tuples(st.just("key_used"), st.sampled_from(IDS), st.integers(0, 100)),
    st.just(("add_writer", WRITERS[0], True)),
    st.just(("key_used", "k1", -1)),  # invalid: skipped everywhere
)


@st.composite
def histories(draw):
    writers = WRITERS[: draw(st.integers(2, 5))]
    entries = []
    for writer in writers:
        clock = 0
        for index in range(draw(st.integers(0, 8))):
            # small steps so equal clocks across writers are common
            clock += draw(st.integers(1, 2))
            ops = draw(st.lists(ops_strategy, min_size=0, max_size=4))
            entries.append(e(writer, index, clock, *ops))
    return entries


def chunked(rng, entries):
    order = list(entries)
    rng.shuffle(order)
    chunks, start = [], 0
    while start < len(order):
        size = rng.randint(1, max(1, len(order) // 2))
        chunks.append(order[start:start + size])
        start += size
    return chunks


def expected_from(entries):
    """The view each table should hold, computed naively from the whole set."""
    usage_rows, used, revoked, puts, models = {}, {}, {}, {}, {}
    for where, entry in entries:
        for op_no, op in enumerate(entry.ops):
            stamp = (entry.clock, where.writer, where.index, op_no)
            if op[0] == "usage_add":
                sums = usage_rows.setdefault(op[1:4], [0] * 5)
                for i in range(5):
                    sums[i] += op[4 + i]
            elif op[0] == "key_used" and op[2] >= 0:
                used[op[1]] = max(used.get(op[1], 0), op[2])
            elif op[0] == "key_revoke":
                revoked[op[1]] = min(revoked.get(op[1], op[2]), op[2])
            elif op[0] == "key_put":
                puts[op[1]] = max(puts.get(op[1], (stamp, op)), (stamp, op))
            elif op[0] in ("model_put", "model_delete"):
                models[op[1]] = max(models.get(op[1], (stamp, op)), (stamp, op),
                                    key=lambda pair: pair[0])
    return usage_rows, used, revoked, puts, models


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.randoms(use_true_random=False))
def test_any_order_and_chunking_gives_the_same_view(entries, rng):
    usage_rows, used, revoked, puts, models = expected_from(entries)
    with tempfile.TemporaryDirectory() as tmp:
        dumps = []
        for n in range(3):
            with View.open(Path(tmp) / f"v{n}.db", db=DB) as view:
                applied = sum(view.apply(chunk) for chunk in chunked(rng, entries))
                dumps.append(view.dump())
                assert applied + view.skipped_ops == sum(
                    op[0] != "add_writer" for _, entry in entries for op in entry.ops)
                lengths = {}
                for where, _ in entries:
                    lengths[where.writer] = max(lengths.get(where.writer, 0), where.index + 1)
                assert view.applied_lengths() == lengths
        assert dumps[0] == dumps[1] == dumps[2]
        dump = dumps[0]

    assert {row[:3]: list(row[3:]) for row in dump["token_usage"]} == usage_rows
    assert dict(dump["key_last_used"]) == used
    keys = {row[0]: row for row in dump["api_keys"]}
    assert set(keys) == set(puts) | set(revoked)
    for id_, row in keys.items():
        assert row[9] == (id_ in revoked)
        assert row[10] == revoked.get(id_)
        if id_ in puts:
            (clock, writer, index, _), op = puts[id_]
            assert row[1:4] == op[2:5] and row[6:9] == (clock, writer, index)
        else:
            assert row[1:9] == (None,) * 8
    assert {row[0] for row in dump["model_masters"]} == set(models)
    for name, _, _, deleted, *stamp in dump["model_masters"]:
        (clock, writer, index, _), op = models[name]
        assert deleted == (op[0] == "model_delete")
        assert stamp == [clock, writer, index]

