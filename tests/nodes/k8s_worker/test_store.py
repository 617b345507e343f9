"""The worker's state file: intents applied once per op id, kept across a reopen."""

from __future__ import annotations

import sqlite3

import pytest

from contracts.model import JobSpec, NodeShare, ReplicaPlacement, ReplicaState
from nodes.k8s_worker.store import ReplicaRecord, StoreError, WorkerStore

SPEC = JobSpec(name="demo", team="t1", type="container",
               image="docker://registry.example/cosmicac/ubuntu-cuda:12.4", gpus=2)
PLACEMENT = ReplicaPlacement(rack="ab" * 32, shares=(NodeShare(node="n1", gpus=2),))


def record(job_id: str = "j-1", replica: int = 0) -> ReplicaRecord:
    return ReplicaRecord(job_id=job_id, replica=replica, spec=SPEC, placement=PLACEMENT,
                         generation=0, done_generation=-1, desired="run", removed=False,
                         relays=("cd" * 32,), tokens=("ef" * 32,), reported_state=None,
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
    assert kept.tokens == ("ef" * 32,) and kept.relays == ("cd" * 32,)
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
