"""The job status machine of seeds/jobs.txt: replica transitions and the job's status.

Theory of operation
-------------------
wrk-ork keeps, per replica, a :class:`~contracts.ork.ReplicaStatus` that only the events of
:data:`REPLICA_TRANSITIONS` change: placement's answer (``PLACED``,
``NO_CAPACITY``, ``UNPLACEABLE``), the user's ``RESTART`` and ``DELETE``, and the
worker's reports (``REPORTED_<state>``, one per :class:`~contracts.model.ReplicaState`).
A (status, event) pair missing from the table is refused: a user action gets
``INVALID_STATE``, a report is ignored and counted (it describes something the
replica cannot be doing, e.g. a report about a replica not yet created).

A job's :class:`~contracts.model.JobStatus` is not stored state of its own: it is
:func:`derive_job_status` of its replicas' statuses and four flags (a delete or
a restart was asked; placement said it can never fit; its rack went silent).
The rules, first match wins::

    deleting                                   -> Deleting
    never fits (placement said Unplaceable)    -> Failed
    every replica Queued                       -> Queued
    every replica Queued or Pending            -> Pending   (holds nothing)
    the rack is silent, or a replica Unknown   -> Unknown
    a replica Failed: one replica in the job,
        or none left active/starting           -> Failed
      otherwise                                -> Degraded
    restart asked and not every replica Active -> Restarting
    a replica Restarting (the worker's doing)  -> Restarting
    every replica Active                       -> Active    ("running" in the API)
    otherwise                                  -> Starting

Replicas being deleted one at a time (``DELETING``) do not count in the rules
after the first three: the job is what its remaining replicas are.

:data:`JOB_TRANSITIONS` lists every change of a job's status that can happen,
with its cause; Creating and Queued are passed through inside one call
(``create_job``, or placing a Pending job), and ``None`` stands for the job
being gone. The orchestrator checks each change against it and counts the ones
that are not there (a bug here, never the user's doing); the docs draw it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from contracts.model import JobStatus, ReplicaState
from contracts.ork import ReplicaStatus

from .errors import InvalidState

__all__ = [
    "JOB_TRANSITIONS",
    "PLACED_STATUSES",
    "REPLICA_TRANSITIONS",
    "SINGLE_REPLICA_ACTIONS",
    "JobFlags",
    "ReplicaEvent",
    "derive_job_status",
    "next_replica_status",
    "reported",
    "restart_done",
]


class ReplicaEvent(enum.StrEnum):
    """What can happen to a replica."""

    #: Placement found GPUs; the orchestrator claims them and queues CreateReplica.
    PLACED = "placed"
    #: Placement found no free GPUs now.
    NO_CAPACITY = "no_capacity"
    #: Placement says the job can never fit the registered racks.
    UNPLACEABLE = "unplaceable"
    #: The user asked to restart it (a new generation, RestartReplica queued).
    RESTART = "restart"
    #: The user asked to delete it.
    DELETE = "delete"
    REPORTED_STARTING = "reported_starting"
    REPORTED_ACTIVE = "reported_active"
    REPORTED_FAILED = "reported_failed"
    REPORTED_RESTARTING = "reported_restarting"
    REPORTED_UNKNOWN = "reported_unknown"
    REPORTED_DELETED = "reported_deleted"


_S = ReplicaStatus
_E = ReplicaEvent

#: The worker's reports, as followed by a replica that exists on the rack.
_MIRROR: dict[ReplicaEvent, ReplicaStatus] = {
    _E.REPORTED_STARTING: _S.STARTING,
    _E.REPORTED_ACTIVE: _S.ACTIVE,
    _E.REPORTED_FAILED: _S.FAILED,
    _E.REPORTED_RESTARTING: _S.RESTARTING,
    _E.REPORTED_UNKNOWN: _S.UNKNOWN,
    # DELETED without a delete asked: the VMI and its GPUs are gone, so the
    # replica has failed (the orchestrator releases its GPUs).
    _E.REPORTED_DELETED: _S.FAILED,
}


#: A replica whose VMI may exist follows the worker and the user's actions alike.
_EXISTING: dict[ReplicaEvent, ReplicaStatus] = {
    **_MIRROR, _E.RESTART: _S.RESTARTING, _E.DELETE: _S.DELETING}


#: Every replica transition: REPLICA_TRANSITIONS[status][event] -> new status.
REPLICA_TRANSITIONS: dict[ReplicaStatus, dict[ReplicaEvent, ReplicaStatus]] = {
    _S.QUEUED: {
        _E.PLACED: _S.STARTING,
        _E.NO_CAPACITY: _S.PENDING,
        _E.UNPLACEABLE: _S.FAILED,
        # Nothing exists yet: a restart has nothing to replace, a delete nothing to remove.
        _E.RESTART: _S.QUEUED,
        _E.DELETE: _S.DELETED,
    },
    _S.PENDING: {
        _E.PLACED: _S.STARTING,
        _E.NO_CAPACITY: _S.PENDING,
        _E.UNPLACEABLE: _S.FAILED,
        _E.RESTART: _S.PENDING,
        _E.DELETE: _S.DELETED,
    },
    _S.STARTING: dict(_EXISTING),
    _S.ACTIVE: dict(_EXISTING),
    _S.FAILED: dict(_EXISTING),
    _S.RESTARTING: dict(_EXISTING),
    _S.UNKNOWN: dict(_EXISTING),
    _S.DELETING: {
        # The delete goes on whatever the VMI does meanwhile; asking again is harmless.
        **{event: _S.DELETING for event in _MIRROR},
        _E.REPORTED_DELETED: _S.DELETED,
        _E.DELETE: _S.DELETING,
    },
    _S.DELETED: {},
}

#: seeds/jobs.txt: "restart or delete a single replica while it's Queued,
#: Pending, or Starting".
SINGLE_REPLICA_ACTIONS: frozenset[ReplicaStatus] = frozenset({_S.QUEUED, _S.PENDING, _S.STARTING})

#: Statuses of a replica whose VMI may exist on its rack (GPUs claimed).
PLACED_STATUSES: frozenset[ReplicaStatus] = frozenset(
    {_S.STARTING, _S.ACTIVE, _S.FAILED, _S.RESTARTING, _S.UNKNOWN, _S.DELETING})

_REPORTED = {
    ReplicaState.STARTING: _E.REPORTED_STARTING,
    ReplicaState.ACTIVE: _E.REPORTED_ACTIVE,
    ReplicaState.FAILED: _E.REPORTED_FAILED,
    ReplicaState.RESTARTING: _E.REPORTED_RESTARTING,
    ReplicaState.UNKNOWN: _E.REPORTED_UNKNOWN,
    ReplicaState.DELETED: _E.REPORTED_DELETED,
}


def reported(state: ReplicaState) -> ReplicaEvent:
    """The event of a worker's report of ``state``."""
    return _REPORTED[state]


def next_replica_status(status: ReplicaStatus, event: ReplicaEvent) -> ReplicaStatus:
    """The replica's status after ``event``.

    Raises:
        InvalidState: the table has no such transition; for a user action, tell
            the user the replica's status; for a report, ignore it.
    """
    try:
        return REPLICA_TRANSITIONS[status][event]
    except KeyError:
        raise InvalidState(f"a replica that is {status.value} cannot take "
                           f"{event.value.replace('_', ' ')}") from None


@dataclass(frozen=True, slots=True)
class JobFlags:
    """What the job's status depends on besides its replicas' statuses."""

    #: A delete of the whole job was asked.
    deleting: bool = False
    #: A restart of the whole job was asked and not every replica is Active again.
    restarting: bool = False
    #: Placement said the job can never fit; ``reason`` says why.
    unplaceable: bool = False
    #: The job's rack sent nothing for ``unknown_after_s``.
    rack_silent: bool = False


_RUNNING = frozenset({_S.QUEUED, _S.PENDING, _S.STARTING, _S.ACTIVE, _S.RESTARTING})
_UNPLACED = frozenset({_S.QUEUED, _S.PENDING})


def derive_job_status(replicas: Iterable[ReplicaStatus], flags: JobFlags) -> JobStatus:
    """The job's status from its replicas' statuses and ``flags`` (rules in the module doc)."""
    if flags.deleting:
        return JobStatus.DELETING
    if flags.unplaceable:
        return JobStatus.FAILED
    live = [status for status in replicas if status not in (_S.DELETED, _S.DELETING)]
    if not live:
        # Only replicas being deleted one by one: the last one cannot be (the
        # orchestrator refuses), so this is a job whose rows are being torn down.
        return JobStatus.DELETING
    if all(status is _S.QUEUED for status in live):
        return JobStatus.QUEUED
    if all(status in _UNPLACED for status in live):
        return JobStatus.PENDING
    if flags.rack_silent or _S.UNKNOWN in live:
        return JobStatus.UNKNOWN
    if _S.FAILED in live:
        if len(live) == 1 or not any(status in _RUNNING for status in live):
            return JobStatus.FAILED
        return JobStatus.DEGRADED
    if flags.restarting or _S.RESTARTING in live:
        return JobStatus.RESTARTING
    if all(status is _S.ACTIVE for status in live):
        return JobStatus.ACTIVE
    return JobStatus.STARTING


def restart_done(replicas: Iterable[ReplicaStatus]) -> bool:
    """A whole-job restart is over once every remaining replica is Active again."""
    return all(status is _S.ACTIVE for status in replicas
               if status not in (_S.DELETED, _S.DELETING))


_J = JobStatus

#: Every change of a job's status, with its cause. ``None`` as the target: the
#: job is gone (its rows removed, a ``removed`` event sent).
JOB_TRANSITIONS: dict[tuple[JobStatus, JobStatus | None], str] = {
    (_J.CREATING, _J.QUEUED): "the spec is valid; placement is tried",
    (_J.QUEUED, _J.STARTING): "placed: GPUs claimed, CreateReplica queued",
    (_J.QUEUED, _J.PENDING): "no capacity now; holds nothing",
    (_J.QUEUED, _J.FAILED): "unplaceable: can never fit the registered racks",
    (_J.PENDING, _J.QUEUED): "capacity freed; oldest Pending job first",
    (_J.PENDING, None): "deleted: it held nothing",
    (_J.STARTING, _J.ACTIVE): "every replica reported active",
    (_J.STARTING, _J.DEGRADED): "a replica failed, another runs or starts",
    (_J.STARTING, _J.FAILED): "its only replica (or every replica) failed",
    (_J.STARTING, _J.RESTARTING): "restart asked (or the worker replaces a VMI)",
    (_J.STARTING, _J.UNKNOWN): "the rack went silent or an agent stopped reporting",
    (_J.STARTING, _J.DELETING): "delete asked",
    (_J.ACTIVE, _J.STARTING): "a replica boots again (the worker rebooted it)",
    (_J.ACTIVE, _J.DEGRADED): "a replica failed, another runs",
    (_J.ACTIVE, _J.FAILED): "its only replica (or every replica) failed",
    (_J.ACTIVE, _J.RESTARTING): "restart asked (or the worker replaces a VMI)",
    (_J.ACTIVE, _J.UNKNOWN): "the rack went silent or an agent stopped reporting",
    (_J.ACTIVE, _J.DELETING): "delete asked",
    (_J.DEGRADED, _J.ACTIVE): "the failed replica came back",
    (_J.DEGRADED, _J.STARTING): "the failed replica boots again",
    (_J.DEGRADED, _J.FAILED): "the replicas left failed too",
    (_J.DEGRADED, _J.RESTARTING): "restart asked",
    (_J.DEGRADED, _J.UNKNOWN): "the rack went silent or an agent stopped reporting",
    (_J.DEGRADED, _J.DELETING): "delete asked",
    (_J.RESTARTING, _J.ACTIVE): "every replica reported active again",
    (_J.RESTARTING, _J.DEGRADED): "a replica failed, another runs or starts",
    (_J.RESTARTING, _J.FAILED): "its only replica (or every replica) failed",
    (_J.RESTARTING, _J.STARTING): "a replica the worker (or a replica restart) replaced boots",
    (_J.RESTARTING, _J.UNKNOWN): "the rack went silent or an agent stopped reporting",
    (_J.RESTARTING, _J.DELETING): "delete asked",
    (_J.FAILED, _J.RESTARTING): "restart asked",
    (_J.FAILED, _J.STARTING): "the worker reports a failed replica booting again",
    (_J.FAILED, _J.ACTIVE): "the worker reports the failed replica active again",
    (_J.FAILED, _J.DEGRADED): "one of several failed replicas boots again",
    (_J.FAILED, _J.UNKNOWN): "the rack went silent or an agent stopped reporting",
    (_J.FAILED, _J.DELETING): "delete asked (VMIs may exist)",
    (_J.FAILED, None): "deleted: it was never placed",
    (_J.UNKNOWN, _J.STARTING): "reports resumed: replicas starting",
    (_J.UNKNOWN, _J.ACTIVE): "reports resumed: every replica active",
    (_J.UNKNOWN, _J.DEGRADED): "reports resumed: a replica failed, another runs",
    (_J.UNKNOWN, _J.FAILED): "reports resumed: the replicas failed",
    (_J.UNKNOWN, _J.RESTARTING): "reports resumed during a restart, or restart asked",
    (_J.UNKNOWN, _J.DELETING): "delete asked",
    (_J.DELETING, None): "every replica reported deleted; its GPUs are free",
}
