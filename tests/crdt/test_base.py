"""The base: logs + gate + admission + view on one storage folder."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crdt import (
    AddTokenUsage,
    AddWriter,
    DatabaseMismatch,
    Entry,
    FsyncPolicy,
    InvalidBatch,
    LogCorrupted,
    PutApiKey,
    PutModelMaster,
    RemoveWriter,
    RevokeApiKey,
    UnknownWriter,
    WriteRefused,
    hash_secret,
    verify_storage,
)
from crdt._base import Base
from crdt._entries import decode_entry
from p2p.keys import KeyPair
from p2p.log import WriterLog
from tests.crdt.helpers import open_replica, pull, usage_ops
from tests.examples import examples

A, B, C = (KeyPair.from_seed(bytes([n]) * 32) for n in (1, 2, 3))


def total_prompt(base: Base, key_id: str = "k1") -> int:
    return sum(u.prompt for u in base.read_view(lambda v: v.usage(key_id)))


def test_the_creator_writes_and_a_reopened_replica_has_the_same_view(tmp_path):
    with open_replica(tmp_path / "a", A, fsync=FsyncPolicy.ALWAYS) as a:
        assert a.bootstrap == A.public_key and a.admission.is_admin(A.public_key)
        a.append(usage_ops("k1", 10))
        a.append([[PutModelMaster("llama", "vllm", {"max_tokens": 512})],
                  [PutApiKey("k1", "team", "ci", hash_secret("s3cret"), ["chat"], 1)]])
        dump = a.view.dump()
        assert total_prompt(a) == 10
    with open_replica(tmp_path / "a", A) as again:
        assert again.view.dump() == dump
        assert again.lengths()[A.public_key] == 12
        assert again.read_view(lambda v: v.key_by_secret("s3cret")).name == "ci"
        assert again.read_view(lambda v: v.key_by_secret("wrong")) is None


def test_clocks_and_deps_put_our_entries_after_everything_we_had_seen(tmp_path):
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, A.public_key) as b:
        a.append([[AddWriter(B.public_key)], *usage_ops("k1", 3)])
        pull(b, a)
        (where,) = b.append(usage_ops("k1", 1))
        entry = b.gate  # the entry we just wrote is the last released of B
        assert b.gate.clock(B.public_key, where.index) > a.gate.max_clock
        payload = b.logs[B.public_key].entry(where.index)
        assert decode_entry(payload).deps == ((A.public_key, 4),)
        assert entry.length(B.public_key) == 1


def test_a_replica_reads_before_it_is_admitted_and_its_writes_are_refused(tmp_path):
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, A.public_key) as b:
        a.append(usage_ops("k1", 5))
        pull(b, a)
        assert total_prompt(b) == 5
        with pytest.raises(WriteRefused) as refused:
            b.append(usage_ops("k1", 1))
        assert refused.value.code == "NOT_A_WRITER"
        assert "an admin must add it" in str(refused.value)
        assert b.lengths().get(B.public_key, 0) == 0  # nothing written
        a.append([[AddWriter(B.public_key)]])
        pull(b, a)
        b.append(usage_ops("k1", 2))
        with pytest.raises(WriteRefused) as not_admin:
            b.append([[AddWriter(C.public_key)]])
        assert not_admin.value.code == "NOT_AN_ADMIN"
        pull(a, b)
        assert total_prompt(a) == total_prompt(b) == 7
        assert a.view.dump() == b.view.dump()


def test_bad_ops_are_refused_before_anything_is_written(tmp_path):
    with open_replica(tmp_path / "a", A) as a:
        with pytest.raises(WriteRefused) as refused:
            a.append([[("usage_add", "k1", "m", "not-a-day", 1, 0, 1, 0, 1)]])
        assert refused.value.code == "BAD_OP"
        with pytest.raises(WriteRefused):
            a.append([[]])
        assert a.lengths()[A.public_key] == 0


def test_the_storage_belongs_to_one_database(tmp_path):
    open_replica(tmp_path / "a", A).close()
    with pytest.raises(DatabaseMismatch):
        open_replica(tmp_path / "a", A, bootstrap=B.public_key)


def test_entries_signed_by_an_unadmitted_key_are_refused_and_counted(tmp_path):
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "c", C) as c:
        # C created a database of its own; its signed log means nothing to A's.
        c.append(usage_ops("k1", 3))
        entries, head = c.segment(C.public_key, 0, 1 << 20)
        with pytest.raises(UnknownWriter):
            a.ingest(C.public_key, 0, entries, head)
        assert a.unknown_writer_refusals == 1
        assert C.public_key not in a.logs
        assert not (tmp_path / "a" / "db" / "logs" / f"{C.public_key.hex()}.log").exists()


def test_a_forged_or_broken_batch_is_refused_and_nothing_is_stored(tmp_path):
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, A.public_key) as b:
        a.append(usage_ops("k1", 4))
        entries, head = a.segment(A.public_key, 0, 1 << 20)
        tampered = [*entries[:1], entries[1][:-1] + b"\x00", *entries[2:]]
        with pytest.raises(InvalidBatch) as chain:
            b.ingest(A.public_key, 0, tampered, head)
        assert chain.value.code == "BAD_CHAIN"
        forged = head.__class__(head.length, head.head_hash, bytes(64))
        with pytest.raises(InvalidBatch) as signature:
            b.ingest(A.public_key, 0, entries, forged)
        assert signature.value.code == "BAD_SIGNATURE"
        assert b.lengths().get(A.public_key, 0) == 0
        b.ingest(A.public_key, 0, entries, head)
        b.ingest(A.public_key, 0, entries, head)  # a duplicate is skipped
        assert total_prompt(b) == 4


def _back_dated_entries(storage, keypair: KeyPair, db: bytes, clock: int, n: int) -> None:
    """Append ``n`` entries with a low clock straight into a writer's log (a misbehaving writer)."""
    path = storage / "db" / "logs" / f"{keypair.public_key.hex()}.log"
    with WriterLog.open(path, keypair.public_key, keypair, fsync=FsyncPolicy.NEVER) as wlog:
        wlog.append_batch([Entry.create(db, clock + k, {}, ops).encode()
                           for k, ops in enumerate(usage_ops("k1", n))])


def test_a_removed_writer_cannot_slip_in_back_dated_entries(tmp_path):
    db = A.public_key
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, db) as b:
        a.append([[AddWriter(B.public_key)]])
        pull(b, a)
        b.append(usage_ops("k1", 3))
        last_clock = b.gate.clock(B.public_key, 2)
        pull(a, b)
        a.append(usage_ops("k2", 50))  # the database's clock moves far ahead
        a.append([[RemoveWriter(B.public_key, 3)]])
        assert a.gate.max_clock > last_clock + 50
        pull(b, a)
        with pytest.raises(WriteRefused):
            b.append(usage_ops("k1", 1))
    # B, removed, writes behind the base's back entries whose clocks follow its own
    # (valid entries of its log) but come before the removal in the total order.
    _back_dated_entries(tmp_path / "b", B, db, clock=last_clock + 1, n=5)
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, db) as b, \
            open_replica(tmp_path / "c", C, db) as c:
        assert b.lengths()[B.public_key] == 8
        pull(a, b)
        assert a.lengths()[B.public_key] == 8  # stored (the log is B's signed log) ...
        assert total_prompt(a) == 3  # ... but entries beyond the cap do not count
        # C sees B's whole log first, then the removal: it must end up the same.
        pull(c, b)
        pull(c, a)
        assert total_prompt(b) == total_prompt(c) == 3
        assert a.view.dump() == b.view.dump() == c.view.dump()


def test_a_late_removal_rebuilds_a_view_that_already_counted_too_much(tmp_path):
    db = A.public_key
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, db) as b, \
            open_replica(tmp_path / "c", C, db) as c:
        a.append([[AddWriter(B.public_key)]])
        pull(b, a)
        b.append(usage_ops("k1", 6))
        pull(a, b)
        pull(c, a)
        assert total_prompt(c) == 6
        a.append([[RemoveWriter(B.public_key, 2)]])
        rebuilds = c.rebuilds
        pull(c, a)
        assert c.rebuilds == rebuilds + 1
        assert total_prompt(a) == total_prompt(c) == 2
        assert a.view.dump() == c.view.dump()


def test_revocation_wins_across_replicas(tmp_path):
    db = A.public_key
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, db) as b:
        a.append([[AddWriter(B.public_key, admin=True)],
                  [PutApiKey("k1", "t", "one", hash_secret("x"), [], 1)]])
        pull(b, a)
        a.append([[RevokeApiKey("k1", 5)]])
        b.append([[PutApiKey("k1", "t", "renamed", hash_secret("x"), [], 1)]])  # concurrent
        pull(a, b)
        pull(b, a)
        for replica in (a, b):
            key = replica.read_view(lambda v: v.key("k1"))
            assert key.revoked and key.name == "renamed"
        assert a.view.dump() == b.view.dump()


def test_a_flipped_bit_is_found_by_verify_and_on_open(tmp_path):
    with open_replica(tmp_path / "a", A) as a:
        for _ in range(5):
            a.append(usage_ops("k1", 20))
    assert [p for p in verify_storage(tmp_path / "a") if p.fatal] == []
    path = tmp_path / "a" / "db" / "logs" / f"{A.public_key.hex()}.log"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    problems = [p for p in verify_storage(tmp_path / "a") if p.fatal]
    assert len(problems) == 1 and str(path) in problems[0].where
    assert "at byte" in problems[0].where
    with pytest.raises(LogCorrupted) as corrupted:
        open_replica(tmp_path / "a", A)
    assert corrupted.value.path == str(path)


def test_a_damaged_view_is_rebuilt_from_the_logs(tmp_path):
    with open_replica(tmp_path / "a", A) as a:
        a.append(usage_ops("k1", 7))
        dump = a.view.dump()
    view = tmp_path / "a" / "db" / "view.sqlite"
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / "a" / "db" / f"view.sqlite{suffix}").unlink(missing_ok=True)
    view.write_bytes(b"this is not sqlite")
    with open_replica(tmp_path / "a", A) as a:
        assert a.view.dump() == dump


# -- convergence -----------------------------------------------------------------------------

ids = st.sampled_from(["k1", "k2", "k3"])
ops = st.one_of(
    st.builds(lambda k, n: AddTokenUsage(k, "m", "2026-11-29", prompt=n, total=n, audio_ms=n * 7),
              ids, st.integers(0, 1000)),
    st.builds(lambda k, t: PutApiKey(k, "team", f"name-{t}", hash_secret(k), ["chat"], t),
              ids, st.integers(1, 9)),
    st.builds(lambda k, t: RevokeApiKey(k, t), ids, st.integers(1, 9)),
    st.builds(lambda n, r: PutModelMaster(n, r, {"r": r}), st.sampled_from(["a", "b"]),
              st.sampled_from(["vllm", "parakeet"])),
)
steps = st.lists(st.one_of(
    st.tuples(st.just("write"), st.integers(0, 4), st.lists(st.lists(ops, min_size=1,
                                                                     max_size=3),
                                                            min_size=1, max_size=4)),
    st.tuples(st.just("sync"), st.integers(0, 4), st.integers(0, 4), st.integers(512, 4096)),
    st.tuples(st.just("again"), st.integers(0, 4), st.integers(0, 4), st.integers(0, 50)),
    st.tuples(st.just("remove"), st.integers(1, 4)),
), max_size=30)


@settings(max_examples=examples(100), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(2, 5), steps, st.randoms(use_true_random=False))
def test_replicas_converge_whatever_the_partitions_and_delivery_order(tmp_path_factory, n,
                                                                      story, rng):
    """Writers append while apart (syncs only between random pairs, in random batch sizes
    and writer orders; runs delivered again) and the creator removes some of them (who may
    go on writing until they hear of it); after everyone syncs with everyone, every view is
    identical and the usage sums are exactly those of the entries that count: all of each
    writer's, or for a removed one the entries the creator had seen when removing it."""
    root = tmp_path_factory.mktemp("converge")
    keys = [KeyPair.from_seed(bytes([40 + i]) * 32) for i in range(n)]
    db = keys[0].public_key
    replicas = [open_replica(root / str(i), k, None if i == 0 else db) for i, k in enumerate(keys)]
    try:
        replicas[0].append([[AddWriter(k.public_key, admin=True)] for k in keys[1:]])
        for replica in replicas[1:]:
            pull(replica, replicas[0])
        written: dict[bytes, dict[int, list]] = {k.public_key: {} for k in keys}
        caps: dict[bytes, int] = {}
        for step in story:
            if step[0] == "write":
                _, who, batch = step
                replica = replicas[who % n]
                try:
                    ids = replica.append(batch)
                except WriteRefused:
                    assert replica.key in caps  # only a removed writer that heard of it
                    continue
                for where, entry_ops in zip(ids, batch, strict=True):
                    written[where.writer][where.index] = entry_ops
            elif step[0] == "remove":
                victim = keys[step[1] % n].public_key
                if victim != db and victim not in caps:
                    caps[victim] = replicas[0].lengths().get(victim, 0)
                    replicas[0].append([[RemoveWriter(victim, caps[victim])]])
            elif step[0] == "sync":
                _, into, source, max_bytes = step
                if into % n != source % n:
                    pull(replicas[into % n], replicas[source % n], max_bytes=max_bytes, rng=rng)
            else:  # a run delivered again (a retry, a second peer): must change nothing
                _, into, _, start = step
                target = replicas[into % n]
                writer = rng.choice(sorted(target.logs))
                have = target.lengths()[writer]
                if have:
                    entries, head = target.segment(writer, start % have, 512)
                    before = (target.view.dump(), target.lengths())
                    target.ingest(writer, start % have, entries, head or target.logs[writer].head)
                    assert (target.view.dump(), target.lengths()) == before
        for _ in range(2):
            for into in replicas:
                for source in replicas:
                    if into is not source:
                        pull(into, source)
        dumps = [replica.view.dump() for replica in replicas]
        assert all(d == dumps[0] for d in dumps)
        expected: dict[str, int] = {}
        for writer, entries in written.items():
            for index, entry_ops in entries.items():
                if index < caps.get(writer, index + 1):
                    for op in entry_ops:
                        if isinstance(op, AddTokenUsage):
                            expected[op.key_id] = expected.get(op.key_id, 0) + op.prompt
        for key_id in ("k1", "k2", "k3"):
            assert total_prompt(replicas[-1], key_id) == expected.get(key_id, 0)
        # And the view is what a rebuild from the logs gives.
        replicas[1].rebuild()
        assert replicas[1].view.dump() == dumps[0]
    finally:
        for replica in replicas:
            replica.close()


def test_entries_the_gate_had_no_room_for_are_offered_again_from_the_log(tmp_path):
    """A replica fetching one writer's whole log before the log it depends on: most of it
    must wait, more than the gate holds; what it turns away is taken again later."""
    db = A.public_key
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, db) as b, \
            open_replica(tmp_path / "c", C, db) as c:
        a.append([[AddWriter(B.public_key)]])
        pull(b, a)
        for _ in range(30):  # A and B take turns, each entry depending on the other's last
            b.append(usage_ops("k1", 2))
            pull(a, b)
            a.append(usage_ops("k1", 2))
            pull(b, a)
        c.gate.max_waiting = 10
        entries, head = a.segment(A.public_key, 0, 1 << 20)
        c.ingest(A.public_key, 0, entries, head)  # B's entries unknown yet: most must wait
        assert c.gate.waiting <= 10
        entries, head = b.segment(B.public_key, 0, 1 << 20)
        c.ingest(B.public_key, 0, entries, head)
        assert c.gate.length(A.public_key) == a.lengths()[A.public_key]
        assert c.gate.waiting == 0
        assert total_prompt(c) == total_prompt(a) == 120
        assert c.view.dump() == a.view.dump()


def test_reads_see_the_committed_view_while_a_write_is_in_progress(tmp_path):
    with open_replica(tmp_path / "a", A) as a:
        a.append(usage_ops("k1", 5))
        writer = a.view._conn
        with a.view_lock:  # the writer is in the middle of an apply
            writer.execute("BEGIN IMMEDIATE")
            writer.execute("DELETE FROM token_usage")
            assert total_prompt(a) == 5  # neither blocked nor shown the uncommitted change
            writer.execute("ROLLBACK")


def gate_state(base: Base) -> tuple:
    return (base.gate.lengths(), base.gate.max_clock, base.gate.stopped, base.admission,
            base.counted_lengths())


def test_a_restart_from_the_snapshot_has_the_state_of_a_full_replay(tmp_path):
    db = A.public_key
    with open_replica(tmp_path / "a", A) as a, open_replica(tmp_path / "b", B, db) as b, \
            open_replica(tmp_path / "c", C, db) as c:
        a.append([[AddWriter(B.public_key)], [AddWriter(C.public_key)]])
        pull(b, a)
        pull(c, a)
        b.append(usage_ops("k1", 4))
        c.append(usage_ops("k2", 2))
        pull(a, b)
        pull(a, c)
        a.append([[RemoveWriter(B.public_key, 3)]])
    # C's log gets a signed entry that does not decode: C stops there, everywhere.
    path = tmp_path / "c" / "db" / "logs" / f"{C.public_key.hex()}.log"
    with WriterLog.open(path, C.public_key, C, fsync=FsyncPolicy.NEVER) as wlog:
        wlog.append_batch([b"\xc1 not msgpack"])
    with open_replica(tmp_path / "c", C, db) as c, open_replica(tmp_path / "a", A) as a:
        pull(a, c)
        saved = gate_state(a)
        assert a.gate.stopped[C.public_key][1] == "BAD_PAYLOAD"
    snapshot = tmp_path / "a" / "db" / "gate.snapshot"
    assert snapshot.exists()
    with open_replica(tmp_path / "a", A) as a:
        assert gate_state(a) == saved
        dump = a.view.dump()
    snapshot.unlink()
    with open_replica(tmp_path / "a", A) as a:  # the full replay agrees
        assert gate_state(a) == saved
        assert a.view.dump() == dump


def test_a_snapshot_that_no_longer_matches_the_logs_is_ignored(tmp_path, caplog):
    with open_replica(tmp_path / "a", A) as a:
        a.append(usage_ops("k1", 5))
    # The folder is restored with another history of the same writer (fewer, other entries).
    log_path = tmp_path / "a" / "db" / "logs" / f"{A.public_key.hex()}.log"
    log_path.unlink()
    with WriterLog.open(log_path, A.public_key, A, fsync=FsyncPolicy.NEVER) as wlog:
        wlog.append_batch([Entry.create(A.public_key, 1, {}, ops).encode()
                           for ops in usage_ops("k1", 5)])
    with open_replica(tmp_path / "a", A) as a:
        assert "snapshot_ignored" in caplog.text
        assert a.gate.max_clock == 1  # replayed from the log, not the saved clocks (1..5)
    (tmp_path / "a" / "db" / "gate.snapshot").write_bytes(b"\x93garbage")
    caplog.clear()
    with open_replica(tmp_path / "a", A) as a:
        assert "snapshot_ignored" in caplog.text
        assert a.gate.length(A.public_key) == 1  # the bad clocks stop A after its first entry


def test_queries_see_the_old_view_until_a_rebuild_is_whole(tmp_path, monkeypatch):
    with open_replica(tmp_path / "a", A) as a:
        a.append(usage_ops("k1", 5))
        seen = []
        apply = Base._apply

        def watched(self, items, **options):
            seen.append(total_prompt(self))  # a query, on its own connection, mid-rebuild
            return apply(self, items, **options)

        monkeypatch.setattr(Base, "_apply", watched)
        a.rebuild()
        assert seen and all(total == 5 for total in seen)
        assert total_prompt(a) == 5


def test_the_only_admin_may_not_remove_itself_but_may_once_another_admin_exists(tmp_path):
    with open_replica(tmp_path / "a", A) as a:
        a.append([[AddWriter(B.public_key)]])  # a writer, not an admin
        before = a.lengths()
        with pytest.raises(WriteRefused) as refused:
            a.change_writer("remove_writer", A.public_key)
        assert refused.value.code == "LAST_ADMIN"
        assert a.lengths() == before and a.admission.is_admin(A.public_key)
        a.change_writer("add_writer", B.public_key, admin=True)
        change = a.change_writer("remove_writer", A.public_key)
        assert change.status == "removed"
        assert a.admission.is_admin(B.public_key) and not a.admission.is_writer(A.public_key)
