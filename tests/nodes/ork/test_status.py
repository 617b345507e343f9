"""The pure status machine: every replica transition, every refused pair, the job rules."""

from __future__ import annotations

import itertools

import pytest

from contracts.model import JobStatus, ReplicaState
from contracts.ork import ReplicaStatus
from nodes.ork.errors import InvalidState
from nodes.ork.status import (
    JOB_TRANSITIONS,
    PLACED_STATUSES,
    REPLICA_TRANSITIONS,
    SINGLE_REPLICA_ACTIONS,
    JobFlags,
    ReplicaEvent,
    derive_job_status,
    next_replica_status,
    reported,
    restart_done,
)

S = ReplicaStatus
E = ReplicaEvent
J = JobStatus

ALL_PAIRS = list(itertools.product(ReplicaStatus, ReplicaEvent))


def test_every_replica_status_has_a_row():
    assert set(REPLICA_TRANSITIONS) == set(ReplicaStatus)


@pytest.mark.parametrize(("status", "event"), ALL_PAIRS,
                         ids=[f"{s.value}-{e.value}" for s, e in ALL_PAIRS])
def test_each_status_event_pair_follows_the_table_or_is_refused(status, event):
    row = REPLICA_TRANSITIONS[status]
    if event in row:
        assert next_replica_status(status, event) is row[event]
    else:
        with pytest.raises(InvalidState) as info:
            next_replica_status(status, event)
        assert info.value.code == "INVALID_STATE"
        assert status.value in info.value.message


@pytest.mark.parametrize(("status", "event", "after"), [
    (S.QUEUED, E.PLACED, S.STARTING),
    (S.QUEUED, E.NO_CAPACITY, S.PENDING),
    (S.QUEUED, E.UNPLACEABLE, S.FAILED),
    (S.PENDING, E.PLACED, S.STARTING),
    (S.PENDING, E.DELETE, S.DELETED),
    (S.PENDING, E.RESTART, S.PENDING),
    (S.STARTING, E.REPORTED_ACTIVE, S.ACTIVE),
    (S.STARTING, E.RESTART, S.RESTARTING),
    (S.STARTING, E.DELETE, S.DELETING),
    (S.ACTIVE, E.REPORTED_FAILED, S.FAILED),
    (S.ACTIVE, E.REPORTED_UNKNOWN, S.UNKNOWN),
    (S.ACTIVE, E.REPORTED_DELETED, S.FAILED),
    (S.FAILED, E.RESTART, S.RESTARTING),
    (S.RESTARTING, E.REPORTED_STARTING, S.STARTING),
    (S.UNKNOWN, E.REPORTED_ACTIVE, S.ACTIVE),
    (S.DELETING, E.REPORTED_ACTIVE, S.DELETING),
    (S.DELETING, E.REPORTED_DELETED, S.DELETED),
])
def test_the_transitions_the_seeds_describe(status, event, after):
    assert next_replica_status(status, event) is after


@pytest.mark.parametrize(("status", "event"), [
    (S.PENDING, E.REPORTED_ACTIVE),  # nothing exists yet on the rack
    (S.STARTING, E.PLACED),
    (S.DELETING, E.RESTART),
    (S.DELETED, E.DELETE),
    (S.DELETED, E.REPORTED_ACTIVE),
])
def test_impossible_transitions_are_refused(status, event):
    with pytest.raises(InvalidState):
        next_replica_status(status, event)


def test_every_worker_state_maps_to_a_report_event():
    assert {reported(state) for state in ReplicaState} == {
        e for e in ReplicaEvent if e.value.startswith("reported_")}


def test_single_replica_actions_are_the_seeds_three_statuses():
    assert {S.QUEUED, S.PENDING, S.STARTING} == SINGLE_REPLICA_ACTIONS
    assert not SINGLE_REPLICA_ACTIONS & PLACED_STATUSES - {S.STARTING}


NO = JobFlags()

DERIVED = [
    # (replicas, flags, job status)
    ([S.QUEUED, S.QUEUED], NO, J.QUEUED),
    ([S.PENDING, S.PENDING], NO, J.PENDING),
    ([S.QUEUED, S.PENDING], NO, J.PENDING),
    ([S.STARTING], NO, J.STARTING),
    ([S.ACTIVE, S.STARTING], NO, J.STARTING),
    ([S.ACTIVE, S.ACTIVE], NO, J.ACTIVE),
    ([S.ACTIVE, S.DELETING], NO, J.ACTIVE),
    ([S.FAILED], NO, J.FAILED),
    ([S.FAILED, S.ACTIVE], NO, J.DEGRADED),
    ([S.FAILED, S.STARTING], NO, J.DEGRADED),
    ([S.FAILED, S.RESTARTING], NO, J.DEGRADED),
    ([S.FAILED, S.FAILED], NO, J.FAILED),
    ([S.FAILED, S.DELETING], NO, J.FAILED),  # one replica left: Failed, not Degraded
    ([S.RESTARTING, S.ACTIVE], NO, J.RESTARTING),
    ([S.ACTIVE, S.STARTING], JobFlags(restarting=True), J.RESTARTING),
    ([S.ACTIVE, S.ACTIVE], JobFlags(restarting=True), J.RESTARTING),
    ([S.FAILED, S.ACTIVE], JobFlags(restarting=True), J.DEGRADED),
    ([S.UNKNOWN, S.ACTIVE], NO, J.UNKNOWN),
    ([S.ACTIVE], JobFlags(rack_silent=True), J.UNKNOWN),
    ([S.FAILED, S.ACTIVE], JobFlags(rack_silent=True), J.UNKNOWN),
    ([S.PENDING], JobFlags(rack_silent=True), J.PENDING),  # holds nothing on any rack
    ([S.FAILED], JobFlags(unplaceable=True, rack_silent=True), J.FAILED),
    ([S.ACTIVE], JobFlags(deleting=True, rack_silent=True), J.DELETING),
    ([S.DELETING], NO, J.DELETING),
]


@pytest.mark.parametrize(("replicas", "flags", "status"), DERIVED)
def test_job_status_is_derived_from_replicas_and_flags(replicas, flags, status):
    assert derive_job_status(replicas, flags) is status


def test_a_restart_is_done_when_every_remaining_replica_is_active():
    assert restart_done([S.ACTIVE, S.ACTIVE, S.DELETING])
    assert not restart_done([S.ACTIVE, S.RESTARTING])
    assert not restart_done([S.ACTIVE, S.FAILED])


def test_job_transitions_cover_every_status_and_never_start_from_nothing():
    sources = {a for a, _ in JOB_TRANSITIONS}
    targets = {b for _, b in JOB_TRANSITIONS}
    assert sources == set(JobStatus)
    assert targets == set(JobStatus) - {J.CREATING} | {None}
    assert all(a is not b for a, b in JOB_TRANSITIONS)
    assert all(cause for cause in JOB_TRANSITIONS.values())
