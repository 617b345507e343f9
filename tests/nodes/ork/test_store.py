"""Persistence: the store's schema and transactions, and an orchestrator reopened
from its file has the same jobs, outbox, claims, racks, reservations and positions."""

from __future__ import annotations

import sqlite3

import pytest

from contracts.model import JobStatus, NodeInfo, RackReport
from contracts.operations import CreateReplica, DeleteReplica, RackUpdate
from nodes.ork.errors import StoreError
from nodes.ork.store import SCHEMA_VERSION, Outbound, Store

from .world import RACK, World, container, inference

J = JobStatus


def snapshot(world: World):
    orch = world.orch
    # When a rack last reported is what this wrk-ork heard since it started: not kept.
    racks = [rack.model_copy(update={"last_report_at": None}) for rack in orch.racks()]
    return (orch.list_jobs(), orch.outbox(), orch.nodes(), racks,
            {rack.key: orch.report_position(rack.key) for rack in orch.racks()})


def test_reopening_gives_the_same_jobs_outbox_claims_racks_and_positions(tmp_path):
    world = World(tmp_path / "ork.sqlite", nodes=(4, 4))
    world.orch.reserve_nodes(RACK, ["n1"], "team-b")
    running = world.create(inference(gpus=2, replicas=2)).id
    world.published()
    world.say(0, "active", job=running)
    world.orch.on_report(RACK, RackUpdate(rack=world.report, at=world.now), world.now,
                         position=41)
    world.create(container(gpus=3, team="team-b"))
    pending = world.create(container(gpus=4)).id
    restarted = world.create(container(gpus=1, team="team-b")).id
    world.orch.restart_job(running, world.now)
    before = snapshot(world)
    assert world.status(pending) is J.PENDING
    assert world.status(restarted) is J.STARTING
    assert world.orch.outbox()  # the last creates and restarts are not published yet

    world.reopen()
    assert snapshot(world) == before
    assert world.orch.report_position(RACK) == 41
    # The claims came back: the pending job still does not fit ...
    world.orch.tick(world.now)
    assert world.status(pending) is J.PENDING
    # ... until the worker reports a deletion, which frees real GPUs.
    world.orch.delete_job(restarted, world.now)
    world.say(0, "deleted", job=restarted)
    world.orch.delete_job(running, world.now)
    world.say(0, "deleted", job=running)
    world.say(1, "deleted", job=running)
    assert world.status(pending) is J.STARTING


def test_an_operation_is_saved_with_the_change_that_made_it(tmp_path):
    world = World(tmp_path / "ork.sqlite")
    job = world.create(container()).id
    world.reopen()  # as if wrk-ork crashed before publishing
    [out] = world.orch.outbox()
    assert isinstance(out.op, CreateReplica) and out.op.op_id == f"{job}/0/create/0"
    world.published()
    world.orch.delete_job(job, world.now)
    world.reopen()
    assert [type(o.op) for o in world.orch.outbox()] == [DeleteReplica]
    assert world.status(job) is J.DELETING


def test_claims_reload_on_nodes_cordoned_or_gone_since(tmp_path):
    world = World(tmp_path / "ork.sqlite", nodes=(4, 4))
    first = world.create(container(gpus=4)).id
    second = world.create(container(gpus=4)).id
    # n0 is cordoned, n1 has left the report: their claims must survive a restart.
    world.report = RackReport(nodes=(NodeInfo(name="n0", gpus=4, schedulable=False),))
    world.hear()
    world.reopen()
    nodes = {n.name: (n.gpus, n.free, n.schedulable) for n in world.orch.nodes()}
    assert nodes == {"n0": (4, 0, False), "n1": (0, 0, False)}
    assert world.status(first) is world.status(second) is J.STARTING


def test_unknown_is_kept_across_a_restart_until_the_rack_has_had_its_time(tmp_path):
    world = World(tmp_path / "ork.sqlite")
    world.do("one")
    world.say(0, "active")
    world.silence()
    assert world.status() is J.UNKNOWN
    world.reopen()
    world.now += 3600  # wrk-ork was down an hour
    world.orch.tick(world.now)
    assert world.status() is J.UNKNOWN
    world.hear()
    assert world.status() is J.ACTIVE
    world.reopen()
    world.now += 3600
    world.orch.tick(world.now)  # a rack gets a full unknown_after_s after a restart
    assert world.status() is J.ACTIVE


def test_a_store_from_a_newer_wrk_ork_is_refused(tmp_path):
    path = tmp_path / "ork.sqlite"
    Store.open(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError) as info:
        Store.open(path)
    assert info.value.code == "STORE" and "newer" in info.value.message


def test_a_failed_transaction_writes_nothing():
    store = Store.open(None)
    op = DeleteReplica(op_id="j-1/0/delete/0", job_id="j-1", replica=0)
    with pytest.raises(RuntimeError), store.transaction():
        store.add_outbound(Outbound(rack=RACK, op=op))
        raise RuntimeError("crash")
    assert store.outbox() == []


def test_the_same_operation_is_queued_once():
    store = Store.open(None)
    op = DeleteReplica(op_id="j-1/0/delete/0", job_id="j-1", replica=0)
    with store.transaction():
        store.add_outbound(Outbound(rack=RACK, op=op))
        store.add_outbound(Outbound(rack=RACK, op=op))
    assert store.outbox() == [Outbound(rack=RACK, op=op)]
    with store.transaction():
        store.remove_outbound([op.op_id])
    assert store.outbox() == []


def test_the_file_is_write_ahead_logged(tmp_path):
    store = Store.open(tmp_path / "ork.sqlite")
    (mode,) = store._conn.execute("PRAGMA journal_mode").fetchone()
    assert mode == "wal"
    store.close()


def test_a_reservation_outlives_its_node_missing_from_a_report_across_a_restart(tmp_path):
    world = World(tmp_path / "ork.sqlite", nodes=(4, 4))
    world.orch.reserve_nodes(RACK, ["n1"], "team-b")
    full = world.report
    world.report = RackReport(nodes=(NodeInfo(name="n0", gpus=4),))
    world.hear()
    world.reopen()
    assert [n.name for n in world.orch.nodes()] == ["n0"]
    world.report = full
    world.hear()
    assert {n.name: n.reserved_for for n in world.orch.nodes()} == {"n0": None,
                                                                    "n1": "team-b"}
