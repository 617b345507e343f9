"""wrk-ork's RPC API: protocol ``cosmicac-ork/1``, served to app-node and proxy-inference.

wrk-ork (``nodes/ork``) keeps the jobs, replicas, racks and nodes; app-node
sends it every change a user asks for, and proxy-inference reads and follows
the jobs it routes inference to. Both call it over the swarm: wrk-ork serves
the protocol on its swarm, a caller opens one channel per connection
(``nodes.kit.ork_client.OrkClient``). Every message is a msgpack map (p2p/rpc
README, "Wire format").

The protocol
------------
Methods (params -> result; every model below)::

    jobs.create      CreateJob(spec, created_by?, quota?) -> JobResult(job)
    jobs.preview     CreateJob(spec, created_by?, quota?) -> JobPreview(status, reason, ...)
    jobs.get         JobRef(job_id)                 -> JobResult(job)
    jobs.list        ListJobs(team?, ids?, after?, limit) -> JobList(jobs, next?)
    jobs.restart     JobRef(job_id)                 -> JobResult(job)
    jobs.delete      JobRef(job_id)                 -> DeleteResult(job?)  (None: gone at once)
    replicas.restart ReplicaRef(job_id, replica)    -> JobResult(job)
    replicas.delete  ReplicaRef(job_id, replica)    -> JobResult(job)
    racks.register   RegisterRack(rack, location, name?) -> RackResult(rack)
    racks.list       Empty                          -> RackList(racks)
    racks.remove     RackRef(rack)                  -> Empty
    nodes.list       Empty                          -> NodeList(nodes)
    nodes.reserve    ReserveNodes(rack, nodes, team) -> Empty
    nodes.release    ReleaseNodes(rack, nodes)      -> Empty
    jobs.watch       WatchJobs(job_id?, team?, snapshot, views?) => JobEvent, JobEvent, ...
    teams.set_shell_keys ShellKeys(team, keys, version) -> ShellKeysAck(version, applied)
    service.status   StatusRequest                  -> ServiceStatus  (contracts.health)

Who may call what: app-node every method; proxy-inference ``jobs.get``,
``jobs.list`` and ``jobs.watch`` (it routes inference and changes nothing);
the workers none (they speak ``cosmicac-mq/1``, the queue of their rack,
``contracts.operations``); any other key none.

``jobs.list`` answers at most :data:`MAX_LIST_PAGE` jobs, oldest first by
(created_at, id); ``next`` set: more follow, ask again with ``after=next``.
Given ``ids``, it answers those jobs (that exist, of ``team`` if given) and
``after``/``limit`` do not apply.

``jobs.create``'s ``created_by`` (app-node's user id) and ``quota`` (the
team's GPU quotas, :class:`GpuQuota`) are app-node's: wrk-ork checks the quota
against the team's jobs in the same call that adds the job, so two racing
creates cannot both pass it; over it: ``QUOTA_EXCEEDED`` with ``data``
``{scope: team|user, quota, in_use, requested}``.

``jobs.preview`` (app-node only) answers what ``jobs.create`` of the same
params would do now, and does none of it: the same refusals (``CONFLICT``,
``QUOTA_EXCEEDED``, ``INVALID_PARAMS``), else the status the job would have
once placement was tried (``starting`` with one placement per replica,
``pending`` or ``failed`` with the reason, the words a created job's
``reason`` would carry). No job, operation, claim or quota use is recorded.
A wrk-ork older than it refuses the call: ``UNKNOWN_METHOD`` from its router,
or ``FORBIDDEN`` from its access table (which refuses a method it does not
list before routing it); app-node tells that refusal from one of its key by
a method it may call (``service.status``) and answers the preview with the
placement unknown.

``teams.set_shell_keys`` (app-node only: it is the truth of a team's members
and their CLI keys) keeps a team's shell keys if their version is above
wrk-ork's and sends a changed set to the racks running the team's container
jobs (:mod:`contracts.shell_access`); ``applied`` False: wrk-ork holds that
version or a newer one (``version`` says which).

A watch sees the changes made after it started (``snapshot=True`` first sends
every matching job's current status, with ``previous`` equal to ``status``);
a :class:`JobEvent` whose ``status`` is None says the job is gone.

A watch with ``views=True`` is what a copy of the jobs is kept from (an
informer's list-and-watch in one stream, like Kubernetes' watch with
``sendInitialEvents``): wrk-ork counts every change of any job's view in one
revision (``seq``, from 1 at each start of wrk-ork); each event carries the
job's whole :class:`JobView` after the change; views that change without a
status change (a replica's status, message, agents) are sent too; and a
``bookmark`` event follows the snapshot (or opens the watch, without one)
with the revision the snapshot was taken at. On a watch of every job (no
``job_id``, no ``team``) the events after the bookmark number ``seq + 1``,
``seq + 2``, ... without a gap: a gap means events were lost, and the copy is
rebuilt from a new watch. The snapshot is one job per stream item, so a copy
of any number of jobs fits the channel's message limit (one ``jobs.list``
answer of 1,000 jobs did not: hence its pages).

``service.status``'s ``queue_depth`` is the outbox (operations recorded, not
yet on their rack's queue), ``last_report_at`` the newest report heard from
any rack, ``details`` the racks (registered, silent), the watchers and the
jobs per status.

Error codes (``RpcError.code``): ``FORBIDDEN`` (the caller's key has no role
the method is open to; the message says which role it needs and what the key
is), ``NOT_FOUND``, ``INVALID_STATE``, ``BAD_REQUEST``, ``QUOTA_EXCEEDED``,
``STORE`` (wrk-ork's file failed; it needs a restart), ``LAGGED`` (a watcher
fell too many events behind: get the jobs and watch again),
``TOO_MANY_WATCHERS`` (too many watch streams, in all or of one key); and the
RPC layer's own (``INVALID_PARAMS`` for params that fail validation, e.g. a
bad JobSpec, with the fields named).

Versions
--------
Every model forbids unknown fields, so a field added to a params model is
refused by an older wrk-ork: such a change is a new protocol version
(``cosmicac-ork/2``), as is a change of a field's meaning. The exceptions are
fields an older peer can do without (``contracts._compat.AddedLater``: left
out of the message while empty): ``WatchJobs.views`` (an older wrk-ork
refuses a watch that sets it, ``INVALID_PARAMS``, and app-node falls back to
asking wrk-ork per request) and ``JobEvent``'s ``seq``, ``job`` and
``bookmark`` (sent only on such a watch).
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from p2p.rpc import Method, StreamMethod

from ._compat import AddedLater
from .gateway import GatewayView
from .model import JobSpec, JobStatus, KeyHex, ReplicaPlacement
from .shell_access import ShellKeys, ShellKeysAck

__all__ = [
    "CREATE_JOB",
    "DELETE_JOB",
    "DELETE_REPLICA",
    "GET_JOB",
    "LIST_JOBS",
    "LIST_NODES",
    "LIST_RACKS",
    "MAX_LIST_PAGE",
    "MAX_NODES_PER_CALL",
    "PREVIEW_JOB",
    "PROTOCOL",
    "REGISTER_RACK",
    "RELEASE_NODES",
    "REMOVE_RACK",
    "RESERVE_NODES",
    "RESTART_JOB",
    "RESTART_REPLICA",
    "SET_SHELL_KEYS",
    "WATCH_JOBS",
    "CreateJob",
    "DeleteResult",
    "Empty",
    "GpuQuota",
    "JobCursor",
    "JobEvent",
    "JobList",
    "JobPreview",
    "JobRef",
    "JobResult",
    "JobView",
    "ListJobs",
    "NodeEntry",
    "NodeList",
    "RackInfo",
    "RackList",
    "RackRef",
    "RackResult",
    "RegisterRack",
    "ReleaseNodes",
    "ReplicaRef",
    "ReplicaStatus",
    "ReplicaView",
    "ReserveNodes",
    "WatchJobs",
]

PROTOCOL = "cosmicac-ork/1"

#: Nodes named in one reserve/release call.
MAX_NODES_PER_CALL = 1000

JobId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9\-]*$")]
Team = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")]
NodeName = Annotated[str, Field(min_length=1, max_length=253)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- what wrk-ork shows of its jobs and racks -----------------------------------------


class ReplicaStatus(enum.StrEnum):
    """One replica as wrk-ork sees it (the worker's :class:`~contracts.model.ReplicaState`
    plus ours); wrk-ork's status machine (``nodes/ork/status.py``) moves it."""

    #: Just asked for; placement not tried yet.
    QUEUED = "queued"
    #: No capacity yet: holds no GPUs, no operation sent.
    PENDING = "pending"
    #: GPUs claimed and CreateReplica in the outbox, or the worker says it boots.
    STARTING = "starting"
    #: The worker says its VMI runs and its agent is ready.
    ACTIVE = "active"
    #: The worker says it failed (or it vanished without a delete).
    FAILED = "failed"
    #: RestartReplica sent or the worker says it is being replaced.
    RESTARTING = "restarting"
    #: The worker says its agent's heartbeats stopped.
    UNKNOWN = "unknown"
    #: DeleteReplica sent; its GPUs stay claimed until the worker says DELETED.
    DELETING = "deleting"
    #: Gone, GPUs free; the replica leaves the job.
    DELETED = "deleted"


class ReplicaView(AddedLater, _Model):
    """One replica as app-node shows it."""

    _added_later = ("gateway",)

    index: int
    status: ReplicaStatus
    #: Restarts so far; the worker's reports about older generations are ignored.
    generation: int
    placement: ReplicaPlacement | None
    #: The worker's latest System log line about it.
    message: str
    #: Public keys (hex) of its agents by node rank, once they said hello: the
    #: keys proxy-inference accepts for this replica.
    agents: tuple[str, ...] = ()
    #: An isolated network's WireGuard gateway, once the worker reported it.
    gateway: GatewayView | None = None


class JobView(_Model):
    """One job as app-node shows it."""

    id: str
    spec: JobSpec
    status: JobStatus
    #: Why it has this status, when that needs saying (Failed, Pending, Unknown).
    reason: str
    created_at: float
    updated_at: float
    #: The rack its replicas run on, once placed.
    rack: str | None
    replicas: tuple[ReplicaView, ...]


class JobEvent(AddedLater, _Model):
    """A job's status changed; ``status`` None means the job is gone.

    On a watch with ``views`` (only there: an older watcher never sees these
    fields) every event also carries ``seq``, wrk-ork's revision after the
    change, and ``job``, the job's whole view after it (None once gone); a
    change that moved no status (a replica's status, message, agents, gateway)
    comes as an event whose ``previous`` equals ``status``; and a ``bookmark``
    (empty ``job_id`` and ``team``, no status) ends the snapshot with the
    revision it was taken at.
    """

    _added_later = ("seq", "job", "bookmark")

    job_id: str
    team: str
    status: JobStatus | None
    previous: JobStatus | None
    reason: str
    at: float
    #: wrk-ork's revision once this change was made (``views`` watches only):
    #: one more than the event before it on an unfiltered watch.
    seq: int = 0
    #: The job as it is after the change; None when it is gone (``views`` only).
    job: JobView | None = None
    #: Not a change: the snapshot before it was taken at revision ``seq``, and
    #: the changes after it follow (``views`` only).
    bookmark: bool = False


class RackInfo(_Model):
    """A registered rack with its capacity and whether it is silent."""

    key: str
    location: str
    name: str | None
    registered_at: float
    #: The worker has sent its capacity at least once.
    reported: bool
    #: Nothing heard from it for ``unknown_after_s``: its jobs are Unknown.
    silent: bool
    nodes: int
    gpus: int
    free: int
    overlay_network: bool
    #: Jobs with replicas placed on it.
    jobs: int
    #: When its worker last reported since wrk-ork started (None: not yet).
    last_report_at: float | None = None


# -- params and results ---------------------------------------------------------------


class Empty(_Model):
    """No parameters, or nothing to return."""


class GpuQuota(_Model):
    """A team's GPU quotas, as app-node keeps them (None: no such quota)."""

    #: GPUs the team's jobs may hold or wait for, all replicas.
    team_gpus: int | None = Field(default=None, ge=0, le=1_000_000)
    #: The same for the jobs one member (``created_by``) created in the team.
    user_gpus: int | None = Field(default=None, ge=0, le=1_000_000)


class CreateJob(_Model):
    spec: JobSpec
    #: Who asks (app-node's user id): kept with the job for per-user quotas.
    created_by: str | None = Field(default=None, min_length=1, max_length=64)
    #: Checked against the team's jobs before the job is added; None: no quota.
    quota: GpuQuota | None = None


class JobPreview(_Model):
    """What ``jobs.create`` of the same params would do now (``jobs.preview``)."""

    #: The status the job would have once placement was tried: ``starting``
    #: (placed), ``pending`` (no room now; it would wait) or ``failed`` (it
    #: could never fit as the location is registered).
    status: JobStatus
    #: Why it would wait or fail, as a created job's ``reason`` would say it.
    reason: str
    #: The rack every replica would run on (placed only).
    rack: str | None = None
    #: One per replica, in index order, when placed; empty otherwise.
    placements: tuple[ReplicaPlacement, ...] = ()


class JobRef(_Model):
    job_id: JobId


class ReplicaRef(_Model):
    job_id: JobId
    replica: int = Field(ge=0, lt=1024)


#: Jobs in one ``jobs.list`` answer: a 1,000-job answer (about 580 KB) was
#: over what a channel carries; a page of 200 is about 120 KB.
MAX_LIST_PAGE = 200


class JobCursor(_Model):
    """Where a page of ``jobs.list`` ended: jobs come oldest first, by (created_at, id)."""

    created_at: float
    id: JobId


class ListJobs(_Model):
    #: Only this team's jobs; None: every job.
    team: Team | None = None
    #: Only these jobs (those that exist, of ``team`` if given), e.g. a page of
    #: app-node's records; then ``after`` and ``limit`` do not apply.
    ids: list[JobId] | None = Field(default=None, max_length=MAX_LIST_PAGE)
    #: The page after this cursor (a previous answer's ``next``).
    after: JobCursor | None = None
    limit: int = Field(default=MAX_LIST_PAGE, ge=1, le=MAX_LIST_PAGE)


class JobResult(_Model):
    job: JobView


class JobList(_Model):
    jobs: list[JobView]
    #: More jobs follow: ask again with ``after=next``.
    next: JobCursor | None = None


class DeleteResult(_Model):
    #: The job, now Deleting; None when it held nothing and is gone already.
    job: JobView | None


class RegisterRack(_Model):
    rack: KeyHex
    location: str = Field(default="default", min_length=1, max_length=64,
                          pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    name: str | None = Field(default=None, min_length=1, max_length=100)


class RackRef(_Model):
    rack: KeyHex


class RackResult(_Model):
    rack: RackInfo


class RackList(_Model):
    racks: list[RackInfo]


class NodeEntry(_Model):
    """A node as ``cosmicac nodes list`` shows it."""

    rack: str
    location: str
    name: str
    gpus: int
    #: GPUs not claimed by a replica.
    free: int
    reserved_for: str | None
    schedulable: bool
    infiniband: bool


class NodeList(_Model):
    nodes: list[NodeEntry]


class ReserveNodes(_Model):
    rack: KeyHex
    nodes: list[NodeName] = Field(min_length=1, max_length=MAX_NODES_PER_CALL)
    team: Team


class ReleaseNodes(_Model):
    rack: KeyHex
    nodes: list[NodeName] = Field(min_length=1, max_length=MAX_NODES_PER_CALL)


class WatchJobs(AddedLater, _Model):
    _added_later = ("views",)

    #: Only this job's changes; None: every job (of ``team``).
    job_id: JobId | None = None
    team: Team | None = None
    #: First send every matching job's current status.
    snapshot: bool = False
    #: Events carry the job's whole view and wrk-ork's revision, every change
    #: of a view is sent (not only status changes), and a bookmark follows the
    #: snapshot: what a caller needs to keep a copy of the jobs (app-node's
    #: projection). An older wrk-ork refuses it (``INVALID_PARAMS``).
    views: bool = False


CREATE_JOB = Method("jobs.create", params=CreateJob, result=JobResult)
PREVIEW_JOB = Method("jobs.preview", params=CreateJob, result=JobPreview)
GET_JOB = Method("jobs.get", params=JobRef, result=JobResult)
LIST_JOBS = Method("jobs.list", params=ListJobs, result=JobList)
RESTART_JOB = Method("jobs.restart", params=JobRef, result=JobResult)
DELETE_JOB = Method("jobs.delete", params=JobRef, result=DeleteResult)
RESTART_REPLICA = Method("replicas.restart", params=ReplicaRef, result=JobResult)
DELETE_REPLICA = Method("replicas.delete", params=ReplicaRef, result=JobResult)
REGISTER_RACK = Method("racks.register", params=RegisterRack, result=RackResult)
LIST_RACKS = Method("racks.list", params=Empty, result=RackList)
REMOVE_RACK = Method("racks.remove", params=RackRef, result=Empty)
LIST_NODES = Method("nodes.list", params=Empty, result=NodeList)
RESERVE_NODES = Method("nodes.reserve", params=ReserveNodes, result=Empty)
RELEASE_NODES = Method("nodes.release", params=ReleaseNodes, result=Empty)
WATCH_JOBS = StreamMethod("jobs.watch", params=WatchJobs, item=JobEvent)
SET_SHELL_KEYS = Method("teams.set_shell_keys", params=ShellKeys, result=ShellKeysAck)
