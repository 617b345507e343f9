"""wrk-ork's core: jobs, their replicas and racks, driven by calls, reports and time.

Theory of operation
-------------------
The orchestrator decides; it keeps nothing of its own beyond what it decides
by. It has a :class:`~nodes.ork.job_book.JobBook` (the records of jobs,
replicas, racks and shell keys, their status events, and the one transaction
each call ends in) and a :class:`~nodes.ork.capacity.Capacity` (every rack's
GPUs and the claims on them), on which :func:`~nodes.ork.placement.place`
answers where a job goes.

The daemon drives one :class:`Orchestrator` from one task: app-node's requests
(through :mod:`nodes.ork.service`), the workers' reports read from their
queues (:meth:`Orchestrator.on_report`) and a periodic :meth:`~Orchestrator.tick`.
Nothing here awaits, reads a clock or touches a socket: time is the ``now``
argument (seconds, the daemon's wall clock, as job timestamps are shown to
users), and what must go out is collected for the daemon to take:

- operations for the workers: :meth:`~Orchestrator.outbox`, saved in the same
  transaction as the state change that made them; the daemon publishes them
  on the rack's queue and then calls :meth:`~Orchestrator.mark_published`.
  Op ids are ``<job>/<replica>/<kind>/<generation>``, so an operation
  published again after a crash is recognised by the worker;
- status changes for ``jobs.watch``: :meth:`~Orchestrator.drain_events`.

Shell keys: app-node sends each team's shell keys with a version
that only grows (:meth:`~Orchestrator.set_shell_keys`); the newest per team is
saved, and a changed set becomes a ``set_shell_keys`` operation to every rack
holding the team's container jobs, and to a rack before the first
CreateReplica of such a job, so the worker always has the newest set before
it renders an agent's config.

Statuses follow :mod:`nodes.ork.status`: a replica's status changes only by its
table, and a job's status is derived from its replicas after every change;
each job status change is checked against ``JOB_TRANSITIONS`` and sent as a
:class:`JobEvent`.

GPUs are claimed in the :class:`~nodes.ork.capacity.Capacity` when a replica is
placed and released only when its worker reports it DELETED, not when the
delete is asked: a Pending job is placed only when the GPUs really are free.
Pending jobs are tried oldest first once capacity has grown (GPUs freed, a
rack's report changed, a silent rack heard again; after a reservation change,
at the next tick); a younger job that fits may pass an older one that does not
(so a large job can wait behind a stream of small ones: not solved here).

A rack is *silent* once it has sent nothing (reports of any kind; the worker
sends a rack report periodically) for ``unknown_after_s``; every job with
replicas there is Unknown until the rack is heard again, and its nodes take no
new replicas meanwhile (its worker may be gone). Silence is saved; after
wrk-ork starts, every rack gets a full ``unknown_after_s`` from the first tick.

Persistence: every public call that changes something writes it in one
SQLite transaction (:meth:`JobBook.commit <nodes.ork.job_book.JobBook.commit>`,
into :mod:`nodes.ork.store`) before returning. If that write fails, the call
raises :class:`~nodes.ork.errors.StoreError` and the memory is ahead of the
file: the daemon must stop and reopen (it reloads the file).
"""

from __future__ import annotations

import hashlib
import heapq
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from contracts.model import JobSpec, JobStatus, JobType, RackReport, ReplicaPlacement
from contracts.operations import (
    CreateReplica,
    DeleteReplica,
    RackUpdate,
    ReplicaReport,
    RestartReplica,
    SetShellKeys,
)
from contracts.ork import JobEvent, JobPreview, JobView, RackInfo, ReplicaStatus, ReplicaView
from contracts.shell_access import ShellKeys

from .capacity import Capacity, NodeView
from .errors import BadRequest, Conflict, InvalidState, NotFound, StoreError
from .job_book import JobBook, holds_gpus_on, job_view, rack_key
from .placement import NoCapacity, PlacementError, Unplaceable, place
from .quota import check_gpu_quota
from .status import (
    PLACED_STATUSES,
    SINGLE_REPLICA_ACTIONS,
    ReplicaEvent,
    next_replica_status,
    reported,
)
from .store import JobRecord, Outbound, RackRecord, ReplicaRecord

#: "restarted", "deleted": for the messages of single-replica actions.
_PAST = {"restart": "restarted", "delete": "deleted"}

__all__ = [
    "JobEvent",
    "JobView",
    "Orchestrator",
    "OrchestratorStatistics",
    "Outbound",
    "RackInfo",
    "ReplicaView",
    "op_id",
]

_LOCATION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def op_id(job_id: str, replica: int, kind: Literal["create", "restart", "delete"],
          generation: int) -> str:
    """The operation's id: the same for the same (job, replica, kind, generation)."""
    return f"{job_id}/{replica}/{kind}/{generation}"


def _shell_op(rack: str, keys: ShellKeys) -> SetShellKeys:
    """The ``set_shell_keys`` operation of ``keys`` for ``rack``: its id is unique
    per (team, version, rack) in the outbox (the worker orders by version)."""
    digest = hashlib.blake2b(f"{keys.team}\0{keys.version}\0{rack}".encode(),
                             digest_size=16).hexdigest()
    return SetShellKeys(op_id=f"shell/{digest}", keys=keys)


@dataclass(frozen=True, slots=True)
class OrchestratorStatistics:
    """Counters for the daemon's metrics (read with ``statistics()``)."""

    jobs: int
    pending_jobs: int
    outbox: int
    reports_applied: int
    #: Reports about jobs or replicas we do not have (a late report after a delete).
    reports_unknown: int
    #: Reports about an older generation than ours (the VMI a restart replaced).
    reports_stale: int
    #: Reports the replica's status cannot take, or from a rack not its own.
    reports_refused: int
    #: Job status changes missing from JOB_TRANSITIONS (a bug here; should stay 0).
    unexpected_transitions: int
    events_dropped: int


def _new_job_id() -> str:
    return "j-" + secrets.token_hex(8)


class Orchestrator:
    """Decides what happens to jobs: placement, restarts, deletes, reports, silence.

    Use :meth:`open`. Not thread-safe: one task drives it. It has a
    :class:`~nodes.ork.job_book.JobBook` (``book``: the records, their status
    events and the transaction of each call) and a
    :class:`~nodes.ork.capacity.Capacity` (the GPUs of every rack and who
    holds them), which :func:`~nodes.ork.placement.place` reads.
    """

    def __init__(self, book: JobBook, capacity: Capacity, *, unknown_after_s: float,
                 new_job_id: Callable[[], str] = _new_job_id) -> None:
        if unknown_after_s <= 0:
            raise ValueError("unknown_after_s must be positive")
        self.book = book
        self._capacity = capacity
        self.unknown_after_s = unknown_after_s
        self._new_job_id = new_job_id
        #: Per rack, when we last heard from it (set at registration, on any
        #: report, and for every rack at the first tick after opening).
        self._heard: dict[str, float] = {}
        #: When each rack last reported since opening (unlike ``_heard``, never
        #: seeded): what the control-plane health shows of each worker.
        self._reported_at: dict[str, float] = {}
        #: When the newest report came from any rack since opening (None: none yet).
        self._last_report_at: float | None = None
        #: Capacity may have grown (GPUs freed, a report, a reservation changed)
        #: since Pending jobs were last tried.
        self._capacity_changed = True
        self._stats = dict(reports_applied=0, reports_unknown=0, reports_stale=0,
                           reports_refused=0)

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | None, *, unknown_after_s: float = 60.0,
             new_job_id: Callable[[], str] = _new_job_id) -> Orchestrator:
        """Open the store at ``path`` (None: in memory) and reload everything from it.

        Raises:
            StoreError: the store cannot be read, or its claims no longer fit
                the racks it records.
        """
        book = JobBook.open(path)
        try:
            orch = cls(book, Capacity(), unknown_after_s=unknown_after_s,
                       new_job_id=new_job_id)
            orch._restore_capacity()
        except BaseException:
            book.close()
            raise
        return orch

    def _restore_capacity(self) -> None:
        """Rebuild the capacity and its claims from the book.

        Claims are restored without the checks of a new placement
        (``Capacity.restore``): the replicas run, even on a node cordoned or gone
        from the report since.
        """
        capacity = self._capacity
        for rack in self.book.racks.values():
            self._set_capacity(rack)
        for key, node, team in self.book.reservations():
            # Kept even for a node missing from the last report (Capacity.reserve
            # allows it), so the team stays on its own nodes when it is back.
            capacity.reserve(key, node, team)
        for job in self.book.jobs.values():
            claims = [r.placement for r in job.replicas.values()
                      if r.claimed and r.placement is not None]
            try:
                capacity.restore(claims)
            except PlacementError as exc:
                raise StoreError(f"job {job.id}'s claimed GPUs are on a rack that is no "
                                 f"longer registered ({exc}); restore a backup of the "
                                 "store") from exc

    def close(self) -> None:
        self.book.close()

    def _set_capacity(self, rack: RackRecord) -> None:
        """Give the capacity the rack's last report; a silent rack's nodes take
        nothing new (its worker may be gone), so new jobs wait Pending rather
        than being sent to it. Claims are kept either way."""
        report = rack.report or RackReport(nodes=())
        if rack.silent:
            report = report.model_copy(update={"nodes": tuple(
                node.model_copy(update={"schedulable": False}) for node in report.nodes)})
        self._capacity.set_rack(rack.key, rack.location, report)
        self._capacity_changed = True

    # -- outbox, events and counters ------------------------------------------------------

    def outbox(self) -> list[Outbound]:
        """Operations not yet published, in the order they were made."""
        return self.book.outbox()

    def mark_published(self, op_ids: Iterable[str]) -> None:
        """The daemon published these durably on their racks' queues."""
        self.book.mark_published(op_ids)

    def drain_events(self) -> list[JobEvent]:
        """Status changes since the last drain, oldest first."""
        return self.book.drain_events()

    def statistics(self) -> OrchestratorStatistics:
        jobs = self.book.jobs.values()
        return OrchestratorStatistics(
            jobs=len(jobs),
            pending_jobs=sum(job.status is JobStatus.PENDING for job in jobs),
            outbox=self.book.outbox_size(), **self._stats,
            unexpected_transitions=self.book.unexpected_transitions,
            events_dropped=self.book.events_dropped)

    # -- jobs ---------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, now: float, *, owner: str | None = None,
                   team_gpus: int | None = None, user_gpus: int | None = None) -> JobView:
        """Create a job: Creating, Queued, then Starting (GPUs claimed, its
        CreateReplica operations in the outbox), Pending (no free GPUs now) or
        Failed (it can never fit; ``reason`` says why).

        ``owner`` (app-node's user id) is kept with the job; ``team_gpus`` and
        ``user_gpus`` are the team's GPU quotas (None: none), checked against
        the team's jobs here, in the call that adds the job (:mod:`.quota`).

        The caller then publishes :meth:`outbox` and sends :meth:`drain_events`.

        Raises:
            Conflict: an inference job of the team that is not being deleted
                already serves the same name (proxy-inference routes by it).
            QuotaExceeded: the job would take the team, or ``owner``, past a quota.
        """
        self._admit(spec, owner=owner, team_gpus=team_gpus, user_gpus=user_gpus)
        job_id = self._new_job_id()
        while job_id in self.book.jobs:
            job_id = self._new_job_id()
        job = self.book.add_job(job_id, spec, now, owner)
        self.book.refresh(job, now)  # Creating -> Queued: the spec was validated on the way in
        self._place(job, now)
        self.book.commit()
        return job_view(job)

    def preview_job(self, spec: JobSpec, *, owner: str | None = None,
                    team_gpus: int | None = None, user_gpus: int | None = None) -> JobPreview:
        """What :meth:`create_job` of the same arguments would do now, doing none of it.

        The same refusals, then the status the job would reach once placement was
        tried: Starting with where each replica goes, Pending or Failed with the
        reason :meth:`create_job` would give it. Nothing is recorded (no job, no
        claim, no operation, no event, no transaction); placement's memo of
        shapes that never fit may learn an answer (a cache, not state).

        Raises:
            Conflict, QuotaExceeded: as :meth:`create_job`.
        """
        self._admit(spec, owner=owner, team_gpus=team_gpus, user_gpus=user_gpus)
        placements, event, reason = self._decide(spec)
        if event is ReplicaEvent.PLACED:
            return JobPreview(status=JobStatus.STARTING, reason="", rack=placements[0].rack,
                              placements=placements)
        status = JobStatus.PENDING if event is ReplicaEvent.NO_CAPACITY else JobStatus.FAILED
        return JobPreview(status=status, reason=reason)

    def _admit(self, spec: JobSpec, *, owner: str | None, team_gpus: int | None,
               user_gpus: int | None) -> None:
        """Refuse a new job that clashes with a live one or goes past a quota."""
        served = spec.serves_as
        if served is not None:
            for other in self.book.jobs.values():
                if (not other.deleting and other.spec.team == spec.team
                        and other.spec.serves_as == served):
                    raise Conflict(f"team {spec.team!r} already serves {served!r} with job "
                                   f"{other.id}; give this job another served_name or "
                                   "delete that job first")
        check_gpu_quota(self.book.jobs.values(), spec, owner=owner, team_gpus=team_gpus,
                        user_gpus=user_gpus)

    def restart_job(self, job_id: str, now: float) -> JobView:
        """Replace every replica's VMIs, keeping storage: Restarting until all are Active.

        A Pending job has nothing to replace: nothing happens.

        Raises:
            NotFound: no such job.
            InvalidState: it is being deleted, or it never fitted (delete it).
        """
        job = self.book.job(job_id)
        if job.deleting:
            raise InvalidState(f"job {job_id} is being deleted; create it again instead")
        if job.unplaceable:
            raise InvalidState(f"job {job_id} was never placed ({job.reason}); "
                               "delete it and create one that fits")
        placed = [r for r in job.replicas.values()
                  if r.status in PLACED_STATUSES and r.status is not ReplicaStatus.DELETING]
        stuck = [r.index for r in placed if not self._restart_replica(job, r)]
        if len(stuck) < len(placed):
            job.restarting = True
            self.book.refresh(job, now, "restart asked")
        if stuck:
            job.reason = f"no free GPUs to create replica(s) {stuck} again; retry later"
            self.book.changed(job)
        self.book.commit()
        return job_view(job)

    def delete_job(self, job_id: str, now: float) -> JobView | None:
        """Delete the job: Deleting until its worker reports every replica
        DELETED, then gone. A job that holds nothing (Pending, or Failed before
        it was placed) is gone at once: returns None.

        Raises:
            NotFound: no such job.
        """
        job = self.book.job(job_id)
        if job.deleting:
            return job_view(job)
        for replica in list(job.replicas.values()):
            if replica.claimed:
                if replica.status is not ReplicaStatus.DELETING:
                    self._delete_replica(job, replica)
            else:
                # Never created, or already gone on its rack (reported DELETED).
                del job.replicas[replica.index]
        if not job.replicas:
            self.book.remove(job, now, "deleted")
            self.book.commit()
            return None
        job.deleting = True
        self.book.refresh(job, now, "delete asked")
        self.book.commit()
        return job_view(job)

    def restart_replica(self, job_id: str, replica: int, now: float) -> JobView:
        """Restart one replica of a Managed Inference Job while it is Queued,
        Pending or Starting (seeds/jobs.txt); one not yet placed has nothing to
        replace, so nothing happens to it.

        Raises:
            NotFound: no such job or replica.
            BadRequest: a GPU Container Job (restart the job).
            InvalidState: the replica or the job is in another status.
        """
        job, record = self._single_replica(job_id, replica, "restart")
        if record.status is ReplicaStatus.STARTING:
            self._restart_replica(job, record)
            self.book.refresh(job, now, f"replica {replica} restart asked")
            self.book.commit()
        return job_view(job)

    def delete_replica(self, job_id: str, replica: int, now: float) -> JobView:
        """Delete one replica of a Managed Inference Job while it is Queued,
        Pending or Starting; one not yet placed is gone at once.

        Raises:
            NotFound: no such job or replica.
            BadRequest: a GPU Container Job (delete the job).
            InvalidState: the replica or the job is in another status, or it
                is the job's last replica (delete the job).
        """
        job, record = self._single_replica(job_id, replica, "delete")
        live = [r for r in job.replicas.values() if r.status is not ReplicaStatus.DELETING]
        if len(live) <= 1:
            raise InvalidState(f"replica {replica} is job {job_id}'s last; delete the job")
        if record.claimed:
            self._delete_replica(job, record)
        else:
            del job.replicas[replica]
        self.book.refresh(job, now, f"replica {replica} delete asked")
        self.book.commit()
        return job_view(job)

    def _single_replica(self, job_id: str, replica: int, action: Literal["restart", "delete"]
                        ) -> tuple[JobRecord, ReplicaRecord]:
        job = self.book.job(job_id)
        if job.spec.type is JobType.CONTAINER:
            raise BadRequest(f"job {job_id} is a GPU Container Job with one replica; "
                             f"{action} the job instead")
        record = job.replicas.get(replica)
        if record is None:
            raise NotFound(f"job {job_id} has no replica {replica}")
        if job.deleting:
            raise InvalidState(f"job {job_id} is being deleted")
        if record.status not in SINGLE_REPLICA_ACTIONS:
            raise InvalidState(
                f"replica {replica} of job {job_id} is {record.status.value}; a single replica "
                f"can be {_PAST[action]} only while queued, pending or starting: "
                f"{action} the whole job instead")
        return job, record

    def _restart_replica(self, job: JobRecord, replica: ReplicaRecord) -> bool:
        """Queue the replica's restart (a new generation); False if it cannot be.

        A replica its worker removed on its own (reported DELETED unasked: no
        VMI, no storage, no claim) is created again where it was, if those
        GPUs are still free.
        """
        placement = replica.placement
        assert placement is not None
        gone = not replica.claimed
        if gone:
            try:
                self._capacity.claim([placement])
            except PlacementError:
                return False
            replica.claimed = True
        replica.status = next_replica_status(replica.status, ReplicaEvent.RESTART)
        replica.generation += 1
        if gone:
            self.book.queue(placement.rack, CreateReplica(
                op_id=op_id(job.id, replica.index, "create", replica.generation),
                job_id=job.id, replica=replica.index, spec=job.spec, placement=placement,
                generation=replica.generation))
        else:
            self.book.queue(placement.rack, RestartReplica(
                op_id=op_id(job.id, replica.index, "restart", replica.generation),
                job_id=job.id, replica=replica.index, generation=replica.generation))
        return True

    def _delete_replica(self, job: JobRecord, replica: ReplicaRecord) -> None:
        replica.status = next_replica_status(replica.status, ReplicaEvent.DELETE)
        assert replica.placement is not None
        self.book.queue(replica.placement.rack, DeleteReplica(
            op_id=op_id(job.id, replica.index, "delete", replica.generation),
            job_id=job.id, replica=replica.index))

    def status_counts(self) -> dict[str, int]:
        """Jobs per status (for the daemon's metrics)."""
        counts: dict[str, int] = {}
        for job in self.book.jobs.values():
            counts[job.status.value] = counts.get(job.status.value, 0) + 1
        return counts

    def get_job(self, job_id: str) -> JobView:
        """Raises: NotFound: no such job."""
        return job_view(self.book.job(job_id))

    def list_jobs(self, team: str | None = None) -> list[JobView]:
        """Every job (of ``team``), oldest first."""
        return [job_view(job) for job in self.book.jobs.values()
                if team is None or job.spec.team == team]

    def jobs_by_id(self, ids: Iterable[str], team: str | None = None) -> list[JobView]:
        """The jobs of ``ids`` that exist (and are ``team``'s), in the order asked."""
        found = (self.book.jobs.get(job_id) for job_id in dict.fromkeys(ids))
        return [job_view(job) for job in found
                if job is not None and (team is None or job.spec.team == team)]

    def page_jobs(self, team: str | None = None, *, after: tuple[float, str] | None = None,
                  limit: int) -> tuple[list[JobView], bool]:
        """Up to ``limit`` jobs (of ``team``) after ``after``, oldest first by
        (created_at, id); and whether more follow.

        A cursor of (created_at, id), not a position: it stays right while
        jobs are created and deleted between pages.
        """
        def key(job: JobRecord) -> tuple[float, str]:
            return (job.created_at, job.id)

        candidates = (job for job in self.book.jobs.values()
                      if (team is None or job.spec.team == team)
                      and (after is None or key(job) > after))
        page = heapq.nsmallest(limit + 1, candidates, key=key)
        return [job_view(job) for job in page[:limit]], len(page) > limit

    # -- shell keys -------------------------------------------------------------------

    def set_shell_keys(self, keys: ShellKeys) -> tuple[int, bool]:
        """Keep the team's shell keys if their version is above the one held.

        A changed set is queued as ``set_shell_keys`` to every rack holding the
        team's container jobs (the caller then publishes :meth:`outbox`); the
        same keys at a higher version only move the version.

        Returns:
            The version held now, and whether ``keys`` was taken.

        Raises:
            StoreError: it could not be saved (nothing changed in memory).
        """
        keys = keys.normalised()
        current = self.book.shell_keys.get(keys.team)
        if current is not None and keys.version <= current.version:
            return current.version, False
        racks = ([] if current is not None and current.keys == keys.keys
                 else self._team_racks(keys.team))
        self.book.set_shell_keys(keys, [Outbound(rack=rack, op=_shell_op(rack, keys))
                                        for rack in racks])
        return keys.version, True

    def shell_keys(self, team: str) -> ShellKeys | None:
        """The newest shell keys app-node sent for ``team``, or None."""
        return self.book.shell_keys.get(team)

    def _team_racks(self, team: str) -> list[str]:
        """Racks that hold (or are creating) the team's container jobs."""
        return sorted({r.placement.rack for job in self.book.jobs.values()
                       if job.spec.team == team and job.spec.type is JobType.CONTAINER
                       for r in job.replicas.values() if r.claimed and r.placement is not None})

    # -- placement --------------------------------------------------------------------

    def _place(self, job: JobRecord, now: float) -> bool:
        """Try to place every unplaced replica of a Queued or Pending job.

        Returns True if the job left Pending (placed, or failed for good).
        """
        waiting = [r for r in job.replicas.values() if r.status in
                   (ReplicaStatus.QUEUED, ReplicaStatus.PENDING)]
        spec = job.spec
        if len(waiting) != spec.replicas:
            spec = spec.model_copy(update={"replicas": len(waiting)})
        was_pending = job.status is JobStatus.PENDING
        placements, event, reason = self._decide(spec)
        if event is ReplicaEvent.PLACED:
            try:
                self._capacity.claim(placements)  # books them; cannot race here, checked anyway
            except NoCapacity as exc:
                placements, event, reason = (), ReplicaEvent.NO_CAPACITY, str(exc)
        if event is ReplicaEvent.NO_CAPACITY and was_pending:
            return False  # still waiting: no event, nothing written
        if was_pending:
            self.book.set_status(job, JobStatus.QUEUED, "capacity freed", now)
        if event is ReplicaEvent.PLACED:
            shell = (self.book.shell_keys.get(spec.team) if spec.type is JobType.CONTAINER
                     else None)
            if shell is not None:
                # Before the create: the worker renders the newest keys into the
                # agent's config (a repeat for a rack that has them: ignored).
                self.book.queue(placements[0].rack, _shell_op(placements[0].rack, shell))
            for replica, placement in zip(waiting, placements, strict=True):
                replica.status = next_replica_status(replica.status, event)
                replica.placement, replica.claimed = placement, True
                self.book.queue(placement.rack, CreateReplica(
                    op_id=op_id(job.id, replica.index, "create", replica.generation),
                    job_id=job.id, replica=replica.index, spec=job.spec,
                    placement=placement, generation=replica.generation))
            job.rack = placements[0].rack
            self.book.refresh(job, now, "")
        else:
            for replica in waiting:
                replica.status = next_replica_status(replica.status, event)
            job.unplaceable = event is ReplicaEvent.UNPLACEABLE
            self.book.refresh(job, now, reason)
        return True

    def _decide(self, spec: JobSpec
                ) -> tuple[tuple[ReplicaPlacement, ...], ReplicaEvent, str]:
        """Where ``spec``'s replicas would go now, claiming nothing: ``(placements,
        PLACED, "")``, or no placements with NO_CAPACITY or UNPLACEABLE and why."""
        try:
            return place(self._capacity, spec), ReplicaEvent.PLACED, ""
        except NoCapacity as exc:
            return (), ReplicaEvent.NO_CAPACITY, str(exc)
        except Unplaceable as exc:
            silent = self._unheard_racks(spec.location)
            if not silent:
                return (), ReplicaEvent.UNPLACEABLE, str(exc)
            # A rack whose capacity is not known yet (just registered, or
            # silent) may well hold it: wait for its report, do not fail.
            return (), ReplicaEvent.NO_CAPACITY, (
                f"waiting for rack {silent[0][:12]}… in location {spec.location} "
                f"to report its capacity ({exc})")

    def _unheard_racks(self, location: str) -> list[str]:
        """Racks of ``location`` that never reported their capacity, or went silent."""
        return sorted(rack.key for rack in self.book.racks.values()
                      if rack.location == location and (rack.report is None or rack.silent))

    def _place_pending(self, now: float) -> None:
        """Try the Pending jobs, oldest first, if capacity grew since the last try."""
        if not self._capacity_changed:
            return  # nothing freed: every Pending job would get NoCapacity again
        self._capacity_changed = False
        pending = sorted((job for job in self.book.jobs.values()
                          if job.status is JobStatus.PENDING),
                         key=lambda job: (job.created_at, job.seq))
        for job in pending:
            self._place(job, now)

    # -- racks and nodes ----------------------------------------------------------------

    def register_rack(self, rack: str, location: str, now: float, name: str | None = None
                      ) -> RackInfo:
        """Register a worker's rack under ``location``; again with the same
        location only updates its name.

        Raises:
            BadRequest: not a key or location, or registered under another location.
        """
        key = rack_key(rack)
        if not _LOCATION.match(location):
            raise BadRequest(f"location {location!r} must be letters, digits, '.', '_' or '-'")
        if name is not None and not (0 < len(name) <= 100):
            raise BadRequest("a rack name is 1 to 100 characters")
        old = self.book.racks.get(key)
        if old is not None:
            if old.location != location:
                raise BadRequest(f"rack {key[:12]} is registered under location "
                                 f"{old.location!r}; remove it first to move it")
            old.name = name if name is not None else old.name
        else:
            old = RackRecord(key=key, location=location, name=name, registered_at=now)
            self.book.add_rack(old)
            self._set_capacity(old)
            self._heard[key] = now
        self.book.rack_changed(key)
        self.book.commit()
        return self._rack_info(old)

    def remove_rack(self, rack: str) -> None:
        """Forget a rack, its reservations and its report position.

        Raises:
            NotFound: no such rack.
            InvalidState: jobs still have replicas on it (delete them first).
        """
        key = self.book.rack(rack).key
        holding = [job.id for job in self.book.jobs.values() if holds_gpus_on(job, key)]
        if holding:
            raise InvalidState(f"rack {key[:12]} still runs {len(holding)} job(s) "
                               f"({', '.join(holding[:3])}); delete them first")
        try:
            self._capacity.remove_rack(key)
        except PlacementError as exc:
            raise InvalidState(str(exc)) from exc
        self._heard.pop(key, None)
        self._reported_at.pop(key, None)
        self._capacity_changed = True  # Pending jobs of its location may never fit now
        self.book.remove_rack(key)

    def _rack_info(self, rack: RackRecord) -> RackInfo:
        capacity = next((view for view in self._capacity.racks() if view.rack == rack.key), None)
        return RackInfo(
            key=rack.key, location=rack.location, name=rack.name,
            registered_at=rack.registered_at, reported=rack.report is not None,
            silent=rack.silent,
            nodes=capacity.nodes if capacity else 0, gpus=capacity.gpus if capacity else 0,
            free=capacity.free if capacity else 0,
            overlay_network=capacity.overlay_network if capacity else False,
            jobs=sum(holds_gpus_on(job, rack.key) for job in self.book.jobs.values()),
            last_report_at=self._reported_at.get(rack.key))

    def racks(self) -> list[RackInfo]:
        """Every registered rack, in registration order."""
        return [self._rack_info(rack) for rack in self.book.racks.values()]

    def reserve_nodes(self, rack: str, nodes: Iterable[str], team: str) -> None:
        """Reserve nodes of a rack for ``team``: only its jobs run there, and
        its jobs only there. Replicas already there stay.

        Raises:
            NotFound: no such rack, or the rack reports no such node.
            BadRequest: not a team name.
            InvalidState: a node is reserved by another team (release it first).
        """
        key = self.book.rack(rack).key
        if not _TEAM.match(team):
            raise BadRequest(f"team {team!r} must be letters, digits, '.', '_' or '-'")
        nodes = list(nodes)
        listed = {node.name for node in (self.book.racks[key].report or RackReport(nodes=())).nodes}
        for node in nodes:
            if node not in listed:
                raise NotFound(f"rack {key[:12]} reports no node {node!r}")
        taken = {(view.rack, view.name): view.reserved_for for view in self._capacity.nodes()}
        for node in nodes:
            holder = taken.get((key, node))
            if holder not in (None, team):
                raise InvalidState(f"node {node} of rack {key[:12]} is reserved by team "
                                   f"{holder}; release it first")
        for node in nodes:
            self._capacity.reserve(key, node, team)
        self._capacity_changed = True  # tried at the next tick (events need a ``now``)
        self.book.reserve(key, nodes, team)

    def release_nodes(self, rack: str, nodes: Iterable[str]) -> None:
        """End the reservations of nodes of a rack (nodes without one are skipped).

        Raises:
            NotFound: no such rack.
        """
        key = self.book.rack(rack).key
        nodes = list(nodes)
        for node in nodes:
            self._capacity.release(key, node)
        self._capacity_changed = True  # tried at the next tick (events need a ``now``)
        self.book.release(key, nodes)

    def nodes(self) -> list[NodeView]:
        """Every node of every rack with its free GPUs and reservation."""
        return self._capacity.nodes()

    # -- reports and time ------------------------------------------------------------------

    def on_report(self, rack: str, report: ReplicaReport | RackUpdate, now: float, *,
                  position: int | None = None) -> None:
        """Apply a report read from ``rack``'s queue.

        Args:
            rack: the worker's key (hex) whose queue carried it; a report about
                a replica placed on another rack is refused.
            report: the decoded report.
            now: the time it was read.
            position: its position in that queue, saved with the change so the
                daemon resumes after it (:meth:`report_position`).

        Reports from unregistered racks, about unknown jobs or replicas, about
        an older generation, or that the replica's status cannot take, change
        nothing (counted in :meth:`statistics`).
        """
        key = rack_key(rack)
        if key not in self.book.racks:
            self._stats["reports_unknown"] += 1
            return
        self._hear(key, now)
        if isinstance(report, RackUpdate):
            record = self.book.racks[key]
            if report.rack != record.report:  # most are the periodic "still here"
                record.report = report.rack
                self._set_capacity(record)
                self.book.rack_changed(key)
            self._stats["reports_applied"] += 1
            self._place_pending(now)
        else:
            self._apply_replica_report(key, report, now)
        self.book.commit(position=(key, position) if position is not None else None)

    def _apply_replica_report(self, rack: str, report: ReplicaReport, now: float) -> None:
        job = self.book.jobs.get(report.job_id)
        replica = None if job is None else job.replicas.get(report.replica)
        if job is None or replica is None:
            self._stats["reports_unknown"] += 1
            return
        if replica.placement is None or replica.placement.rack != rack or not replica.claimed:
            # Not placed, placed elsewhere, or already gone (reported DELETED).
            self._stats["reports_refused"] += 1
            return
        if report.generation != replica.generation:
            self._stats["reports_stale"] += 1
            return
        event = reported(report.state)
        try:
            status = next_replica_status(replica.status, event)
        except InvalidState:
            self._stats["reports_refused"] += 1
            return
        self._stats["reports_applied"] += 1
        replica.status = status
        if report.message:
            replica.message = report.message
        replica.agents = report.agents
        if report.gateway is not None:
            replica.gateway = report.gateway
        freed = False
        if event is ReplicaEvent.REPORTED_DELETED:
            self._capacity.unclaim([replica.placement])
            self._capacity_changed = True
            replica.claimed, freed = False, True
        if status is ReplicaStatus.DELETED:
            del job.replicas[replica.index]
        if not job.replicas:
            self.book.remove(job, now, "deleted")
        else:
            reason = (report.message
                      if status in (ReplicaStatus.FAILED, ReplicaStatus.UNKNOWN) else "")
            self.book.refresh(job, now, reason)
        if freed:
            self._place_pending(now)

    def report_position(self, rack: str) -> int | None:
        """The queue position of the last report applied from ``rack``, if any."""
        return self.book.report_position(rack)

    def tick(self, now: float) -> None:
        """Mark silent racks' jobs Unknown and place Pending jobs that now fit."""
        for key, rack in self.book.racks.items():
            heard = self._heard.setdefault(key, now)
            if not rack.silent and now - heard >= self.unknown_after_s:
                rack.silent = True
                self.book.rack_changed(key)
                self._set_capacity(rack)
                for job in self.book.jobs.values():
                    if holds_gpus_on(job, key):
                        self.book.refresh(job, now, f"no report from rack {key[:12]} for "
                                                    f"{now - heard:.0f} s")
        self._place_pending(now)
        self.book.commit()

    def next_deadline(self) -> float | None:
        """When the next rack goes silent if it stays quiet (None: no rack can)."""
        times = [self._heard[k] + self.unknown_after_s for k, rack in self.book.racks.items()
                 if k in self._heard and not rack.silent]
        return min(times, default=None)

    def last_report_at(self) -> float | None:
        """When a rack last reported since wrk-ork opened, or None (for health)."""
        return self._last_report_at

    def _hear(self, key: str, now: float) -> None:
        self._heard[key] = now
        self._reported_at[key] = now
        self._last_report_at = now
        rack = self.book.racks[key]
        if rack.silent:
            rack.silent = False
            self.book.rack_changed(key)
            self._set_capacity(rack)
            for job in self.book.jobs.values():
                if holds_gpus_on(job, key):
                    self.book.refresh(job, now, "")
            self._place_pending(now)
