"""The bookkeeping under :class:`~nodes.ork.orchestrator.Orchestrator`.

:class:`JobBook` holds the records (jobs, replicas, racks), the cluster's
claims, the events not yet drained and what the current call changed; every
public call of the orchestrator ends in :meth:`JobBook._commit`, which writes
those changes in one transaction of the store. A job's status is only ever
changed by :meth:`JobBook._refresh` (derived from its replicas by
:func:`~nodes.ork.status.derive_job_status`), and each change is checked
against ``JOB_TRANSITIONS`` and queued as a :class:`~contracts.ork.JobEvent`.
See the orchestrator's module for the theory of operation.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from contracts.model import JobStatus, RackReport, key_hex
from contracts.operations import CreateReplica, DeleteReplica, RestartReplica
from contracts.ork import JobEvent, JobView, RackInfo, ReplicaView

from .errors import BadRequest, NotFound, StoreError
from .placement import Cluster, PlacementError
from .status import (
    JOB_TRANSITIONS,
    JobFlags,
    derive_job_status,
    restart_done,
)
from .store import JobRecord, Outbound, RackRecord, Store

__all__ = ["MAX_EVENTS", "JobBook", "OrchestratorStatistics"]

#: Events kept for ``drain_events`` between drains; beyond it the oldest are
#: dropped and counted (a watcher then re-reads the jobs).
MAX_EVENTS = 10_000


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


class JobBook:
    """Records, claims, events and the per-call transaction (see the module doc)."""

    def __init__(self, store: Store, cluster: Cluster, *, unknown_after_s: float,
                 new_job_id: Callable[[], str] = _new_job_id) -> None:
        if unknown_after_s <= 0:
            raise ValueError("unknown_after_s must be positive")
        self._store = store
        self._cluster = cluster
        self.unknown_after_s = unknown_after_s
        self._new_job_id = new_job_id
        self._jobs: dict[str, JobRecord] = {}
        self._racks: dict[str, RackRecord] = {}
        #: Per rack, when we last heard from it (set at registration, on any
        #: report, and for every rack at the first tick after opening).
        self._heard: dict[str, float] = {}
        #: When each rack last reported since opening (unlike ``_heard``, never
        #: seeded): what the control-plane health shows of each worker.
        self._reported_at: dict[str, float] = {}
        #: When the newest report came from any rack since opening (None: none yet).
        self._last_report_at: float | None = None
        self._positions: dict[str, int] = {}
        self._events: deque[JobEvent] = deque()
        self._seq = 0
        #: Capacity may have grown (GPUs freed, a report, a reservation changed)
        #: since Pending jobs were last tried.
        self._capacity_changed = True
        # What the current call changed, written by _commit.
        self._dirty: set[str] = set()
        self._removed: set[str] = set()
        self._ops: list[Outbound] = []
        self._racks_dirty: set[str] = set()
        self._stats = dict(reports_applied=0, reports_unknown=0, reports_stale=0,
                           reports_refused=0, unexpected_transitions=0, events_dropped=0)

    def _load(self) -> None:
        """Rebuild memory and the cluster's claims from the store.

        Claims are restored without the checks of a new placement
        (``Cluster.restore``): the replicas run, even on a node cordoned or gone
        from the report since.
        """
        cluster = self._cluster
        for rack in self._store.load_racks():
            self._racks[rack.key] = rack
            self._set_capacity(rack)
        for rack_key, node, team in self._store.load_reservations():
            # Kept even for a node missing from the last report (Cluster.reserve
            # allows it), so the team stays on its own nodes when it is back.
            cluster.reserve(rack_key, node, team)
        for job in self._store.load_jobs():
            self._jobs[job.id] = job
            self._seq = max(self._seq, job.seq)
            claims = [r.placement for r in job.replicas.values()
                      if r.claimed and r.placement is not None]
            try:
                cluster.restore(claims)
            except PlacementError as exc:
                raise StoreError(f"job {job.id}'s claimed GPUs are on a rack that is no "
                                 f"longer registered ({exc}); restore a backup of the "
                                 "store") from exc
        self._positions = self._store.positions()

    def close(self) -> None:
        self._store.close()

    def _set_capacity(self, rack: RackRecord) -> None:
        """Give the cluster the rack's last report; a silent rack's nodes take
        nothing new (its worker may be gone), so new jobs wait Pending rather
        than being sent to it. Claims are kept either way."""
        report = rack.report or RackReport(nodes=())
        if rack.silent:
            report = report.model_copy(update={"nodes": tuple(
                node.model_copy(update={"schedulable": False}) for node in report.nodes)})
        self._cluster.set_rack(rack.key, rack.location, report)
        self._capacity_changed = True

    # -- outbox and events ---------------------------------------------------------------

    def outbox(self) -> list[Outbound]:
        """Operations not yet published, in the order they were made."""
        return self._store.outbox()

    def mark_published(self, op_ids: Iterable[str]) -> None:
        """The daemon published these durably on their racks' queues."""
        try:
            with self._store.transaction():
                self._store.remove_outbound(op_ids)
        except Exception as exc:
            raise StoreError(f"could not save the published operations: {exc}") from exc

    def drain_events(self) -> list[JobEvent]:
        """Status changes since the last drain, oldest first."""
        events = list(self._events)
        self._events.clear()
        return events

    def statistics(self) -> OrchestratorStatistics:
        return OrchestratorStatistics(
            jobs=len(self._jobs),
            pending_jobs=sum(job.status is JobStatus.PENDING for job in self._jobs.values()),
            outbox=self._store.outbox_size(), **self._stats)

    # -- internals ----------------------------------------------------------------------

    def _job(self, job_id: str) -> JobRecord:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}; list the jobs to see their ids")
        return job

    def _key(self, rack: str) -> str:
        try:
            return key_hex(rack)
        except (ValueError, AttributeError):
            raise BadRequest(f"rack {str(rack)[:16]!r} is not a worker key "
                             "(64 hex characters)") from None

    def _rack(self, rack: str) -> RackRecord:
        record = self._racks.get(self._key(rack))
        if record is None:
            raise NotFound(f"no rack {rack[:12]} is registered; list the racks to see them")
        return record

    @staticmethod
    def _on_rack(job: JobRecord, key: str) -> bool:
        """The job holds GPUs on rack ``key`` (a replica placed there and not yet
        reported DELETED)."""
        return any(r.claimed and r.placement is not None and r.placement.rack == key
                   for r in job.replicas.values())

    def _flags(self, job: JobRecord) -> JobFlags:
        silent = any(r.claimed and r.placement is not None and r.placement.rack in self._racks
                     and self._racks[r.placement.rack].silent for r in job.replicas.values())
        return JobFlags(deleting=job.deleting, restarting=job.restarting,
                        unplaceable=job.unplaceable, rack_silent=silent)

    def _refresh(self, job: JobRecord, now: float, reason: str = "") -> None:
        """Derive the job's status again; send an event when it changed."""
        statuses = [r.status for r in job.replicas.values()]
        if job.restarting and restart_done(statuses):
            job.restarting = False
        self._dirty.add(job.id)
        status = derive_job_status(statuses, self._flags(job))
        if status is not job.status:
            self._set_status(job, status, reason, now)

    def _set_status(self, job: JobRecord, status: JobStatus, reason: str, now: float) -> None:
        previous = job.status
        if (previous, status) not in JOB_TRANSITIONS:
            self._stats["unexpected_transitions"] += 1
        job.status, job.reason, job.updated_at = status, reason, now
        self._dirty.add(job.id)
        self._emit(job, previous, now)

    def _remove(self, job: JobRecord, now: float, reason: str) -> None:
        previous = job.status
        if (previous, None) not in JOB_TRANSITIONS:
            self._stats["unexpected_transitions"] += 1
        del self._jobs[job.id]
        self._dirty.discard(job.id)
        self._removed.add(job.id)
        self._push(JobEvent(job_id=job.id, team=job.spec.team, status=None, previous=previous,
                            reason=reason, at=now))

    def _emit(self, job: JobRecord, previous: JobStatus | None, now: float) -> None:
        self._push(JobEvent(job_id=job.id, team=job.spec.team, status=job.status,
                            previous=previous, reason=job.reason, at=now))

    def _push(self, event: JobEvent) -> None:
        if len(self._events) >= MAX_EVENTS:
            self._events.popleft()
            self._stats["events_dropped"] += 1
        self._events.append(event)

    def _queue(self, rack: str, op: CreateReplica | RestartReplica | DeleteReplica) -> None:
        self._ops.append(Outbound(rack=rack, op=op))

    def _commit(self, *, position: tuple[str, int] | None = None) -> None:
        """Write what this call changed in one transaction."""
        dirty, removed, ops, racks = self._dirty, self._removed, self._ops, self._racks_dirty
        self._dirty, self._removed, self._ops, self._racks_dirty = set(), set(), [], set()
        if not (dirty or removed or ops or racks or position):
            return
        try:
            with self._store.transaction():
                for job_id in removed:
                    self._store.delete_job(job_id)
                for job_id in dirty:
                    self._store.save_job(self._jobs[job_id])
                for key in racks:
                    if key in self._racks:
                        self._store.save_rack(self._racks[key])
                for outbound in ops:
                    self._store.add_outbound(outbound)
                if position is not None:
                    self._store.set_position(*position)
        except Exception as exc:
            raise StoreError(f"could not save wrk-ork's state: {exc}; "
                             "restart wrk-ork (it reloads its last saved state)") from exc

    def _view(self, job: JobRecord) -> JobView:
        return JobView(
            id=job.id, spec=job.spec, status=job.status, reason=job.reason,
            created_at=job.created_at, updated_at=job.updated_at, rack=job.rack,
            replicas=tuple(ReplicaView(index=r.index, status=r.status, generation=r.generation,
                                       placement=r.placement, message=r.message,
                                       agents=r.agents)
                           for r in sorted(job.replicas.values(), key=lambda r: r.index)))

    def _rack_info(self, rack: RackRecord) -> RackInfo:
        capacity = next((view for view in self._cluster.racks() if view.rack == rack.key), None)
        return RackInfo(
            key=rack.key, location=rack.location, name=rack.name,
            registered_at=rack.registered_at, reported=rack.report is not None,
            silent=rack.silent,
            nodes=capacity.nodes if capacity else 0, gpus=capacity.gpus if capacity else 0,
            free=capacity.free if capacity else 0,
            overlay_network=capacity.overlay_network if capacity else False,
            jobs=sum(self._on_rack(job, rack.key) for job in self._jobs.values()),
            last_report_at=self._reported_at.get(rack.key))
