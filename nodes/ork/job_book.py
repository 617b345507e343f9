"""wrk-ork's job book: the records the orchestrator decides about, kept in its store.

Theory of operation
-------------------
:class:`JobBook` holds in memory what :mod:`nodes.ork.store` keeps on disk:
the jobs with their replicas, the racks, each rack's last applied report
position and each team's newest shell keys. The orchestrator reads and
changes the records in place and tells the book what it changed
(:meth:`~JobBook.changed`, :meth:`~JobBook.rack_changed`,
:meth:`~JobBook.queue`); every public call of the orchestrator ends in
:meth:`~JobBook.commit`, which writes those changes, with the operations they
queued, in one transaction of the store (the transactional outbox).

A job's status is only ever changed here, by :meth:`~JobBook.refresh`
(derived from its replicas by :func:`~nodes.ork.status.derive_job_status`),
:meth:`~JobBook.set_status` or :meth:`~JobBook.remove`; each change is checked
against ``JOB_TRANSITIONS`` and queued as a :class:`~contracts.ork.JobEvent`
for :meth:`~JobBook.drain_events`.

The book decides nothing: where jobs go, when they restart and what a report
means is :class:`~nodes.ork.orchestrator.Orchestrator`'s, and the GPUs
claimed are its :class:`~nodes.ork.capacity.Capacity`'s. If a write fails the
call raises :class:`~nodes.ork.errors.StoreError` and the memory is ahead of
the file: the daemon must stop and reopen (the book reloads the file).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from contracts.model import JobSpec, JobStatus, key_hex
from contracts.operations import CreateReplica, DeleteReplica, RestartReplica, SetShellKeys
from contracts.ork import JobEvent, JobView, ReplicaStatus, ReplicaView
from contracts.shell_access import ShellKeys

from .errors import BadRequest, NotFound, StoreError
from .status import JOB_TRANSITIONS, JobFlags, derive_job_status, restart_done
from .store import JobRecord, Outbound, RackRecord, ReplicaRecord, Store

__all__ = ["MAX_EVENTS", "JobBook", "holds_gpus_on", "job_view", "rack_key"]

#: Events kept for ``drain_events`` between drains; beyond it the oldest are
#: dropped and counted (a watcher then re-reads the jobs).
MAX_EVENTS = 10_000


def rack_key(rack: str) -> str:
    """A rack's key as the records hold it (lower-case hex).

    Raises:
        BadRequest: not a worker key.
    """
    try:
        return key_hex(rack)
    except (ValueError, AttributeError):
        raise BadRequest(f"rack {str(rack)[:16]!r} is not a worker key "
                         "(64 hex characters)") from None


def holds_gpus_on(job: JobRecord, key: str) -> bool:
    """The job holds GPUs on rack ``key`` (a replica placed there and not yet
    reported DELETED)."""
    return any(r.claimed and r.placement is not None and r.placement.rack == key
               for r in job.replicas.values())


def job_view(job: JobRecord) -> JobView:
    """The job as the API shows it."""
    return JobView(
        id=job.id, spec=job.spec, status=job.status, reason=job.reason,
        created_at=job.created_at, updated_at=job.updated_at, rack=job.rack,
        replicas=tuple(ReplicaView(index=r.index, status=r.status, generation=r.generation,
                                   placement=r.placement, message=r.message,
                                   agents=r.agents, gateway=r.gateway)
                       for r in sorted(job.replicas.values(), key=lambda r: r.index)))


class JobBook:
    """Jobs, racks, report positions and shell keys, with their store (see the module doc).

    Use :meth:`open`. Not thread-safe: the orchestrator's one task drives it.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        #: Every job by id, oldest first. Change a job only through the
        #: methods below or, for its fields and replicas, followed by
        #: :meth:`changed` or :meth:`refresh`.
        self.jobs: dict[str, JobRecord] = {}
        #: Every registered rack by key, in registration order.
        self.racks: dict[str, RackRecord] = {}
        #: Per team, the newest shell keys app-node sent.
        self.shell_keys: dict[str, ShellKeys] = {}
        self._positions: dict[str, int] = {}
        self._events: deque[JobEvent] = deque()
        self._seq = 0
        # What the current call changed, written by commit().
        self._dirty: set[str] = set()
        self._removed: set[str] = set()
        self._ops: list[Outbound] = []
        self._racks_dirty: set[str] = set()
        #: Job status changes missing from JOB_TRANSITIONS (a bug; should stay 0).
        self.unexpected_transitions = 0
        self.events_dropped = 0

    @classmethod
    def open(cls, path: Path | None) -> JobBook:
        """Open the store at ``path`` (None: in memory) and load every record from it.

        Raises:
            StoreError: the store cannot be read.
        """
        store = Store.open(path)
        try:
            book = cls(store)
            for rack in store.load_racks():
                book.racks[rack.key] = rack
            for job in store.load_jobs():
                book.jobs[job.id] = job
                book._seq = max(book._seq, job.seq)
            book._positions = store.positions()
            book.shell_keys = store.load_shell_keys()
        except BaseException:
            store.close()
            raise
        return book

    def close(self) -> None:
        self._store.close()

    def reservations(self) -> list[tuple[str, str, str]]:
        """The saved node reservations as (rack, node, team)."""
        return self._store.load_reservations()

    # -- reading --------------------------------------------------------------------------

    def job(self, job_id: str) -> JobRecord:
        """Raises: NotFound: no such job."""
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}; list the jobs to see their ids")
        return job

    def rack(self, rack: str) -> RackRecord:
        """Raises: BadRequest: not a key; NotFound: no such rack."""
        record = self.racks.get(rack_key(rack))
        if record is None:
            raise NotFound(f"no rack {rack[:12]} is registered; list the racks to see them")
        return record

    def flags(self, job: JobRecord) -> JobFlags:
        """What besides its replicas' statuses decides the job's status."""
        silent = any(r.claimed and r.placement is not None and r.placement.rack in self.racks
                     and self.racks[r.placement.rack].silent for r in job.replicas.values())
        return JobFlags(deleting=job.deleting, restarting=job.restarting,
                        unplaceable=job.unplaceable, rack_silent=silent)

    def report_position(self, rack: str) -> int | None:
        """The queue position of the last report applied from ``rack``, if any."""
        return self._positions.get(rack)

    # -- changing (written by the next commit) ---------------------------------------------

    def add_job(self, job_id: str, spec: JobSpec, now: float, owner: str | None) -> JobRecord:
        """A new job, Creating, with its replicas Queued; its event is sent."""
        self._seq += 1
        job = JobRecord(id=job_id, seq=self._seq, spec=spec, status=JobStatus.CREATING,
                        reason="", created_at=now, updated_at=now, owner=owner,
                        replicas={i: ReplicaRecord(index=i, status=ReplicaStatus.QUEUED)
                                  for i in range(spec.replicas)})
        self.jobs[job_id] = job
        self._dirty.add(job_id)
        self._emit(job, None, now)
        return job

    def changed(self, job: JobRecord) -> None:
        """The job's fields or replicas changed without a new status: save it."""
        self._dirty.add(job.id)

    def refresh(self, job: JobRecord, now: float, reason: str = "") -> None:
        """Derive the job's status again (and save it); send an event when it changed."""
        statuses = [r.status for r in job.replicas.values()]
        if job.restarting and restart_done(statuses):
            job.restarting = False
        self._dirty.add(job.id)
        status = derive_job_status(statuses, self.flags(job))
        if status is not job.status:
            self.set_status(job, status, reason, now)

    def set_status(self, job: JobRecord, status: JobStatus, reason: str, now: float) -> None:
        previous = job.status
        if (previous, status) not in JOB_TRANSITIONS:
            self.unexpected_transitions += 1
        job.status, job.reason, job.updated_at = status, reason, now
        self._dirty.add(job.id)
        self._emit(job, previous, now)

    def remove(self, job: JobRecord, now: float, reason: str) -> None:
        """The job is gone (nothing of it left on any rack)."""
        previous = job.status
        if (previous, None) not in JOB_TRANSITIONS:
            self.unexpected_transitions += 1
        del self.jobs[job.id]
        self._dirty.discard(job.id)
        self._removed.add(job.id)
        self._push(JobEvent(job_id=job.id, team=job.spec.team, status=None, previous=previous,
                            reason=reason, at=now))

    def add_rack(self, rack: RackRecord) -> None:
        self.racks[rack.key] = rack
        self._racks_dirty.add(rack.key)

    def rack_changed(self, key: str) -> None:
        """The rack's record changed (name, report, silence): save it."""
        self._racks_dirty.add(key)

    def queue(self, rack: str, op: CreateReplica | RestartReplica | DeleteReplica | SetShellKeys
              ) -> None:
        """Put an operation for ``rack``'s worker in the outbox, with this call's changes."""
        self._ops.append(Outbound(rack=rack, op=op))

    def commit(self, *, position: tuple[str, int] | None = None) -> None:
        """Write what this call changed in one transaction (with ``position``,
        the (rack, queue position) of the report it applied).

        Raises:
            StoreError: nothing was written; the memory is ahead of the file.
        """
        if position is not None:
            self._positions[position[0]] = position[1]
        dirty, removed, ops, racks = self._dirty, self._removed, self._ops, self._racks_dirty
        self._dirty, self._removed, self._ops, self._racks_dirty = set(), set(), [], set()
        if not (dirty or removed or ops or racks or position):
            return
        try:
            with self._store.transaction():
                for job_id in removed:
                    self._store.delete_job(job_id)
                for job_id in dirty:
                    self._store.save_job(self.jobs[job_id])
                for key in racks:
                    if key in self.racks:
                        self._store.save_rack(self.racks[key])
                for outbound in ops:
                    self._store.add_outbound(outbound)
                if position is not None:
                    self._store.set_position(*position)
        except Exception as exc:
            raise StoreError(f"could not save wrk-ork's state: {exc}; "
                             "restart wrk-ork (it reloads its last saved state)") from exc

    # -- changes written at once -------------------------------------------------------

    def remove_rack(self, key: str) -> None:
        """Forget a rack, its reservations and its report position.

        Raises:
            StoreError: it could not be saved.
        """
        del self.racks[key]
        self._positions.pop(key, None)
        try:
            with self._store.transaction():
                self._store.delete_rack(key)
        except Exception as exc:
            raise StoreError(f"could not save the rack's removal: {exc}") from exc

    def reserve(self, key: str, nodes: Iterable[str], team: str) -> None:
        """Save the reservation of ``nodes`` of rack ``key`` for ``team``.

        Raises:
            StoreError: it could not be saved.
        """
        self._save_reservations(lambda: [self._store.save_reservation(key, node, team)
                                           for node in nodes])

    def release(self, key: str, nodes: Iterable[str]) -> None:
        """Save the end of the reservations of ``nodes`` of rack ``key``.

        Raises:
            StoreError: it could not be saved.
        """
        self._save_reservations(lambda: [self._store.delete_reservation(key, node)
                                           for node in nodes])

    def _save_reservations(self, write: Callable[[], object]) -> None:
        try:
            with self._store.transaction():
                write()
        except Exception as exc:
            raise StoreError(f"could not save the reservation: {exc}") from exc

    def set_shell_keys(self, keys: ShellKeys, ops: Iterable[Outbound]) -> None:
        """Keep ``keys`` as the team's newest, saved with ``ops`` for the workers.

        Raises:
            StoreError: it could not be saved (nothing changed in memory).
        """
        try:
            with self._store.transaction():
                self._store.save_shell_keys(keys)
                for outbound in ops:
                    self._store.add_outbound(outbound)
        except Exception as exc:
            raise StoreError(f"could not save team {keys.team}'s shell keys: {exc}; "
                             "restart wrk-ork (it reloads its last saved state)") from exc
        self.shell_keys[keys.team] = keys

    # -- outbox and events ---------------------------------------------------------------

    def outbox(self) -> list[Outbound]:
        """Operations not yet published, in the order they were made."""
        return self._store.outbox()

    def outbox_size(self) -> int:
        return self._store.outbox_size()

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

    def _emit(self, job: JobRecord, previous: JobStatus | None, now: float) -> None:
        self._push(JobEvent(job_id=job.id, team=job.spec.team, status=job.status,
                            previous=previous, reason=job.reason, at=now))

    def _push(self, event: JobEvent) -> None:
        if len(self._events) >= MAX_EVENTS:
            self._events.popleft()
            self.events_dropped += 1
        self._events.append(event)
