"""wrk-ork's RPC service for app-node: jobs, replicas, racks, nodes, and a stream
of status changes, on protocol ``cosmicac-ork/1``.

Theory of operation
-------------------
:class:`OrkService` is a :class:`~p2p.host.RpcService` the daemon adds to its
swarm. Every call is authorised by the caller's Noise-proven key
(``ctx.remote_public_key``) before anything else is done with it: the key's
roles (:mod:`.access`: app-node, proxy, worker) must include one that
:data:`ACCESS` lists for the method, else ``FORBIDDEN``; a method
:data:`ACCESS` does not list is refused to everyone. A handler
calls the orchestrator synchronously (no await between the change and what
follows it), then :meth:`OrkService.pump` hands the status changes it made to
the ``jobs.watch`` streams, and ``on_change`` tells the daemon there are
operations to publish. The daemon calls :meth:`pump` too after it feeds the
orchestrator reports and ticks.

The protocol (methods, models, error codes) is :mod:`contracts.ork`; this
module serves it.

Who may call what (:data:`ACCESS`; DESIGN.md §5, least privilege)::

    app-node         every method (jobs.preview too: a create that changes nothing)
    proxy            jobs.get, jobs.list, jobs.watch   (routing inference; it changes nothing)
    worker           none (it speaks cosmicac-mq/1, the queue of its rack)
    any other key    none

``service.status`` is what app-node's health prober asks every interval
(``details``: the racks, registered and silent, the watchers, the jobs per
status). ``LAGGED`` ends a watch whose watcher fell more than
:data:`WATCH_BUFFER` events behind; ``TOO_MANY_WATCHERS`` refuses a watch past
:data:`MAX_WATCHERS` streams, or :data:`MAX_WATCHERS_PER_KEY` of one key.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any

import trio
from pydantic import BaseModel

from contracts.health import STATUS, ServiceStatus, StatusRequest, service_status
from contracts.model import JobStatus
from contracts.ork import (
    CREATE_JOB,
    DELETE_JOB,
    DELETE_REPLICA,
    GET_JOB,
    LIST_JOBS,
    LIST_NODES,
    LIST_RACKS,
    PREVIEW_JOB,
    PROTOCOL,
    REGISTER_RACK,
    RELEASE_NODES,
    REMOVE_RACK,
    RESERVE_NODES,
    RESTART_JOB,
    RESTART_REPLICA,
    SET_SHELL_KEYS,
    WATCH_JOBS,
    CreateJob,
    DeleteResult,
    Empty,
    GpuQuota,
    JobCursor,
    JobEvent,
    JobList,
    JobPreview,
    JobRef,
    JobResult,
    JobView,
    ListJobs,
    NodeEntry,
    NodeList,
    RackList,
    RackRef,
    RackResult,
    RegisterRack,
    ReleaseNodes,
    ReplicaRef,
    ReserveNodes,
    WatchJobs,
)
from contracts.shell_access import ShellKeys, ShellKeysAck
from nodes.kit.metrics import Family, Snapshot
from p2p.host import RpcService
from p2p.rpc import AccessTable, CallContext, Router, RpcConfig, RpcError

from .access import Role
from .errors import OrkError
from .job_book import job_view
from .orchestrator import Orchestrator
from .steps import step_line
from .store import JobRecord

__all__ = ["ACCESS", "MAX_WATCHERS", "MAX_WATCHERS_PER_KEY", "WATCH_BUFFER", "OrkService"]

log = logging.getLogger(__name__)

#: Events queued for one watcher; beyond it the watch ends with LAGGED (the
#: watcher re-reads the jobs and watches again) instead of stalling wrk-ork.
WATCH_BUFFER = 1024
#: Watch streams at once (app-node needs one or two); more get TOO_MANY_WATCHERS.
MAX_WATCHERS = 64
#: Watch streams one caller key holds at once (app-node needs one or two, the
#: proxy one): the internet-facing proxy's key cannot take every slot and
#: leave app-node without its job events.
MAX_WATCHERS_PER_KEY = 8

#: app-node only: every method that changes something, and the control views.
APP_NODE_ONLY = frozenset({Role.APP_NODE})
#: Reading and following jobs: all proxy-inference needs to route inference.
JOB_READERS = frozenset({Role.APP_NODE, Role.PROXY})

#: Who may call each method: method name -> roles (:mod:`.access`). A method
#: not listed here is refused to everyone (FORBIDDEN), so a new method is
#: closed until it gets its line (``NEW_METHOD.name: APP_NODE_ONLY,``).
#: Workers call none: they speak only ``cosmicac-mq/1``, whose queues exist
#: for registered racks' keys only.
ACCESS: Mapping[str, frozenset[Role]] = MappingProxyType({
    CREATE_JOB.name: APP_NODE_ONLY,
    PREVIEW_JOB.name: APP_NODE_ONLY,
    GET_JOB.name: JOB_READERS,
    LIST_JOBS.name: JOB_READERS,
    WATCH_JOBS.name: JOB_READERS,
    RESTART_JOB.name: APP_NODE_ONLY,
    DELETE_JOB.name: APP_NODE_ONLY,
    RESTART_REPLICA.name: APP_NODE_ONLY,
    DELETE_REPLICA.name: APP_NODE_ONLY,
    REGISTER_RACK.name: APP_NODE_ONLY,
    LIST_RACKS.name: APP_NODE_ONLY,
    REMOVE_RACK.name: APP_NODE_ONLY,
    LIST_NODES.name: APP_NODE_ONLY,
    RESERVE_NODES.name: APP_NODE_ONLY,
    RELEASE_NODES.name: APP_NODE_ONLY,
    STATUS.name: APP_NODE_ONLY,
    SET_SHELL_KEYS.name: APP_NODE_ONLY,
})


class _Watcher:
    """One ``jobs.watch`` stream: its filter and its bounded queue of events."""

    def __init__(self, params: WatchJobs, caller: bytes | None) -> None:
        self.job_id, self.team = params.job_id, params.team
        #: Sent every change of a view, with the view and the revision.
        self.views = params.views
        self.caller = caller
        self.send, self.receive = trio.open_memory_channel[JobEvent](WATCH_BUFFER)
        self.lagged = False

    def wants(self, event: JobEvent) -> bool:
        return ((self.job_id is None or event.job_id == self.job_id)
                and (self.team is None or event.team == self.team))


#: What a job's view shows, cheap to compare: a change of it is a ``views`` event.
Fingerprint = tuple[Any, ...]


def _fingerprint(job: JobRecord) -> Fingerprint:
    return (job.status, job.reason, job.updated_at, job.rack,
            tuple((r.index, r.status, r.generation, r.placement, r.message, r.agents,
                   r.gateway) for r in job.replicas.values()))


class OrkService(RpcService):
    """The ``cosmicac-ork/1`` service over one orchestrator.

    Args:
        orch: the orchestrator (driven from the same trio thread as the daemon).
        roles: ``roles(caller_key) -> roles`` (:class:`~.access.OrkAccess`'s
            ``roles_of``); what each role may call is :data:`ACCESS`.
        allow: instead of ``roles``: ``allow(caller_key) -> bool``, the keys
            given the app-node role (every method), nobody else. Neither
            given: every call is refused.
        clock: the ``now`` given to the orchestrator (wall-clock seconds).
        on_change: called after every call (it may have queued operations),
            so the daemon publishes :meth:`Orchestrator.outbox`.
        config: the RPC server's limits.
    """

    def __init__(self, orch: Orchestrator, *,
                 roles: Callable[[bytes], Collection[str]] | None = None,
                 allow: Callable[[bytes], bool] | None = None,
                 clock: Callable[[], float] = time.time,
                 on_change: Callable[[], object] | None = None,
                 config: RpcConfig | None = None,
                 limiter: trio.CapacityLimiter | None = None) -> None:
        self.orch = orch
        #: Given: every orchestrator call runs in a thread holding it (its
        #: SQLite commits fsync), one at a time with the daemon's own calls.
        self._limiter = limiter
        if roles is None:
            roles = ((lambda key: APP_NODE_ONLY if allow(key) else frozenset())
                     if allow is not None else (lambda key: frozenset()))
        #: Every call passes it before it is routed (the router's guard).
        self.access = AccessTable("wrk-ork", ACCESS, roles,
                                  hint="list it in wrk-ork's app_nodes or proxies")
        self._clock = clock
        self._on_change = on_change
        self._watchers: set[_Watcher] = set()
        #: The revision of the jobs' views (``views`` watches): one more per change.
        self.revision = 0
        #: While a ``views`` watch is open: each job's team and fingerprint as
        #: last sent, to find the views that changed without a status event.
        self._seen: dict[str, tuple[str, Fingerprint]] | None = None
        #: ``service.status``'s ``started_at``: when this service was built.
        self.started_at = clock()
        router = Router(guard=self.access.check)
        for method, handler in [
            (CREATE_JOB, self._create_job), (RESTART_JOB, self._restart_job),
            (DELETE_JOB, self._delete_job), (RESTART_REPLICA, self._restart_replica),
            (DELETE_REPLICA, self._delete_replica), (REGISTER_RACK, self._register_rack),
            (REMOVE_RACK, self._remove_rack), (RESERVE_NODES, self._reserve_nodes),
            (RELEASE_NODES, self._release_nodes), (SET_SHELL_KEYS, self._set_shell_keys),
        ]:
            router.add(method, self._unary(handler, changes=True))
        for method, handler in [
            (PREVIEW_JOB, self._preview_job),
            (GET_JOB, self._get_job), (LIST_JOBS, self._list_jobs),
            (LIST_RACKS, self._list_racks), (LIST_NODES, self._list_nodes),
            (STATUS, self._status),
        ]:
            router.add(method, self._unary(handler, changes=False))
        router.add(WATCH_JOBS, self._watch)
        super().__init__(PROTOCOL, router, config=config)

    def metrics(self) -> Snapshot:
        """Calls refused by :data:`ACCESS`, by method, for the daemon's ``/metrics``."""
        return Snapshot({"ork_calls_refused": Family(
            "cosmicac-ork/1 calls refused (FORBIDDEN) by method; (unlisted): a method "
            "the access table does not name", self.access.statistics().refused, "method",
            counter=True)})

    @property
    def watchers(self) -> int:
        """Watch streams open now."""
        return len(self._watchers)

    def pump(self) -> None:
        """Hand the orchestrator's status changes to the watch streams.

        A watcher whose queue is full is ended with ``LAGGED``; wrk-ork never
        waits for a slow watcher.
        """
        events = self.orch.drain_events()
        for event in events:
            # The job's System step (nodes/ork/steps.py), ending in when the
            # status was reached (``at``: wrk-ork's wall clock): what
            # bench/job_start.py times the ork and health steps by.
            job = None
            if event.status in (JobStatus.CREATING, JobStatus.STARTING):
                try:  # for what it is and where it was placed
                    job = self.orch.get_job(event.job_id)
                except OrkError:
                    job = None  # already gone again
            level, line = step_line(event, job)
            log.log(level, "%s", line, extra={"job_id": event.job_id})
            for watcher in list(self._watchers):
                if not watcher.views and watcher.wants(event):
                    self._offer(watcher, event)
        if self._seen is not None:
            self._pump_views(events)

    def _offer(self, watcher: _Watcher, event: JobEvent) -> None:
        try:
            watcher.send.send_nowait(event)
        except trio.WouldBlock:
            watcher.lagged = True
            watcher.send.close()
            self._watchers.discard(watcher)

    def _pump_views(self, events: list[JobEvent]) -> None:
        """The ``views`` watches' events: each status event with the job's view, then
        an event per view that changed without one (found by fingerprint: the
        orchestrator reports status changes only). Costs a fingerprint per job
        per pump while such a watch is open (about 2 ms per 1,000 jobs on the bench
        machine; the orchestrator telling which jobs a call changed would save it)."""
        assert self._seen is not None
        seen, jobs = self._seen, self.orch.book.jobs
        views: dict[str, JobView | None] = {}
        out: list[JobEvent] = []

        def view_of(job_id: str) -> JobView | None:
            if job_id not in views:
                job = jobs.get(job_id)
                views[job_id] = None if job is None else job_view(job)
            return views[job_id]

        for event in events:
            self.revision += 1
            out.append(event.model_copy(update={"seq": self.revision,
                                                "job": view_of(event.job_id)}))
        now = self._clock()
        for job_id, job in jobs.items():
            print_ = _fingerprint(job)
            last = seen.get(job_id)
            if last is not None and last[1] == print_:
                continue
            seen[job_id] = (job.spec.team, print_)
            if job_id in views:  # a status event carried it already
                continue
            self.revision += 1
            out.append(JobEvent(job_id=job_id, team=job.spec.team, status=job.status,
                                previous=job.status, reason=job.reason, at=now,
                                seq=self.revision, job=view_of(job_id)))
        for job_id in [job_id for job_id in seen if job_id not in jobs]:
            team, _ = seen.pop(job_id)
            if job_id in views:
                continue
            # Gone without its event (the orchestrator's queue dropped it): say so.
            self.revision += 1
            out.append(JobEvent(job_id=job_id, team=team, status=None, previous=None,
                                reason="deleted", at=now, seq=self.revision))
        for watcher in list(self._watchers):
            if not watcher.views:
                continue
            for event in out:
                if watcher.wants(event):
                    self._offer(watcher, event)
                    if watcher.lagged:
                        break

    @contextlib.asynccontextmanager
    async def _alone(self) -> AsyncIterator[None]:
        """While no orchestrator call runs in a thread (and not cancelled meanwhile:
        events must not be left behind)."""
        if self._limiter is None:
            yield
            return
        with trio.CancelScope(shield=True):
            async with self._limiter:
                yield

    async def _pump_alone(self) -> None:
        """:meth:`pump` while no orchestrator call runs in a thread."""
        async with self._alone():
            self.pump()

    # -- plumbing ---------------------------------------------------------------------

    def _unary(self, handler: Callable[[Any], BaseModel], *, changes: bool
               ) -> Callable[[Any, CallContext], Any]:
        """``handler`` as an RPC method; after one that ``changes`` state, the
        watchers are pumped and the daemon told (it publishes the outbox).
        Reads do neither: a busy listing must not cost a publishing round each."""
        async def serve(params: Any, ctx: CallContext) -> BaseModel:
            try:
                if self._limiter is None:
                    result = handler(params)
                else:
                    result = await trio.to_thread.run_sync(handler, params,
                                                           limiter=self._limiter)
            except OrkError as exc:
                raise RpcError(exc.code, exc.message, getattr(exc, "data", None)) from exc
            finally:
                if changes:  # even a refused change may have changed something
                    await self._pump_alone()
            if changes and self._on_change is not None:
                self._on_change()
            return result

        serve.__name__ = handler.__name__
        return serve

    # -- handlers (synchronous: the orchestrator never waits) ------------------------------

    def _create_job(self, params: CreateJob) -> JobResult:
        quota = params.quota or GpuQuota()
        return JobResult(job=self.orch.create_job(
            params.spec, self._clock(), owner=params.created_by,
            team_gpus=quota.team_gpus, user_gpus=quota.user_gpus))

    def _preview_job(self, params: CreateJob) -> JobPreview:
        # A read: what create would do now, recorded nowhere (no pump, no publish).
        quota = params.quota or GpuQuota()
        return self.orch.preview_job(params.spec, owner=params.created_by,
                                     team_gpus=quota.team_gpus, user_gpus=quota.user_gpus)

    def _get_job(self, params: JobRef) -> JobResult:
        return JobResult(job=self.orch.get_job(params.job_id))

    def _list_jobs(self, params: ListJobs) -> JobList:
        if params.ids is not None:
            return JobList(jobs=self.orch.jobs_by_id(params.ids, params.team))
        after = None if params.after is None else (params.after.created_at, params.after.id)
        jobs, more = self.orch.page_jobs(params.team, after=after, limit=params.limit)
        last = jobs[-1] if more else None
        return JobList(jobs=jobs, next=None if last is None else
                       JobCursor(created_at=last.created_at, id=last.id))

    def _restart_job(self, params: JobRef) -> JobResult:
        job = self.orch.restart_job(params.job_id, self._clock())
        log.info("restart asked (status %s%s) | ork.restart job=%s", job.status,
                 f": {job.reason}" if job.reason else "", job.id, extra={"job_id": job.id})
        return JobResult(job=job)

    def _delete_job(self, params: JobRef) -> DeleteResult:
        job = self.orch.delete_job(params.job_id, self._clock())
        log.info("delete asked (%s) | ork.delete job=%s",
                 "nothing placed: gone at once" if job is None else f"status {job.status}",
                 params.job_id, extra={"job_id": params.job_id})
        return DeleteResult(job=job)

    def _restart_replica(self, params: ReplicaRef) -> JobResult:
        job = self.orch.restart_replica(params.job_id, params.replica, self._clock())
        log.info("replica %d restart asked | ork.restart job=%s replica=%d", params.replica,
                 job.id, params.replica, extra={"job_id": job.id, "replica": params.replica})
        return JobResult(job=job)

    def _delete_replica(self, params: ReplicaRef) -> JobResult:
        job = self.orch.delete_replica(params.job_id, params.replica, self._clock())
        log.info("replica %d delete asked | ork.delete job=%s replica=%d", params.replica,
                 job.id, params.replica, extra={"job_id": job.id, "replica": params.replica})
        return JobResult(job=job)

    def _register_rack(self, params: RegisterRack) -> RackResult:
        return RackResult(rack=self.orch.register_rack(params.rack, params.location,
                                                       self._clock(), name=params.name))

    def _list_racks(self, params: Empty) -> RackList:
        return RackList(racks=self.orch.racks())

    def _remove_rack(self, params: RackRef) -> Empty:
        self.orch.remove_rack(params.rack)
        return Empty()

    def _list_nodes(self, params: Empty) -> NodeList:
        return NodeList(nodes=[NodeEntry(rack=n.rack, location=n.location, name=n.name,
                                         gpus=n.gpus, free=n.free, reserved_for=n.reserved_for,
                                         schedulable=n.schedulable, infiniband=n.infiniband)
                               for n in self.orch.nodes()])

    def _reserve_nodes(self, params: ReserveNodes) -> Empty:
        self.orch.reserve_nodes(params.rack, params.nodes, params.team)
        return Empty()

    def _release_nodes(self, params: ReleaseNodes) -> Empty:
        self.orch.release_nodes(params.rack, params.nodes)
        return Empty()

    def _set_shell_keys(self, params: ShellKeys) -> ShellKeysAck:
        version, applied = self.orch.set_shell_keys(params)
        if applied:
            log.info("ork.shell_keys team=%s version=%d keys=%d", params.team, version,
                     len(params.keys))
        return ShellKeysAck(version=version, applied=applied)

    def _status(self, params: StatusRequest) -> ServiceStatus:
        orch = self.orch
        racks = orch.racks()
        counts = orch.status_counts()
        details: dict[str, int | float | str | bool | None] = {
            "racks": len(racks), "racks_silent": sum(r.silent for r in racks),
            "watchers": len(self._watchers)}
        details.update({f"jobs_{status}": n for status, n in sorted(counts.items())})
        return service_status("wrk-ork", started_at=self.started_at,
                              queue_depth=orch.statistics().outbox,
                              last_report_at=orch.last_report_at(), details=details)

    async def _watch(self, params: WatchJobs, ctx: CallContext) -> AsyncIterator[JobEvent]:
        if len(self._watchers) >= MAX_WATCHERS:
            raise RpcError("TOO_MANY_WATCHERS", f"wrk-ork serves at most {MAX_WATCHERS} "
                                                "watch streams; close one first")
        caller = ctx.remote_public_key
        if sum(w.caller == caller for w in self._watchers) >= MAX_WATCHERS_PER_KEY:
            raise RpcError("TOO_MANY_WATCHERS", f"this key holds {MAX_WATCHERS_PER_KEY} watch "
                                                "streams already, the most one key may; "
                                                "close one first")
        watcher = _Watcher(params, caller)
        jobs: list[JobView] = []
        # One step: what happened before this watch is pumped (not its business),
        # the watcher added, and the snapshot taken at the revision it is at.
        async with self._alone():
            self.pump()
            if watcher.views and self._seen is None:  # from here on, views are followed
                self._seen = {job.id: (job.spec.team, _fingerprint(job))
                              for job in self.orch.book.jobs.values()}
            self._watchers.add(watcher)
            if params.snapshot:
                jobs = self.orch.list_jobs(params.team)
            revision = self.revision
        try:
            for job in jobs:
                if params.job_id is None or job.id == params.job_id:
                    yield JobEvent(job_id=job.id, team=job.spec.team, status=job.status,
                                   previous=job.status, reason=job.reason,
                                   at=job.updated_at,
                                   **({"seq": revision, "job": job} if watcher.views else {}))
            if watcher.views:
                yield JobEvent(job_id="", team="", status=None, previous=None, reason="",
                               at=self._clock(), seq=revision, bookmark=True)
            async with watcher.receive:
                async for event in watcher.receive:
                    yield event
            if watcher.lagged:
                raise RpcError("LAGGED", f"this watch fell more than {WATCH_BUFFER} changes "
                                         "behind; list the jobs and watch again")
        finally:
            self._watchers.discard(watcher)
            watcher.send.close()
            if not any(w.views for w in self._watchers):
                self._seen = None  # no views followed: no fingerprints per pump
