"""The orchestrator core: every job status change of the table, placement order,
replica actions, reports, silence, racks and reservations."""

from __future__ import annotations

import pytest

from contracts.model import JobStatus, NodeInfo, RackReport
from contracts.operations import (
    CreateReplica,
    DeleteReplica,
    RackUpdate,
    ReplicaReport,
    RestartReplica,
)
from nodes.ork.errors import BadRequest, InvalidState, NotFound
from nodes.ork.status import JOB_TRANSITIONS

from .world import OTHER_RACK, RACK, SETUPS, World, container, inference

J = JobStatus


#: Every edge of JOB_TRANSITIONS: (setup, steps that cause it).
EDGES = {
    (J.CREATING, J.QUEUED): ("none", ["one"]),
    (J.QUEUED, J.STARTING): ("none", ["one"]),
    (J.QUEUED, J.PENDING): ("none", ["pending"]),
    (J.QUEUED, J.FAILED): ("none", ["unplaceable"]),
    (J.PENDING, J.QUEUED): ("pending", ["free"]),
    (J.PENDING, None): ("pending", ["delete"]),
    (J.STARTING, J.ACTIVE): ("starting1", [(0, "active")]),
    (J.STARTING, J.DEGRADED): ("starting2", [(0, "failed")]),
    (J.STARTING, J.FAILED): ("starting1", [(0, "failed")]),
    (J.STARTING, J.RESTARTING): ("starting1", ["restart"]),
    (J.STARTING, J.UNKNOWN): ("starting1", ["silence"]),
    (J.STARTING, J.DELETING): ("starting1", ["delete"]),
    (J.ACTIVE, J.STARTING): ("active1", [(0, "starting")]),
    (J.ACTIVE, J.DEGRADED): ("active2", [(1, "failed")]),
    (J.ACTIVE, J.FAILED): ("active1", [(0, "failed")]),
    (J.ACTIVE, J.RESTARTING): ("active1", ["restart"]),
    (J.ACTIVE, J.UNKNOWN): ("active1", ["silence"]),
    (J.ACTIVE, J.DELETING): ("active1", ["delete"]),
    (J.DEGRADED, J.ACTIVE): ("degraded", [(0, "active")]),
    (J.DEGRADED, J.STARTING): ("degraded", [(0, "starting")]),
    (J.DEGRADED, J.FAILED): ("degraded", [(1, "failed")]),
    (J.DEGRADED, J.RESTARTING): ("degraded", ["restart"]),
    (J.DEGRADED, J.UNKNOWN): ("degraded", ["silence"]),
    (J.DEGRADED, J.DELETING): ("degraded", ["delete"]),
    (J.RESTARTING, J.ACTIVE): ("restarting1", [(0, "restarting"), (0, "active")]),
    (J.RESTARTING, J.STARTING): ("worker_restarting", [(0, "starting")]),
    (J.RESTARTING, J.DEGRADED): ("restarting2", [(0, "failed")]),
    (J.RESTARTING, J.FAILED): ("restarting1", [(0, "failed")]),
    (J.RESTARTING, J.UNKNOWN): ("restarting1", ["silence"]),
    (J.RESTARTING, J.DELETING): ("restarting1", ["delete"]),
    (J.FAILED, J.RESTARTING): ("failed1", ["restart"]),
    (J.FAILED, J.STARTING): ("failed1", [(0, "starting")]),
    (J.FAILED, J.ACTIVE): ("failed1", [(0, "active")]),
    (J.FAILED, J.DEGRADED): ("failed2", [(0, "starting")]),
    (J.FAILED, J.UNKNOWN): ("failed1", ["silence"]),
    (J.FAILED, J.DELETING): ("failed1", ["delete"]),
    (J.FAILED, None): ("unplaceable", ["delete"]),
    (J.UNKNOWN, J.STARTING): ("unknown_starting", ["hear"]),
    (J.UNKNOWN, J.ACTIVE): ("unknown1", ["hear"]),
    (J.UNKNOWN, J.DEGRADED): ("unknown_degraded", ["hear"]),
    (J.UNKNOWN, J.FAILED): ("unknown_failed", ["hear"]),
    (J.UNKNOWN, J.RESTARTING): ("unknown_restarting", ["hear"]),
    (J.UNKNOWN, J.DELETING): ("unknown1", ["delete"]),
    (J.DELETING, None): ("deleting", [(0, "deleted")]),
}

#: The status each setup leaves the job in (checked before the edge is driven).
SETUP_STATUS = {
    "starting1": J.STARTING, "starting2": J.STARTING, "active1": J.ACTIVE,
    "active2": J.ACTIVE, "degraded": J.DEGRADED, "restarting1": J.RESTARTING,
    "restarting2": J.RESTARTING, "worker_restarting": J.RESTARTING, "failed1": J.FAILED,
    "failed2": J.FAILED, "unknown1": J.UNKNOWN, "unknown_starting": J.UNKNOWN,
    "unknown_degraded": J.UNKNOWN, "unknown_failed": J.UNKNOWN,
    "unknown_restarting": J.UNKNOWN, "pending": J.PENDING, "unplaceable": J.FAILED,
    "deleting": J.DELETING,
}


def test_every_edge_of_the_table_has_a_test():
    assert set(EDGES) == set(JOB_TRANSITIONS)
    assert {setup for setup, _ in EDGES.values()} - {"none"} == set(SETUP_STATUS)


@pytest.mark.parametrize(("before", "after"), list(EDGES),
                         ids=[f"{a.value}-{b.value if b else 'gone'}" for a, b in EDGES])
def test_job_status_change(before, after):
    world = World()
    setup, steps = EDGES[(before, after)]
    for step in SETUPS[setup]:
        world.do(step)
    if setup != "none":
        assert world.status() is SETUP_STATUS[setup]
    world.orch.drain_events()
    for step in steps:
        world.do(step)
    events = [e for e in world.orch.drain_events() if e.job_id == world.job_id]
    assert (before, after) in [(e.previous, e.status) for e in events]
    if after is None:
        with pytest.raises(NotFound):
            world.orch.get_job(world.job_id)
    elif after is not J.QUEUED:  # Queued is passed through within one call
        assert world.status() is after
    assert world.orch.statistics().unexpected_transitions == 0


# -- creating and placing -------------------------------------------------------------


def test_create_places_claims_and_queues_one_create_per_replica():
    world = World(nodes=(4, 4))
    view = world.create(inference(gpus=2, replicas=2))
    assert view.id.startswith("j-") and len(view.id) == 18
    assert view.status is J.STARTING and view.rack == RACK
    assert world.changes() == [(None, J.CREATING), (J.CREATING, J.QUEUED),
                               (J.QUEUED, J.STARTING)]
    ops = world.published()
    assert [type(op) for op in ops] == [CreateReplica, CreateReplica]
    assert [op.op_id for op in ops] == [f"{view.id}/0/create/0", f"{view.id}/1/create/0"]
    assert all(op.placement.rack == RACK for op in ops)
    assert world.orch.outbox() == []
    assert sum(n.free for n in world.orch.nodes()) == 4


def test_a_job_that_can_never_fit_fails_with_the_reason():
    world = World(nodes=(4,))
    view = world.create(container(gpus=8))
    assert view.status is J.FAILED
    assert view.reason
    assert world.orch.outbox() == []
    with pytest.raises(InvalidState):
        world.orch.restart_job(view.id, world.now)


def test_gpus_are_freed_when_the_worker_reports_deleted_not_when_asked():
    world = World(nodes=(8,))
    first = world.create(container(gpus=8)).id
    second = world.create(container(gpus=8)).id
    assert world.status(second) is J.PENDING
    world.orch.delete_job(first, world.now)
    world.orch.tick(world.now)
    assert world.status(first) is J.DELETING
    assert world.status(second) is J.PENDING
    world.say(0, "deleted", job=first)
    with pytest.raises(NotFound):
        world.orch.get_job(first)
    assert world.status(second) is J.STARTING


def test_pending_jobs_are_placed_oldest_first_when_a_deletion_frees_gpus():
    world = World(nodes=(8,))
    blocker = world.create(container(gpus=8)).id
    world.published()
    older = world.create(container(gpus=6)).id
    younger = world.create(container(gpus=6)).id
    youngest = world.create(container(gpus=2)).id
    assert [world.status(j) for j in (older, younger, youngest)] == [J.PENDING] * 3
    world.orch.delete_job(blocker, world.now)
    world.say(0, "deleted", job=blocker)
    # The oldest gets the GPUs; a younger one that still fits the rest goes too.
    assert world.status(older) is J.STARTING
    assert world.status(younger) is J.PENDING
    assert world.status(youngest) is J.STARTING
    creates = [op.job_id for op in world.published() if isinstance(op, CreateReplica)]
    assert creates == [older, youngest]


def test_a_pending_job_holds_nothing_and_is_gone_at_once_on_delete():
    world = World(nodes=(8,))
    world.do("pending")
    world.published()
    assert world.orch.delete_job(world.job_id, world.now) is None
    assert world.orch.outbox() == []
    with pytest.raises(NotFound):
        world.orch.get_job(world.job_id)


def test_a_pending_job_is_placed_when_its_rack_reports_more_gpus():
    world = World(nodes=(2,))
    world.create(container(gpus=1))
    waiting = world.create(container(gpus=2)).id
    assert world.status(waiting) is J.PENDING
    world.report = RackReport(nodes=(NodeInfo(name="n0", gpus=2), NodeInfo(name="n1", gpus=2)))
    world.hear()
    assert world.status(waiting) is J.STARTING


# -- restart and delete ---------------------------------------------------------------


def test_restart_bumps_the_generation_and_ignores_the_old_vmis_reports():
    world = World()
    world.do("two")
    world.say(0, "active")
    world.say(1, "active")
    world.published()
    view = world.orch.restart_job(world.job_id, world.now)
    assert view.status is J.RESTARTING
    ops = world.published()
    assert [(type(op), op.op_id) for op in ops] == [
        (RestartReplica, f"{world.job_id}/0/restart/1"),
        (RestartReplica, f"{world.job_id}/1/restart/1")]
    # The replaced VMI's last words arrive late: stale, ignored.
    world.say(0, "failed", generation=0)
    assert world.status() is J.RESTARTING
    assert world.orch.statistics().reports_stale == 1
    world.say(0, "active")
    assert world.status() is J.RESTARTING  # until every replica is active again
    world.say(1, "active")
    assert world.status() is J.ACTIVE


def test_delete_queues_one_delete_per_replica_and_is_idempotent():
    world = World()
    world.do("two")
    world.published()
    world.orch.delete_job(world.job_id, world.now)
    world.orch.delete_job(world.job_id, world.now)
    ops = world.published()
    assert [op.op_id for op in ops] == [f"{world.job_id}/0/delete/0",
                                        f"{world.job_id}/1/delete/0"]
    assert all(isinstance(op, DeleteReplica) for op in ops)
    with pytest.raises(InvalidState):
        world.orch.restart_job(world.job_id, world.now)
    world.say(0, "deleted")
    assert world.status() is J.DELETING
    world.say(1, "deleted")
    with pytest.raises(NotFound):
        world.orch.get_job(world.job_id)


def test_a_single_replica_can_be_restarted_or_deleted_while_starting():
    world = World()
    world.do("two")
    world.published()
    world.orch.restart_replica(world.job_id, 0, world.now)
    assert world.replicas() == {0: "restarting", 1: "starting"}
    assert world.status() is J.RESTARTING
    world.orch.delete_replica(world.job_id, 1, world.now)
    ops = world.published()
    assert [op.op_id for op in ops] == [f"{world.job_id}/0/restart/1",
                                        f"{world.job_id}/1/delete/0"]
    world.say(1, "deleted")
    assert world.replicas() == {0: "restarting"}
    world.say(0, "active")
    assert world.status() is J.ACTIVE


def test_a_single_replica_cannot_be_restarted_or_deleted_once_active():
    world = World()
    world.do("two")
    world.say(0, "active")
    for action in (world.orch.restart_replica, world.orch.delete_replica):
        with pytest.raises(InvalidState) as info:
            action(world.job_id, 0, world.now)
        assert "whole job" in info.value.message


def test_replica_actions_on_pending_replicas_and_their_limits():
    world = World(nodes=(1, 1, 1))
    world.create(container(gpus=1))
    job = world.create(inference(gpus=1, replicas=3)).id
    assert world.status(job) is J.PENDING
    world.orch.restart_replica(job, 0, world.now)  # nothing to replace
    world.orch.delete_replica(job, 0, world.now)   # nothing to remove: gone at once
    world.orch.delete_replica(job, 1, world.now)
    assert world.replicas(job) == {2: "pending"}
    with pytest.raises(InvalidState):
        world.orch.delete_replica(job, 2, world.now)  # the last one: delete the job
    with pytest.raises(NotFound):
        world.orch.delete_replica(job, 7, world.now)
    assert all(out.op.job_id != job for out in world.orch.outbox())


def test_replica_actions_on_a_container_job_are_bad_requests():
    world = World()
    world.do("one")
    with pytest.raises(BadRequest):
        world.orch.restart_replica(world.job_id, 0, world.now)
    with pytest.raises(BadRequest):
        world.orch.delete_replica(world.job_id, 0, world.now)


def test_unknown_jobs_are_not_found():
    world = World()
    for call in (world.orch.get_job, lambda j: world.orch.restart_job(j, 0.0),
                 lambda j: world.orch.delete_job(j, 0.0)):
        with pytest.raises(NotFound) as info:
            call("j-0000000000000000")
        assert info.value.code == "NOT_FOUND"


# -- reports and silence -----------------------------------------------------------------


def test_reports_from_another_rack_or_about_unknown_jobs_change_nothing():
    world = World()
    world.orch.register_rack(OTHER_RACK, "default", world.now)
    world.do("one")
    world.say(0, "active", rack=OTHER_RACK)
    assert world.status() is J.STARTING
    world.orch.on_report(RACK, ReplicaReport(job_id="j-1111111111111111", replica=0,
                                             state="active", at=world.now), world.now)
    world.orch.on_report("ef" * 32, RackUpdate(rack=world.report, at=0.0), world.now)
    stats = world.orch.statistics()
    assert (stats.reports_refused, stats.reports_unknown) == (1, 2)


def test_a_report_the_replica_cannot_take_is_refused():
    world = World()
    world.do("one")
    world.say(0, "active")
    world.orch.delete_job(world.job_id, world.now)
    world.say(0, "failed")  # a deleting replica stays deleting
    assert world.status() is J.DELETING


def test_an_agent_that_stops_reporting_makes_the_job_unknown():
    world = World()
    world.do("two")
    world.say(0, "active")
    world.say(1, "unknown", message="heartbeats stopped")
    assert world.status() is J.UNKNOWN
    world.say(1, "active")
    assert world.status() is J.ACTIVE


def test_a_silent_rack_makes_its_jobs_unknown_until_it_reports_again():
    world = World()
    world.do("one")
    world.say(0, "active")
    world.advance(30)
    world.hear()  # the periodic rack report keeps it alive
    world.advance(59)
    assert world.status() is J.ACTIVE
    assert world.orch.next_deadline() == pytest.approx(world.now + 1)
    world.advance(1)
    view = world.orch.get_job(world.job_id)
    assert view.status is J.UNKNOWN and "no report" in view.reason
    assert [r.silent for r in world.orch.racks()] == [True]
    world.hear()
    assert world.status() is J.ACTIVE


def test_a_job_created_while_its_rack_is_silent_waits_until_the_rack_reports():
    world = World()
    world.silence()
    assert [n.schedulable for n in world.orch.nodes()] == [False]
    assert world.create(container()).status is J.PENDING
    world.hear()
    assert world.status() is J.STARTING
    assert [n.schedulable for n in world.orch.nodes()] == [True]
    assert world.orch.statistics().unexpected_transitions == 0


def test_a_silent_rack_does_not_touch_pending_jobs():
    world = World(nodes=(8,))
    world.do("pending")
    world.silence()
    assert world.status() is J.PENDING


def test_the_worker_deleting_a_replica_on_its_own_frees_its_gpus_and_fails_it():
    world = World(nodes=(8,))
    world.do("one")
    waiting = world.create(container(gpus=8)).id
    assert world.status(waiting) is J.PENDING
    first = world.orch.list_jobs()[0].id
    world.say(0, "deleted", job=first, message="VMI vanished")
    view = world.orch.get_job(first)
    assert view.status is J.FAILED and view.reason == "VMI vanished"
    assert world.status(waiting) is J.STARTING
    world.say(0, "active", job=first)  # it is gone: reports about it are refused
    assert world.status(first) is J.FAILED
    assert world.orch.delete_job(first, world.now) is None  # nothing left to delete


def test_restarting_a_replica_the_worker_removed_creates_it_again_if_gpus_are_free():
    world = World(nodes=(8,))
    world.do("one")
    world.say(0, "deleted", message="VMI vanished")
    world.published()
    world.orch.restart_job(world.job_id, world.now)
    [op] = world.published()
    assert isinstance(op, CreateReplica) and op.op_id == f"{world.job_id}/0/create/1"
    assert world.status() is J.RESTARTING
    world.say(0, "active")
    assert world.status() is J.ACTIVE
    # Removed again, and its GPUs taken meanwhile: the restart cannot recreate it.
    world.say(0, "deleted")
    first = world.job_id
    world.create(container(gpus=8))
    view = world.orch.restart_job(first, world.now)
    assert view.status is J.FAILED and "no free GPUs" in view.reason


# -- racks and reservations ---------------------------------------------------------------


def test_racks_register_list_and_remove_only_when_empty():
    world = World()
    again = world.orch.register_rack(RACK, "default", world.now, name="renamed")
    assert again.name == "renamed"
    with pytest.raises(BadRequest):
        world.orch.register_rack(RACK, "elsewhere", world.now)
    with pytest.raises(BadRequest):
        world.orch.register_rack("not-a-key", "default", world.now)
    world.do("one")
    [info] = world.orch.racks()
    assert (info.gpus, info.free, info.jobs, info.reported) == (8, 7, 1, True)
    with pytest.raises(InvalidState):
        world.orch.remove_rack(RACK)
    world.orch.delete_job(world.job_id, world.now)
    world.say(0, "deleted")
    world.silence()
    waiting = world.create(container()).id  # Pending: a silent rack takes nothing new
    assert world.status(waiting) is J.PENDING
    world.orch.remove_rack(RACK)
    assert world.orch.racks() == []
    world.advance(1)
    view = world.orch.get_job(waiting)
    assert view.status is J.FAILED and "no rack" in view.reason
    with pytest.raises(NotFound):
        world.orch.remove_rack(RACK)


def test_reserved_nodes_run_only_their_teams_jobs():
    world = World(nodes=(4, 4))
    world.orch.reserve_nodes(RACK, ["n1"], "team-b")
    assert {n.name: n.reserved_for for n in world.orch.nodes()} == {"n0": None,
                                                                    "n1": "team-b"}
    b = world.create(container(gpus=4, team="team-b"))
    assert b.replicas[0].placement.shares[0].node == "n1"
    a = world.create(container(gpus=4, team="team-a"))
    assert a.replicas[0].placement.shares[0].node == "n0"
    with pytest.raises(InvalidState):
        world.orch.reserve_nodes(RACK, ["n1"], "team-c")
    with pytest.raises(NotFound):
        world.orch.reserve_nodes(RACK, ["n9"], "team-c")
    with pytest.raises(NotFound):
        world.orch.reserve_nodes(OTHER_RACK, ["n0"], "team-c")
    world.orch.delete_job(b.id, world.now)
    world.say(0, "deleted", job=b.id)
    waiting = world.create(container(gpus=4, team="team-a")).id
    assert world.status(waiting) is J.PENDING  # n1 is free but team-b's
    world.orch.release_nodes(RACK, ["n1", "n0"])
    assert all(n.reserved_for is None for n in world.orch.nodes())
    world.advance(1)
    assert world.status(waiting) is J.STARTING


def test_list_jobs_filters_by_team_oldest_first():
    world = World()
    first = world.create(container(team="team-a")).id
    second = world.create(container(team="team-b")).id
    third = world.create(container(team="team-a")).id
    assert [j.id for j in world.orch.list_jobs()] == [first, second, third]
    assert [j.id for j in world.orch.list_jobs("team-a")] == [first, third]


def test_a_job_waits_pending_for_a_rack_that_has_not_reported_instead_of_failing():
    world = World(register=False)
    world.orch.register_rack(RACK, "default", world.now, name="rack-1")
    job = world.create(container(gpus=2))
    assert job.status is JobStatus.PENDING
    assert "has not" not in job.reason and "report its capacity" in job.reason
    assert world.orch.outbox() == []
    world.hear()  # its first capacity report arrives
    assert world.status(job.id) is JobStatus.STARTING
    assert [o.op.kind for o in world.orch.outbox()] == ["create_replica"]


def test_a_job_too_big_for_every_reported_rack_still_fails_at_once():
    world = World(nodes=(8,))
    assert world.create(container(gpus=9)).status is JobStatus.FAILED
