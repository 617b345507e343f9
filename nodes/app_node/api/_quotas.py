"""A team with its GPU quotas; operators set the quotas.

Who may do what: a team's members read the team and its quotas; platform
operators (:func:`~._racks.require_operator`) read and set any team's quotas,
member or not. A team admin or owner who is not an operator gets 403
``FORBIDDEN``; someone outside the team who is not an operator gets 404, as for
every other team route.

The quotas live in app-node's store (:mod:`~nodes.app_node.store._quotas`);
``POST /api/jobs`` sends them to wrk-ork with the job, and wrk-ork checks them
in the call that adds the job (409 ``QUOTA_EXCEEDED`` naming the quota, the
GPUs the team's jobs hold or may hold, and the request).
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response

from .. import codes
from ..model import Role, Team, TeamQuota
from ._common import ApiError, Ctx, Session, ok
from ._models import QuotaIn, QuotaOut, TeamInfoOut
from ._racks import require_operator
from ._spec import RouteSpec

__all__ = ["ROUTES", "is_operator", "quota_out", "team_info"]

_log = logging.getLogger(__name__)


def quota_out(team_id: str, quota: TeamQuota) -> QuotaOut:
    return QuotaOut(team=team_id, gpus=quota.gpus, per_user_gpus=quota.per_user_gpus,
                    updated_at=quota.updated_at)


def team_info(team: Team, role: Role, quota: TeamQuota | None) -> TeamInfoOut:
    """A team as ``GET /api/teams`` shows it; ``quota`` None: unlimited."""
    return TeamInfoOut(id=team.id, name=team.name, role=role,
                       quota=quota_out(team.id, quota or TeamQuota()))


async def is_operator(ctx: Ctx, session: Session) -> bool:
    """Whether the caller is a platform operator (:func:`~._racks.require_operator`)."""
    try:
        await require_operator(ctx, session)
    except ApiError as exc:
        if exc.status != 403:
            raise
        return False
    return True


async def _readable(ctx: Ctx, session: Session, team_id: str) -> None:
    """A member of the team, or an operator; else 404 (the team's existence does not leak)."""
    role = await ctx.store(ctx.services.store.teams.role_of, session.user.id, team_id)
    if role is None and not await is_operator(ctx, session):
        raise ApiError(codes.NOT_FOUND, f"no team {team_id} among yours; check the id")


async def get_team(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id = request.path_params["team"]
    role = await ctx.require_role(session, team_id, Role.MEMBER)
    store = ctx.services.store
    team = await ctx.store(store.teams.get, team_id)
    return ok(team_info(team, role, await ctx.store(store.quotas.get, team_id)))


async def get_quota(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id = request.path_params["team"]
    await _readable(ctx, session, team_id)
    return ok(quota_out(team_id, await ctx.store(ctx.services.store.quotas.get, team_id)))


async def set_quota(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team_id = request.path_params["team"]
    if not await is_operator(ctx, session):
        role = await ctx.store(ctx.services.store.teams.role_of, session.user.id, team_id)
        if role is None:
            raise ApiError(codes.NOT_FOUND, f"no team {team_id} among yours; check the id")
        raise ApiError(codes.FORBIDDEN, "only platform operators (owners and admins of the "
                       "first admin's team) set a team's GPU quotas; you are "
                       f"{role.value} of this team; ask an operator")
    body = await ctx.body(request, QuotaIn)
    quota = await ctx.store(ctx.services.store.quotas.set, team_id,
                            body.model_dump(include=body.model_fields_set), now=ctx.now())
    _log.info("teams.quota_set team=%s gpus=%s per_user_gpus=%s by=%s", team_id, quota.gpus,
              quota.per_user_gpus, session.user.id)
    return ok(quota_out(team_id, quota))


ROUTES = [
    RouteSpec("GET", "/teams/{team}", get_team, "The team with your role and its GPU quotas "
              "(members)", answer=TeamInfoOut),
    RouteSpec("GET", "/teams/{team}/quota", get_quota, "The team's GPU quotas (members, "
              "operators)", answer=QuotaOut),
    RouteSpec("PATCH", "/teams/{team}/quota", set_quota, "Set the team's GPU quotas "
              "(operators; null: unlimited; fields left out keep their value)", QuotaIn,
              QuotaOut),
]
