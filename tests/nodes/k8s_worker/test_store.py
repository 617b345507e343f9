"""The worker's state file: intents applied once per op id, kept across a reopen."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat

import pytest

from contracts.model import JobSpec, NodeShare, ReplicaPlacement, ReplicaState
from nodes.k8s_worker.backend import token_digest
from nodes.k8s_worker.store import ReplicaRecord, StoreError, WorkerStore

SPEC = JobSpec(name="demo", team="t1", type="container",
               image="docker://registry.example/cosmicac/ubuntu-cuda:12.4", gpus=2)
PLACEMENT = ReplicaPlacement(rack="ab" * 32, shares=(NodeShare(node="n1", gpus=2),))


def record(job_id: str = "j-1", replica: int = 0) -> ReplicaRecord:
    return ReplicaRecord(job_id=job_id, replica=replica, spec=SPEC, placement=PLACEMENT,
                         generation=0, done_generation=-1, desired="run", removed=False,
                         relays=("cd" * 32,), token_hashes=("ef" * 32,), reported_state=None,
                         reported_message="", created_at=1.0)


def test_an_operation_is_applied_once_whatever_the_redeliveries(tmp_path):
    store = WorkerStore.open(tmp_path / "w.sqlite")
    assert store.apply_create("op-1", record(), 1.0)
    assert not store.apply_create("op-1", record(), 2.0)
    assert not store.apply_create("op-other", record(), 2.0)  # the replica exists
    assert store.apply_restart("op-2", "j-1", 0, 1, 3.0)
    assert not store.apply_restart("op-2", "j-1", 0, 1, 3.0)
    assert not store.apply_restart("op-3", "j-1", 0, 1, 3.0)  # not newer
    assert store.replica("j-1", 0).generation == 1
    assert store.apply_delete("op-4", "j-1", 0, 4.0)
    assert not store.apply_delete("op-4", "j-1", 0, 4.0)
    assert not store.apply_restart("op-5", "j-1", 0, 2, 5.0)  # being deleted
    assert store.replica("j-1", 0).desired == "delete"


def test_progress_and_reports_survive_a_reopen(tmp_path):
    path = tmp_path / "w.sqlite"
    store = WorkerStore.open(path)
    store.apply_create("op-1", record(), 1.0)
    store.mark_done("j-1", 0, 0)
    store.mark_reported("j-1", 0, ReplicaState.ACTIVE, "agent ready")
    store.close()
    again = WorkerStore.open(path)
    (kept,) = again.replicas()
    assert kept.settled and kept.done_generation == 0
    assert kept.reported_state is ReplicaState.ACTIVE
    assert kept.token_hashes == ("ef" * 32,) and kept.relays == ("cd" * 32,)
    assert again.applied("op-1")
    again.apply_delete("op-2", "j-1", 0, 2.0)
    again.mark_removed("j-1", 0)
    assert again.replicas() == []
    assert again.replicas(include_removed=True)[0].settled


def test_a_newer_schema_or_a_foreign_file_is_refused_with_its_name(tmp_path):
    path = tmp_path / "w.sqlite"
    WorkerStore.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='99' WHERE key='schema'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema 99"):
        WorkerStore.open(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match=r"junk\.sqlite"):
        WorkerStore.open(junk)


def _files(path) -> dict[str, bytes]:
    """The state file and its companions, as bytes (what a local reader would get)."""
    return {p.name: p.read_bytes() for p in path.parent.iterdir()
            if p.name.startswith(path.name)}


def test_a_schema_1_file_has_its_tokens_hashed_in_place_and_left_nowhere(tmp_path):
    """Schema 1 kept the report tokens themselves. Opening such a file
    keeps only their digests, and no byte of the file or its WAL holds a token."""
    path = tmp_path / "w.sqlite"
    store = WorkerStore.open(path)
    store.apply_create("op-1", record(), 1.0)
    store.close()
    tokens = [secrets.token_hex(32), secrets.token_hex(32)]
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("UPDATE replicas SET tokens=?", (json.dumps(tokens),))
    db.execute("UPDATE meta SET value='1' WHERE key='schema'")
    db.commit()  # what a schema 1 worker left: the tokens in the file (and the WAL)
    assert any(tokens[0].encode() in data for data in _files(path).values())
    again = WorkerStore.open(path)
    assert again.replica("j-1", 0).token_hashes == tuple(token_digest(t) for t in tokens)
    again.mark_done("j-1", 0, 0)  # and later writes do not bring them back
    for name, data in _files(path).items():
        for token in tokens:
            assert token.encode() not in data, name
    db.close()
    again.close()
    assert sqlite3.connect(path).execute("SELECT value FROM meta").fetchone() == ("2",)


def test_the_state_file_and_its_companions_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        path = tmp_path / "w.sqlite"
        path.write_bytes(b"")
        path.chmod(0o666)  # a file an older worker (or a copy) left open to everyone
        store = WorkerStore.open(path)
        store.apply_create("op-1", record(), 1.0)
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        assert {"w.sqlite", "w.sqlite-wal", "w.sqlite-shm"} <= set(modes)
        assert set(modes.values()) == {0o600}, modes
        store.close()
    finally:
        os.umask(old)


def test_token_digests_are_set_for_the_generation_asked_only(tmp_path):
    store = WorkerStore.open(None)
    store.apply_create("op-1", record(), 1.0)
    assert store.set_token_hashes("j-1", 0, 0, ("aa" * 32,))
    assert store.replica("j-1", 0).token_hashes == ("aa" * 32,)
    assert not store.set_token_hashes("j-1", 0, 1, ("bb" * 32,))  # not asked for
    assert not store.set_token_hashes("j-9", 0, 0, ("bb" * 32,))  # no such replica
    assert store.replica("j-1", 0).token_hashes == ("aa" * 32,)
