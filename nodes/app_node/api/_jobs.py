"""Jobs and replicas: validated here, run by wrk-ork, remembered in the store.

wrk-ork (through ``services.ork``) is the truth of what runs and its status;
app-node's store keeps who created each job and its spec, so a team's listing
and the web UI's Duplicate need no call per job. The live status in listings
and job pages comes from app-node's copy of wrk-ork's jobs
(``services.jobs``, :mod:`..job_projection`, kept from the ``jobs.watch``
app-node follows) while it is synced: a listing then calls wrk-ork for nothing
but a job the copy lacks (removed: its record is marked deleted). While it is
not synced (starting, the watch broken and resyncing, a wrk-ork too old for
it) they ask wrk-ork as before, so they answer what wrk-ork answers, or 503
``ORK_UNAVAILABLE`` when it cannot be reached. A route that changes a job waits
(at most ``WRITE_WAIT_S``) until the copy holds the change before it answers:
the caller's next read shows what they did. A create goes to wrk-ork first
and is recorded after: a record never names a job wrk-ork refused, and a job
the store failed to record is deleted in wrk-ork again.

wrk-ork's refusals map to statuses in :func:`ork_call`: ``NOT_FOUND`` 404,
``INVALID_STATE`` 409, ``CONFLICT`` 409 (the team already serves that name),
``QUOTA_EXCEEDED`` 409 (``field: gpus``; the job would take the team, or the
caller, past a GPU quota: app-node sends the team's quotas and the caller's id
with the create, and wrk-ork checks them in the call that adds the job),
``BAD_REQUEST`` / ``INVALID_PARAMS`` 422, ``FORBIDDEN`` 503 (wrk-ork does not
trust app-node's key: a misconfiguration), unreachable 503 ``ORK_UNAVAILABLE``.

``POST /api/jobs?dry_run=true`` runs a create's every check and authorisation,
then asks wrk-ork what it would do (``jobs.preview``: where each replica would
go, or why it would wait or fail) and answers the would-be job with it
(:class:`~._models.JobPreviewOut`, 200); it records nothing, here or in wrk-ork.

A container job's ``authorized_keys`` are the CLI public keys of the team's
members when it is created (members who never logged in with the CLI have none);
from then on :mod:`..shell_keys` keeps the job's agent following the team.

``GET /api/jobs`` and ``GET /api/jobs/{job}`` add each inference job's
``model_health`` (Healthy, Degraded, Unhealthy: wrk-monitor's ``health.jobs``,
judged on the proxies' latency and errors, apart from the job's status). It is
None when unknown: a container job, no wrk-monitor configured or connected,
wrk-monitor slow (``HEALTH_TIMEOUT_S``) or refusing, or no proxy reporting the
job. Those routes never fail or wait on wrk-monitor.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import trio
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from contracts.health import STATUS, StatusRequest
from contracts.model import IMAGE_PATTERN, JobSpec, JobType, api_status, job_type_problem
from contracts.ork import (
    CREATE_JOB,
    DELETE_JOB,
    DELETE_REPLICA,
    GET_JOB,
    LIST_JOBS,
    MAX_LIST_PAGE,
    PREVIEW_JOB,
    RESTART_JOB,
    RESTART_REPLICA,
    CreateJob,
    GpuQuota,
    JobPreview,
    JobRef,
    JobView,
    ListJobs,
    ReplicaRef,
)
from contracts.runtime_settings import managed_flag_problem
from nodes.kit.monitor_client import MonitorUnavailable
from nodes.kit.ork_client import OrkUnavailable
from p2p.rpc import Method, RpcError
from runtime.wireguard import assign_addresses

from .. import codes
from ..job_projection import JobProjection, Mark
from ..model import JobRecord, Page, Role
from ._common import ApiError, Ctx, Session, ok, require_member, team_of, validate
from ._job_documents import job_out
from ._models import (
    DeletedJobOut,
    JobIn,
    JobOut,
    JobPreviewOut,
    JobsOut,
    ReplicaPreviewOut,
    WireGuardOut,
)
from ._spec import RouteSpec

_log = logging.getLogger(__name__)

#: wrk-ork's error codes the API passes on as they are (their statuses are in
#: :data:`~nodes.app_node.codes.STATUS`); any other is ``ORK_ERROR``.
ORK_CODES = frozenset({codes.NOT_FOUND, codes.INVALID_STATE, codes.CONFLICT, codes.BAD_REQUEST,
                       codes.INVALID_PARAMS, codes.QUOTA_EXCEEDED})


def ork_unavailable(message: str) -> ApiError:
    return ApiError(codes.ORK_UNAVAILABLE, message)


async def ork_call(ctx: Ctx, method: Method, params: BaseModel, *,
                   raw_codes: frozenset[str] = frozenset()) -> Any:
    """``method(params)`` on wrk-ork; its refusals and absence become ApiErrors
    (but an RpcError whose code is in ``raw_codes``, raised as it is)."""
    ork = ctx.services.ork
    if ork is None:
        raise ork_unavailable("wrk-ork is not configured on app-node; set its key and "
                              "address in app-node's settings")
    try:
        return await ork.call(method, params)
    except OrkUnavailable as exc:
        raise ork_unavailable(str(exc)) from None
    except RpcError as exc:
        if exc.code in raw_codes:
            raise
        if exc.code == "FORBIDDEN":
            raise ork_unavailable("wrk-ork refuses app-node's key (a misconfiguration): "
                                  "add app-node's public key to wrk-ork's app_nodes") from None
        if exc.code not in ORK_CODES:
            raise ApiError(codes.ORK_ERROR, f"wrk-ork failed ({exc.code}): {exc.message}; "
                           "retry, or see wrk-ork's log") from None
        field = None
        if exc.code == "INVALID_PARAMS" and isinstance(exc.data, list) and exc.data:
            field = str(exc.data[0].get("field", "")).removeprefix("spec.") or None
        elif exc.code == "CONFLICT":
            field = "served_name"
        elif exc.code == "QUOTA_EXCEEDED":
            raise ApiError(exc.code, _over_quota(exc), "gpus") from None
        raise ApiError(exc.code, exc.message, field) from None


def _over_quota(exc: RpcError) -> str:
    """The 409's message from wrk-ork's QUOTA_EXCEEDED data: the quota, the use, the ask."""
    data = exc.data if isinstance(exc.data, dict) else {}
    try:
        scope, quota = str(data["scope"]), int(data["quota"])
        in_use, requested = int(data["in_use"]), int(data["requested"])
    except (KeyError, TypeError, ValueError):
        return exc.message
    whose = "the team's jobs" if scope == "team" else "your jobs in the team"
    which = "GPU quota" if scope == "team" else "per-user GPU quota"
    return (f"over the team's {which} of {quota}: {whose} hold or may hold {in_use} GPUs "
            f"and this job asks for {requested} (gpus x replicas); delete a job (Pending "
            "and Failed ones count until deleted) or ask a platform operator to raise it "
            "(cosmicac teams quota set)")


async def monitor_facts(ctx: Ctx, jobs: list[tuple[str, str]]
                        ) -> tuple[dict[str, str], dict[str, float]]:
    """What wrk-monitor knows of ``jobs`` (id, type): inference jobs' model health,
    and when each job's agents were last heard from, by id.

    Empty when wrk-monitor is not configured, not connected, slow or refusing:
    these decorate a job, they never fail or stall a route.
    """
    monitor = ctx.services.monitor
    health: dict[str, str] = {}
    heard: dict[str, float] = {}
    if monitor is None or not jobs:
        return health, heard
    inference = [job_id for job_id, type_ in jobs if type_ == JobType.INFERENCE.value]
    try:
        found = await monitor.job_health(inference)
        health = {job_id: job.health.value for job_id, job in found.items()
                  if job.health is not None}
        # Each on its own: a wrk-monitor without agents.heard still gives health.
        heard = await monitor.agents_heard([job_id for job_id, _ in jobs])
    except (MonitorUnavailable, RpcError) as exc:
        _log.debug("jobs.monitor_unknown reason=%s", exc)
    return health, heard


async def decorate(ctx: Ctx, jobs: list[JobOut]) -> list[JobOut]:
    """``jobs`` with what wrk-monitor knows of them (:func:`monitor_facts`)."""
    if ctx.services.monitor is None or not jobs:
        return jobs
    health, heard = await monitor_facts(ctx, [(job.id, job.type) for job in jobs])
    return [job.model_copy(update={"model_health": health.get(job.id),
                                   "agents_heard_at": heard.get(job.id)}) for job in jobs]


def _spec_of(body: JobIn, team: str, keys: tuple[str, ...], default_image: str | None,
             model_settings: dict[str, Any] | None = None) -> JobSpec:
    """The JobSpec; 422 naming the field for what JobSpec's whole-model check would not."""
    if body.image is None:
        if default_image is None:
            raise ApiError(codes.INVALID, "image: give the job's registry image "
                           "(docker://host[:port]/repo[:tag]); this deployment sets no "
                           "default_image", "image")
        body = body.model_copy(update={"image": default_image})
    if not IMAGE_PATTERN.match(body.image):
        raise ApiError(codes.INVALID, "image: give the job's registry image "
                       "(docker://host[:port]/repo[:tag])", "image")
    problem = job_type_problem(body.type, runtime=body.runtime, model=body.model,
                               served_name=body.served_name,
                               replicas=1 if body.replicas is None else body.replicas,
                               authorized_keys=keys)
    if problem is not None:
        field, message = problem
        raise ApiError(codes.INVALID, f"{field}: {message}", field)
    if body.isolated_network and body.type is not JobType.CONTAINER:
        raise ApiError(codes.INVALID, "isolated_network: only a GPU Container Job takes one "
                       "(an inference job is reached through proxy-inference)",
                       "isolated_network")
    if body.runtime_settings is not None:
        if body.type is not JobType.INFERENCE:
            raise ApiError(codes.INVALID, "runtime_settings: a GPU Container Job runs no "
                           "model server", "runtime_settings")
        flag = managed_flag_problem(str(body.runtime), body.runtime_settings.args)
        if flag is not None:
            raise ApiError(codes.INVALID, f"runtime_settings.args: {flag}",
                           "runtime_settings.args")
    data = body.model_dump(exclude={"team_id"}, exclude_none=True)
    data.setdefault("gpus", 1)
    data.update(team=team, authorized_keys=keys)
    if model_settings:
        data["model_settings"] = model_settings
    return validate(JobSpec, data)


async def _with_model_defaults(ctx: Ctx, body: JobIn) -> tuple[JobIn, dict[str, Any] | None]:
    """An inference job of a model that has a master takes the master's runtime
    and defaults for what it leaves out (the request's own values win), and the
    master's model server settings (returned apart: the job cannot set them)."""
    if body.type is not JobType.INFERENCE or body.model is None:
        return body, None
    master = await ctx.services.database.model_master(body.model)
    if master is None:
        return body, None
    given = body.model_dump(exclude_none=True)
    fill = {"runtime": master.runtime, **master.defaults}
    filled = validate(JobIn, {**{k: v for k, v in fill.items()
                                 if k in JobIn.model_fields and k != "runtime_settings"},
                              **given})
    return filled, master.defaults.get("model_settings")


def _projection(ctx: Ctx) -> JobProjection | None:
    """app-node's copy of wrk-ork's jobs if reads may use it now (synced)."""
    jobs = ctx.services.jobs
    return jobs if jobs is not None and jobs.synced else None


async def views_of(ctx: Ctx, team: str, ids: list[str]) -> dict[str, JobView]:
    """The live views of ``team``'s jobs ``ids`` that wrk-ork has, by id.

    From app-node's copy (:mod:`..job_projection`) while it is synced; what it
    lacks (a job removed since, whose record is then marked deleted; or every
    job while the copy is not synced) is asked of wrk-ork, a page at a time."""
    projection = _projection(ctx)
    views = {} if projection is None else projection.views(ids, team)
    missing = [job_id for job_id in ids if job_id not in views]
    for start in range(0, len(missing), MAX_LIST_PAGE):
        answer = await ork_call(ctx, LIST_JOBS,
                                ListJobs(team=team, ids=missing[start:start + MAX_LIST_PAGE]))
        views.update((view.id, view) for view in answer.jobs)
    return views


async def view_of(ctx: Ctx, record: JobRecord) -> JobView:
    """The job's live view: app-node's copy's while synced, else wrk-ork's
    (its NOT_FOUND marks the record deleted)."""
    projection = _projection(ctx)
    view = None if projection is None else projection.get(record.id, record.team)
    if view is None:
        view = (await _on_ork(ctx, record, GET_JOB, JobRef(job_id=record.id))).job
    return view


async def _written(ctx: Ctx, mark: Mark | None, job_id: str) -> None:
    """Read-your-writes: once wrk-ork answered a change of ``job_id`` asked after
    ``mark``, wait (bounded) until app-node's copy has it too."""
    jobs = ctx.services.jobs
    if jobs is not None and mark is not None:
        await jobs.wait_applied(job_id, mark)


def _mark(ctx: Ctx) -> Mark | None:
    jobs = ctx.services.jobs
    return None if jobs is None else jobs.mark()


def _dry_run(request: Request) -> bool:
    """``?dry_run=true`` (or ``1``): validate, authorise and preview; create nothing."""
    raw = request.query_params.get("dry_run")
    if raw is None or raw.lower() in ("false", "0"):
        return False
    if raw.lower() in ("true", "1"):
        return True
    raise ApiError(codes.INVALID, "dry_run: true or false", "dry_run")


async def create_job(ctx: Ctx, request: Request) -> Response:
    dry_run = _dry_run(request)
    session = await ctx.session(request)
    body, model_settings = await _with_model_defaults(ctx, await ctx.body(request, JobIn))
    team = team_of(session, body.team_id)
    await ctx.require_role(session, team, Role.MEMBER)
    keys: tuple[str, ...] = ()
    if body.type is JobType.CONTAINER:
        members = await ctx.store(ctx.services.store.teams.members, team)
        keys = tuple(sorted({u.cli_public_key.lower() for u, _ in members
                             if u.cli_public_key}))
    spec = _spec_of(body, team, keys, ctx.services.default_image, model_settings)
    quota = await ctx.store(ctx.services.store.quotas.get, team)
    create = CreateJob(spec=spec, created_by=session.user.id,
                       quota=GpuQuota(team_gpus=quota.gpus, user_gpus=quota.per_user_gpus))
    if dry_run:
        return ok(await _preview(ctx, create))
    mark = _mark(ctx)
    view: JobView = (await ork_call(ctx, CREATE_JOB, create)).job
    try:
        record = await ctx.store(ctx.services.store.jobs.add, id=view.id, team=team,
                                 created_by=session.user.id, spec=spec, now=ctx.now())
    except ApiError:
        # Not left running unlisted: nobody could see, restart or delete it.
        with trio.CancelScope(shield=True), contextlib.suppress(ApiError):
            await ork_call(ctx, DELETE_JOB, JobRef(job_id=view.id))
        raise
    await _written(ctx, mark, view.id)
    return ok(job_out(record, view), 201)


#: How a wrk-ork older than ``jobs.preview`` refuses it (:func:`_preview`).
_OLDER_ORK = frozenset({"UNKNOWN_METHOD", "FORBIDDEN"})


async def _preview(ctx: Ctx, create: CreateJob) -> JobPreviewOut:
    """What wrk-ork would do with ``create`` now (``jobs.preview``): its refusals as
    create's (409 over a quota, a served name taken...), else the would-be job.

    A wrk-ork older than ``jobs.preview`` refuses the method, ``UNKNOWN_METHOD`` or,
    from its access table, ``FORBIDDEN`` (contracts/ork.py): then the preview says
    the placement is unknown, after ``service.status`` (which app-node may call)
    tells that refusal from wrk-ork refusing app-node's key, which stays a 503.
    """
    spec = create.spec
    try:
        preview: JobPreview | None = await ork_call(ctx, PREVIEW_JOB, create,
                                                    raw_codes=_OLDER_ORK)
    except RpcError as exc:
        if exc.code == "FORBIDDEN" and not await _ork_lacks_preview(ctx):
            raise ork_unavailable("wrk-ork refuses app-node's key (a misconfiguration): "
                                  "add app-node's public key to wrk-ork's app_nodes") from None
        _log.info("jobs.preview_unknown reason=%s", exc.code)
        preview = None
    if preview is None:
        replicas = [ReplicaPreviewOut(index=i, status="unknown", nodes=[], gpus=[])
                    for i in range(spec.replicas)]
        return JobPreviewOut(team=spec.team, name=spec.name, type=spec.type.value,
                             status=None, reason="placement unknown: wrk-ork is older than "
                             "jobs.preview (the job passed every check of app-node)",
                             rack=None, replicas=replicas, spec=spec)
    status = api_status(preview.status)
    replicas = [ReplicaPreviewOut(index=i, status=status, nodes=[], gpus=[])
                for i in range(spec.replicas)]
    for replica, placement in zip(replicas, preview.placements, strict=False):
        replica.nodes = [share.node for share in placement.shares]
        replica.gpus = [share.gpus for share in placement.shares]
    return JobPreviewOut(team=spec.team, name=spec.name, type=spec.type.value, status=status,
                         reason=preview.reason, rack=preview.rack, replicas=replicas,
                         spec=spec)


async def _ork_lacks_preview(ctx: Ctx) -> bool:
    """Whether wrk-ork answers a method app-node may call: then its FORBIDDEN of
    ``jobs.preview`` means it does not know the method (it is older), not that it
    refuses app-node's key."""
    try:
        await ork_call(ctx, STATUS, StatusRequest())
    except ApiError:
        return False
    return True


async def list_jobs(ctx: Ctx, request: Request) -> Response:
    query = request.query_params
    store = ctx.services.store

    def team_and_page(session: Session) -> tuple[str, Page[JobRecord]]:
        # In the session's trip to a thread: the caller's role, then the page.
        team = team_of(session, query.get("team_id"))
        require_member(store.teams.role_of(session.user.id, team), team)
        limit = query.get("limit", "50")
        if not limit.isdigit():
            raise ApiError(codes.INVALID, "limit: a whole number", "limit")
        return team, store.jobs.page(team, limit=int(limit), cursor=query.get("cursor"))

    _, (team, page) = await ctx.session_and(request, team_and_page)
    # Only the page's jobs, from app-node's copy: no call to wrk-ork per listing.
    views = await views_of(ctx, team, [record.id for record in page.items])
    jobs = []
    for record in page.items:
        view = views.get(record.id)
        if view is None:  # wrk-ork finished deleting it: the record stays as history
            record = await ctx.store(ctx.services.store.jobs.mark_deleted, record.id,
                                     now=ctx.now())
            continue
        jobs.append((record, view))
    health, heard = await monitor_facts(ctx, [(r.id, v.spec.type.value) for r, v in jobs])
    # JobsOut's JSON, each job's kept while unchanged (_job_documents.py).
    documents = b",".join(ctx.documents.json(record, view, health.get(record.id),
                                             heard.get(record.id)) for record, view in jobs)
    after = b"null" if page.next is None else json.dumps(page.next).encode()
    return Response(b'{"jobs":[' + documents + b'],"next":' + after + b"}",
                    media_type="application/json")


async def _own_job(ctx: Ctx, session: Session, job_id: str) -> JobRecord:
    """The job's record; 404 for a missing, deleted or another team's job."""
    missing = ApiError(codes.NOT_FOUND, f"no job {job_id} in your teams", "job")
    store = ctx.services.store

    def record_and_role() -> tuple[JobRecord, Role | None]:  # one trip to a thread
        record = store.jobs.get(job_id)
        return record, store.teams.role_of(session.user.id, record.team)

    try:
        record, role = await ctx.store(record_and_role)
    except ApiError as exc:
        if exc.status == 404:
            raise missing from None
        raise
    if role is None or record.deleted_at is not None:
        raise missing
    return record


async def _on_ork(ctx: Ctx, record: JobRecord, method: Method, params: BaseModel) -> Any:
    """A whole-job call; wrk-ork's NOT_FOUND marks the record deleted (it is gone).

    Replica calls go through :func:`ork_call` alone: their NOT_FOUND may be the replica's.
    """
    try:
        return await ork_call(ctx, method, params)
    except ApiError as exc:
        if exc.code == "NOT_FOUND":
            await ctx.store(ctx.services.store.jobs.mark_deleted, record.id, now=ctx.now())
        raise


async def get_job(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    record = await _own_job(ctx, session, request.path_params["job"])
    view = await view_of(ctx, record)
    [job] = await decorate(ctx, [job_out(record, view)])
    return ok(job)


async def job_wireguard(ctx: Ctx, request: Request) -> Response:
    """The caller's way into an isolated job's network: its gateway and the caller's
    tunnel address, from the team's CLI keys as the worker's gateway has them."""
    session = await ctx.session(request)
    record = await _own_job(ctx, session, request.path_params["job"])
    if not record.spec.isolated_network:
        raise ApiError(codes.CONFLICT, f"job {record.id} has no isolated network (create a "
                       "GPU Container Job with isolated_network)", "job")
    key = session.user.cli_public_key
    if not key:
        raise ApiError(codes.CONFLICT, "your account has no CLI key: run cosmicac login "
                       "from the CLI you will connect with", "cli_public_key")
    view = await view_of(ctx, record)
    gateway = next((r.gateway for r in view.replicas if r.gateway is not None), None)
    if gateway is None:
        raise ApiError(codes.CONFLICT, f"job {record.id}'s WireGuard gateway is not up yet; "
                       "try again once the job is running", "job")
    members = (await ctx.store(ctx.services.store.teams.shell_keys)).get(record.team, ())
    if key.lower() not in members:
        raise ApiError(codes.CONFLICT, "your CLI key is not among the team's yet; try again "
                       "in a few seconds", "cli_public_key")
    addresses = assign_addresses(gateway.tunnel_subnet, [bytes.fromhex(k) for k in members])
    return ok(WireGuardOut(job=record.id, cli_public_key=key.lower(),
                           gateway_public_key=gateway.public_key,
                           endpoint=gateway.endpoint,
                           address=str(addresses[bytes.fromhex(key.lower())]),
                           tunnel_subnet=gateway.tunnel_subnet,
                           networks=list(gateway.networks)))


async def restart_job(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    record = await _own_job(ctx, session, request.path_params["job"])
    mark = _mark(ctx)
    view = (await _on_ork(ctx, record, RESTART_JOB, JobRef(job_id=record.id))).job
    await _written(ctx, mark, record.id)
    return ok(job_out(record, view))


async def delete_job(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    record = await _own_job(ctx, session, request.path_params["job"])
    mark = _mark(ctx)
    try:
        view = (await ork_call(ctx, DELETE_JOB, JobRef(job_id=record.id))).job
    except ApiError as exc:
        if exc.code != "NOT_FOUND":
            raise
        view = None
    else:
        await _written(ctx, mark, record.id)
    if view is None:
        await ctx.store(ctx.services.store.jobs.mark_deleted, record.id, now=ctx.now())
        return ok(DeletedJobOut(gone=True, job=None))
    return ok(DeletedJobOut(gone=False, job=job_out(record, view)), 202)


def _replica(request: Request) -> int:
    raw = request.path_params["replica"]
    if not raw.isdigit() or int(raw) >= 1024:
        raise ApiError(codes.INVALID, "replica: a replica index (0, 1, ...)", "replica")
    return int(raw)


async def restart_replica(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    record = await _own_job(ctx, session, request.path_params["job"])
    ref = ReplicaRef(job_id=record.id, replica=_replica(request))
    mark = _mark(ctx)
    view = (await ork_call(ctx, RESTART_REPLICA, ref)).job
    await _written(ctx, mark, record.id)
    return ok(job_out(record, view))


async def delete_replica(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    record = await _own_job(ctx, session, request.path_params["job"])
    ref = ReplicaRef(job_id=record.id, replica=_replica(request))
    mark = _mark(ctx)
    view = (await ork_call(ctx, DELETE_REPLICA, ref)).job
    await _written(ctx, mark, record.id)
    return ok(job_out(record, view))


ROUTES = [
    RouteSpec("POST", "/jobs", create_job, "Create a job in the active team (or team_id); "
              "with dry_run=true, create nothing and answer 200 with the job as it would "
              "be created and where it would run or why it would wait (JobPreviewOut)",
              JobIn, JobOut, 201, query=("dry_run",)),
    RouteSpec("GET", "/jobs", list_jobs, "The team's jobs with their live status",
              answer=JobsOut, query=("team_id", "limit", "cursor")),
    RouteSpec("GET", "/jobs/{job}", get_job, "A job with its replicas", answer=JobOut),
    RouteSpec("GET", "/jobs/{job}/wireguard", job_wireguard, "The caller's WireGuard peer "
              "details for an isolated job's network (team members)", answer=WireGuardOut),
    RouteSpec("POST", "/jobs/{job}/restart", restart_job, "Restart every replica",
              answer=JobOut),
    RouteSpec("DELETE", "/jobs/{job}", delete_job, "Delete a job (202 while it is removed)",
              answer=DeletedJobOut),
    RouteSpec("POST", "/jobs/{job}/replicas/{replica}/restart", restart_replica,
              "Restart one replica", answer=JobOut),
    RouteSpec("DELETE", "/jobs/{job}/replicas/{replica}", delete_replica,
              "Delete one replica (the job keeps the others)", answer=JobOut),
]

__all__ = ["ROUTES", "decorate", "job_out", "ork_call", "ork_unavailable", "view_of",
           "views_of"]
