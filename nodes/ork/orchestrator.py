"""wrk-ork's core: jobs, their replicas and racks, driven by calls, reports and time.

Theory of operation
-------------------
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

Statuses follow :mod:`nodes.ork.status`: a replica's status changes only by its
table, and a job's status is derived from its replicas after every change;
each job status change is checked against ``JOB_TRANSITIONS`` and sent as a
:class:`JobEvent`.

GPUs are claimed in :class:`~nodes.ork.placement.Cluster` when a replica is
placed and released only when its worker reports it DELETED, not when the
delete is asked: a Pending job is placed only when the GPUs really are free.
Pending jobs are tried oldest first whenever GPUs are freed, a rack reports
and on every tick; a younger job that fits may pass an older one that does
not (so a large job can wait behind a stream of small ones: not solved here).

A rack is *silent* once it has sent nothing (reports of any kind; the worker
sends a rack report periodically) for ``unknown_after_s``; every job with
replicas there is Unknown until the rack is heard again. After wrk-ork starts,
every rack gets a full ``unknown_after_s`` from the first tick.

Persistence: every public call that changes something writes it in one
SQLite transaction (:mod:`nodes.ork.store`) before returning. If that write
fails, the call raises :class:`~nodes.ork.errors.StoreError` and the memory is
ahead of the file: the daemon must stop and reopen (it reloads the file).
"""

from __future__ import annotations

import re
import secrets
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from nodes.control import CreateReplica, DeleteReplica, RackUpdate, ReplicaReport, RestartReplica
from nodes.model import (
    JobSpec,
    JobStatus,
    JobType,
    NodeInfo,
    RackReport,
    _key_hex,
)

from .errors import BadRequest, InvalidState, NotFound, StoreError
from .placement import Cluster, NoCapacity, NodeView, PlacementError, Unplaceable
from .status import (
    JOB_TRANSITIONS,
    PLACED_STATUSES,
    SINGLE_REPLICA_ACTIONS,
    JobFlags,
    ReplicaEvent,
    ReplicaStatus,
    derive_job_status,
    next_replica_status,
    reported,
    restart_done,
)
from .store import JobRecord, Outbound, RackRecord, ReplicaRecord, Store
from .views import JobEvent, JobView, RackInfo, ReplicaView

__all__ = [
    "MAX_EVENTS",
    "JobEvent",
    "JobView",
    "Orchestrator",
    "OrchestratorStatistics",
    "Outbound",
    "RackInfo",
    "ReplicaView",
    "op_id",
]

#: Events kept for ``drain_events`` between drains; beyond it the oldest are
#: dropped and counted (a watcher then re-reads the jobs).
MAX_EVENTS = 10_000

_LOCATION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


@dataclass(frozen=True, slots=True)
class OrchestratorStatistics:
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


def op_id(job_id: str, replica: int, kind: Literal["create", "restart", "delete"],
          generation: int) -> str:
    """The operation's id: the same for the same (job, replica, kind, generation)."""
    return f"{job_id}/{replica}/{kind}/{generation}"


def _new_job_id() -> str:
    return "j-" + secrets.token_hex(8)


def _roomy(rack: str, report: RackReport, claimed: dict[tuple[str, str], int]) -> RackReport:
    """``report`` with every node claimed on schedulable and holding its claims
    (nodes only the claims know of added): lets reloaded claims be booked."""
    nodes = []
    for node in report.nodes:
        need = claimed.get((rack, node.name))
        if need is not None:
            node = node.model_copy(update={"gpus": max(node.gpus, need), "schedulable": True})
        nodes.append(node)
    listed = {node.name for node in report.nodes}
    nodes += [NodeInfo(name=name, gpus=gpus, infiniband=True)
              for (key, name), gpus in sorted(claimed.items())
              if key == rack and name not in listed]
    return RackReport(nodes=tuple(nodes), overlay_network=report.overlay_network)


class Orchestrator:
    """The job status machine, racks and placement, persisted in its own store.

    Use :meth:`open`. Not thread-safe: one task drives it.
    """

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
        self._positions: dict[str, int] = {}
        self._events: deque[JobEvent] = deque()
        self._seq = 0
        # What the current call changed, written by _commit.
        self._dirty: set[str] = set()
        self._removed: set[str] = set()
        self._ops: list[Outbound] = []
        self._racks_dirty: set[str] = set()
        self._stats = dict(reports_applied=0, reports_unknown=0, reports_stale=0,
                           reports_refused=0, unexpected_transitions=0, events_dropped=0)

    # -- opening ------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | None, *, unknown_after_s: float = 60.0,
             new_job_id: Callable[[], str] = _new_job_id) -> Orchestrator:
        """Open the store at ``path`` (None: in memory) and reload everything from it.

        Raises:
            StoreError: the store cannot be read, or its claims no longer fit
                the racks it records.
        """
        store = Store.open(path)
        try:
            orch = cls(store, Cluster(), unknown_after_s=unknown_after_s,
                       new_job_id=new_job_id)
            orch._load()
        except BaseException:
            store.close()
            raise
        return orch

    def _load(self) -> None:
        """Rebuild memory and the cluster's claims from the store.

        Claims were made on earlier reports: a node may have been cordoned or
        left the report since. ``Cluster.claim`` checks a node is schedulable
        and has the GPUs free, so the racks are first set from a report where
        every claimed node is schedulable and large enough, the claims booked,
        and then the real last report set (which keeps claims, turning nodes
        gone from it into ghosts until they are released).
        """
        cluster = self._cluster
        for rack in self._store.load_racks():
            self._racks[rack.key] = rack
        claimed: dict[tuple[str, str], int] = {}
        for job in self._store.load_jobs():
            self._jobs[job.id] = job
            self._seq = max(self._seq, job.seq)
            for replica in job.replicas.values():
                if replica.claimed and replica.placement is not None:
                    for share in replica.placement.shares:
                        where = (replica.placement.rack, share.node)
                        claimed[where] = claimed.get(where, 0) + share.gpus
        for rack in self._racks.values():
            report = rack.report or RackReport(nodes=())
            cluster.set_rack(rack.key, rack.location, _roomy(rack.key, report, claimed))
        try:
            for job in self._jobs.values():
                claims = [r.placement for r in job.replicas.values()
                          if r.claimed and r.placement is not None]
                if claims:
                    cluster.claim(claims)
        except PlacementError as exc:
            raise StoreError(f"job {job.id}'s claimed GPUs are on a rack that is no longer "
                             f"registered ({exc}); restore a backup of the store") from exc
        for rack in self._racks.values():
            cluster.set_rack(rack.key, rack.location, rack.report or RackReport(nodes=()))
        for rack_key, node, team in self._store.load_reservations():
            try:
                cluster.reserve(rack_key, node, team)
            except PlacementError:
                # A node gone from its rack's last report: the reservation row
                # stays and applies again when wrk-ork next starts with it listed.
                pass
        self._positions = self._store.positions()

    def close(self) -> None:
        self._store.close()

    # -- jobs ---------------------------------------------------------------------------

    def create_job(self, spec: JobSpec, now: float) -> JobView:
        """Create a job: Creating, Queued, then Starting (GPUs claimed, its
        CreateReplica operations in the outbox), Pending (no free GPUs now) or
        Failed (it can never fit; ``reason`` says why).

        The caller then publishes :meth:`outbox` and sends :meth:`drain_events`.
        """
        job_id = self._new_job_id()
        while job_id in self._jobs:
            job_id = self._new_job_id()
        self._seq += 1
        job = JobRecord(id=job_id, seq=self._seq, spec=spec, status=JobStatus.CREATING,
                        reason="", created_at=now, updated_at=now,
                        replicas={i: ReplicaRecord(index=i, status=ReplicaStatus.QUEUED)
                                  for i in range(spec.replicas)})
        self._jobs[job_id] = job
        self._emit(job, None, now)
        self._refresh(job, now)  # Creating -> Queued: the spec was validated on the way in
        self._place(job, now)
        self._commit()
        return self._view(job)

    def restart_job(self, job_id: str, now: float) -> JobView:
        """Replace every replica's VMIs, keeping storage: Restarting until all are Active.

        A Pending job has nothing to replace: nothing happens.

        Raises:
            NotFound: no such job.
            InvalidState: it is being deleted, or it never fitted (delete it).
        """
        job = self._job(job_id)
        if job.deleting:
            raise InvalidState(f"job {job_id} is being deleted; create it again instead")
        if job.unplaceable:
            raise InvalidState(f"job {job_id} was never placed ({job.reason}); "
                               "delete it and create one that fits")
        placed = [r for r in job.replicas.values()
                  if r.status in PLACED_STATUSES and r.status is not ReplicaStatus.DELETING]
        if placed:
            for replica in placed:
                self._restart_replica(job, replica)
            job.restarting = True
            self._refresh(job, now, "restart asked")
            self._commit()
        return self._view(job)

    def delete_job(self, job_id: str, now: float) -> JobView | None:
        """Delete the job: Deleting until its worker reports every replica
        DELETED, then gone. A job that holds nothing (Pending, or Failed before
        it was placed) is gone at once: returns None.

        Raises:
            NotFound: no such job.
        """
        job = self._job(job_id)
        if job.deleting:
            return self._view(job)
        for replica in list(job.replicas.values()):
            if replica.claimed:
                if replica.status is not ReplicaStatus.DELETING:
                    self._delete_replica(job, replica)
            else:
                # Never created, or already gone on its rack (reported DELETED).
                del job.replicas[replica.index]
        if not job.replicas:
            self._remove(job, now, "deleted")
            self._commit()
            return None
        job.deleting = True
        self._refresh(job, now, "delete asked")
        self._commit()
        return self._view(job)

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
            self._refresh(job, now, f"replica {replica} restart asked")
            self._commit()
        return self._view(job)

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
        self._refresh(job, now, f"replica {replica} delete asked")
        self._commit()
        return self._view(job)

    def _single_replica(self, job_id: str, replica: int, action: str
                        ) -> tuple[JobRecord, ReplicaRecord]:
        job = self._job(job_id)
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
                f"can be {action}ed only while queued, pending or starting: "
                f"{action} the whole job instead")
        return job, record

    def _restart_replica(self, job: JobRecord, replica: ReplicaRecord) -> None:
        replica.status = next_replica_status(replica.status, ReplicaEvent.RESTART)
        replica.generation += 1
        assert replica.placement is not None
        self._queue(replica.placement.rack, RestartReplica(
            op_id=op_id(job.id, replica.index, "restart", replica.generation),
            job_id=job.id, replica=replica.index, generation=replica.generation))

    def _delete_replica(self, job: JobRecord, replica: ReplicaRecord) -> None:
        replica.status = next_replica_status(replica.status, ReplicaEvent.DELETE)
        assert replica.placement is not None
        self._queue(replica.placement.rack, DeleteReplica(
            op_id=op_id(job.id, replica.index, "delete", replica.generation),
            job_id=job.id, replica=replica.index))

    def get_job(self, job_id: str) -> JobView:
        """Raises: NotFound: no such job."""
        return self._view(self._job(job_id))

    def list_jobs(self, team: str | None = None) -> list[JobView]:
        """Every job (of ``team``), oldest first."""
        return [self._view(job) for job in self._jobs.values()
                if team is None or job.spec.team == team]

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
        try:
            placements = self._cluster.place(spec)
            self._cluster.claim(placements)  # books them; cannot race here, checked anyway
            event = ReplicaEvent.PLACED
        except NoCapacity as exc:
            placements, event, reason = (), ReplicaEvent.NO_CAPACITY, str(exc)
        except Unplaceable as exc:
            placements, event, reason = (), ReplicaEvent.UNPLACEABLE, str(exc)
        if event is ReplicaEvent.NO_CAPACITY and was_pending:
            return False  # still waiting: no event, nothing written
        if was_pending:
            self._set_status(job, JobStatus.QUEUED, "capacity freed", now)
        if event is ReplicaEvent.PLACED:
            for replica, placement in zip(waiting, placements, strict=True):
                replica.status = next_replica_status(replica.status, event)
                replica.placement, replica.claimed = placement, True
                self._queue(placement.rack, CreateReplica(
                    op_id=op_id(job.id, replica.index, "create", replica.generation),
                    job_id=job.id, replica=replica.index, spec=job.spec,
                    placement=placement, generation=replica.generation))
            job.rack = placements[0].rack
            self._refresh(job, now, "")
        else:
            for replica in waiting:
                replica.status = next_replica_status(replica.status, event)
            job.unplaceable = event is ReplicaEvent.UNPLACEABLE
            self._refresh(job, now, reason)
        return True

    def _place_pending(self, now: float) -> None:
        pending = sorted((job for job in self._jobs.values() if job.status is JobStatus.PENDING),
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
        key = self._key(rack)
        if not _LOCATION.match(location):
            raise BadRequest(f"location {location!r} must be letters, digits, '.', '_' or '-'")
        if name is not None and not (0 < len(name) <= 100):
            raise BadRequest("a rack name is 1 to 100 characters")
        old = self._racks.get(key)
        if old is not None:
            if old.location != location:
                raise BadRequest(f"rack {key[:12]} is registered under location "
                                 f"{old.location!r}; remove it first to move it")
            old.name = name if name is not None else old.name
        else:
            old = self._racks[key] = RackRecord(key=key, location=location, name=name,
                                                registered_at=now)
            self._cluster.set_rack(key, location, RackReport(nodes=()))
            self._heard[key] = now
        self._racks_dirty.add(key)
        self._commit()
        return self._rack_info(old)

    def remove_rack(self, rack: str) -> None:
        """Forget a rack, its reservations and its report position.

        Raises:
            NotFound: no such rack.
            InvalidState: jobs still have replicas on it (delete them first).
        """
        key = self._rack(rack).key
        holding = [job.id for job in self._jobs.values() if self._on_rack(job, key)]
        if holding:
            raise InvalidState(f"rack {key[:12]} still runs {len(holding)} job(s) "
                               f"({', '.join(holding[:3])}); delete them first")
        try:
            self._cluster.remove_rack(key)
        except PlacementError as exc:
            raise InvalidState(str(exc)) from exc
        del self._racks[key]
        self._heard.pop(key, None)
        self._positions.pop(key, None)
        try:
            with self._store.transaction():
                self._store.delete_rack(key)
        except Exception as exc:
            raise StoreError(f"could not save the rack's removal: {exc}") from exc

    def racks(self) -> list[RackInfo]:
        """Every registered rack, in registration order."""
        return [self._rack_info(rack) for rack in self._racks.values()]

    def reserve_nodes(self, rack: str, nodes: Iterable[str], team: str) -> None:
        """Reserve nodes of a rack for ``team``: only its jobs run there, and
        its jobs only there. Replicas already there stay.

        Raises:
            NotFound: no such rack, or the rack reports no such node.
            BadRequest: not a team name.
            InvalidState: a node is reserved by another team (release it first).
        """
        key = self._rack(rack).key
        if not _TEAM.match(team):
            raise BadRequest(f"team {team!r} must be letters, digits, '.', '_' or '-'")
        nodes = list(nodes)
        listed = {node.name for node in (self._racks[key].report or RackReport(nodes=())).nodes}
        for node in nodes:
            if node not in listed:
                raise NotFound(f"rack {key[:12]} reports no node {node!r}")
        taken = {(view.rack, view.name): view.reserved_for for view in self._cluster.nodes()}
        for node in nodes:
            holder = taken.get((key, node))
            if holder not in (None, team):
                raise InvalidState(f"node {node} of rack {key[:12]} is reserved by team "
                                   f"{holder}; release it first")
        for node in nodes:
            self._cluster.reserve(key, node, team)
        self._place_pending_after(lambda: [self._store.save_reservation(key, node, team)
                                           for node in nodes])

    def release_nodes(self, rack: str, nodes: Iterable[str]) -> None:
        """End the reservations of nodes of a rack (nodes without one are skipped).

        Raises:
            NotFound: no such rack.
        """
        key = self._rack(rack).key
        nodes = list(nodes)
        for node in nodes:
            self._cluster.release(key, node)
        self._place_pending_after(lambda: [self._store.delete_reservation(key, node)
                                           for node in nodes])

    def _place_pending_after(self, write: Callable[[], object]) -> None:
        # Reservations change what fits; Pending jobs are tried at the next tick
        # (they need a ``now`` for their events).
        try:
            with self._store.transaction():
                write()
        except Exception as exc:
            raise StoreError(f"could not save the reservation: {exc}") from exc

    def nodes(self) -> list[NodeView]:
        """Every node of every rack with its free GPUs and reservation."""
        return self._cluster.nodes()

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
        key = self._key(rack)
        if key not in self._racks:
            self._stats["reports_unknown"] += 1
            return
        self._hear(key, now)
        if isinstance(report, RackUpdate):
            record = self._racks[key]
            record.report = report.rack
            self._cluster.set_rack(key, record.location, report.rack)
            self._racks_dirty.add(key)
            self._stats["reports_applied"] += 1
            self._place_pending(now)
        else:
            self._apply_replica_report(key, report, now)
        if position is not None:
            self._positions[key] = position
        self._commit(position=(key, position) if position is not None else None)

    def _apply_replica_report(self, rack: str, report: ReplicaReport, now: float) -> None:
        job = self._jobs.get(report.job_id)
        replica = None if job is None else job.replicas.get(report.replica)
        if job is None or replica is None:
            self._stats["reports_unknown"] += 1
            return
        if replica.placement is None or replica.placement.rack != rack:
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
        freed = False
        if event is ReplicaEvent.REPORTED_DELETED and replica.claimed:
            assert replica.placement is not None
            self._cluster.unclaim([replica.placement])
            replica.claimed, freed = False, True
        if status is ReplicaStatus.DELETED:
            del job.replicas[replica.index]
        if not job.replicas:
            self._remove(job, now, "deleted")
        else:
            reason = report.message if status is ReplicaStatus.FAILED else ""
            self._refresh(job, now, reason)
        if freed:
            self._place_pending(now)

    def report_position(self, rack: str) -> int | None:
        """The queue position of the last report applied from ``rack``, if any."""
        return self._positions.get(rack)

    def tick(self, now: float) -> None:
        """Mark silent racks' jobs Unknown and place Pending jobs that now fit."""
        for key, rack in self._racks.items():
            heard = self._heard.setdefault(key, now)
            if not rack.silent and now - heard >= self.unknown_after_s:
                rack.silent = True
                self._racks_dirty.add(key)
                for job in self._jobs.values():
                    if self._on_rack(job, key):
                        self._refresh(job, now, f"no report from rack {key[:12]} for "
                                                f"{now - heard:.0f} s")
        self._place_pending(now)
        self._commit()

    def next_deadline(self) -> float | None:
        """When the next rack goes silent if it stays quiet (None: no rack can)."""
        times = [self._heard[k] + self.unknown_after_s for k, rack in self._racks.items()
                 if k in self._heard and not rack.silent]
        return min(times, default=None)

    def _hear(self, key: str, now: float) -> None:
        self._heard[key] = now
        rack = self._racks[key]
        if rack.silent:
            rack.silent = False
            self._racks_dirty.add(key)
            for job in self._jobs.values():
                if self._on_rack(job, key):
                    self._refresh(job, now, "")

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
            outbox=len(self._store.outbox()), **self._stats)

    # -- internals ----------------------------------------------------------------------

    def _job(self, job_id: str) -> JobRecord:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}; list the jobs to see their ids")
        return job

    def _key(self, rack: str) -> str:
        try:
            return _key_hex(rack)
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
        return any(r.placement is not None and r.placement.rack == key and
                   (r.claimed or r.status in PLACED_STATUSES)
                   for r in job.replicas.values())

    def _flags(self, job: JobRecord) -> JobFlags:
        silent = any(r.placement is not None and r.placement.rack in self._racks
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
                                       placement=r.placement, message=r.message)
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
            jobs=sum(self._on_rack(job, rack.key) for job in self._jobs.values()))
