"""Racks and nodes: the platform's hardware, for platform operators only.

An owner or admin of *a* team is not enough: any user can create a team and
own it. The platform operators are the owners and admins of the **operators'
team**: the team the first admin (the first user) created at sign-up
(``store.users.create_first_admin``), i.e. the oldest of the first user's teams. If that
team is deleted, the first user's next-oldest team takes its place. Everyone
else gets 403.

Every route calls wrk-ork (:func:`~._jobs.ork_call` maps its errors).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import trio
from starlette.requests import Request
from starlette.responses import Response

from contracts.ork import (
    LIST_NODES,
    LIST_RACKS,
    REGISTER_RACK,
    RELEASE_NODES,
    REMOVE_RACK,
    RESERVE_NODES,
    Empty,
    RackInfo,
    RackRef,
    RegisterRack,
    ReleaseNodes,
    ReserveNodes,
)

from .. import codes
from ..job_events import RESYNC
from ..model import Role
from ._common import ApiError, Ctx, Session, forbidden, ok, validate
from ._events import EventStream, Write, _hub, _next, _subscribe, sse
from ._jobs import ork_call
from ._models import NodesOut, RackIn, RacksOut, ReleaseIn, ReserveIn
from ._spec import RouteSpec


def _operators_team(ctx: Ctx) -> str | None:
    """The first admin's sign-up team: the oldest team of the first user (by insertion),
    one they own preferred on a tie (a team they were invited into is not it)."""
    store = ctx.services.store
    first = store.users.page(limit=1).items
    if not first:
        return None
    teams = store.teams.of_user(first[0].id)
    if not teams:
        return None
    team, _ = min(teams, key=lambda tr: (tr[0].created_at, tr[1] is not Role.OWNER, tr[0].id))
    return team.id


async def is_operator(ctx: Ctx, user_id: str) -> bool:
    """Is ``user_id`` an owner or admin of the operators' team?"""
    team = await ctx.store(_operators_team, ctx)
    role = None if team is None else await ctx.store(ctx.services.store.teams.role_of,
                                                     user_id, team)
    return role in (Role.OWNER, Role.ADMIN)


async def require_operator(ctx: Ctx, session: Session) -> None:
    """403 unless the caller is an owner or admin of the operators' team."""
    if not await is_operator(ctx, session.user.id):
        raise forbidden("this is for platform operators (owners and admins of the first "
                        "admin's team): racks, nodes, model masters, the list of users; "
                        "ask one of them")


async def _operator(ctx: Ctx, request: Request) -> None:
    await require_operator(ctx, await ctx.session(request))


async def list_racks(ctx: Ctx, request: Request) -> Response:
    await _operator(ctx, request)
    return ok(RacksOut(racks=list((await ork_call(ctx, LIST_RACKS, Empty())).racks)))


async def register_rack(ctx: Ctx, request: Request) -> Response:
    await _operator(ctx, request)
    body = await ctx.body(request, RackIn)
    params = validate(RegisterRack, {"rack": body.rack.lower(), "location": body.location,
                                     "name": body.name})
    rack: RackInfo = (await ork_call(ctx, REGISTER_RACK, params)).rack
    return ok(rack, 201)


async def remove_rack(ctx: Ctx, request: Request) -> Response:
    await _operator(ctx, request)
    params = validate(RackRef, {"rack": request.path_params["rack"].lower()})
    await ork_call(ctx, REMOVE_RACK, params)
    return ok()


async def list_nodes(ctx: Ctx, request: Request) -> Response:
    await _operator(ctx, request)
    return ok(NodesOut(nodes=list((await ork_call(ctx, LIST_NODES, Empty())).nodes)))


async def reserve_nodes(ctx: Ctx, request: Request) -> Response:
    await _operator(ctx, request)
    body = await ctx.body(request, ReserveIn)
    try:
        await ctx.store(ctx.services.store.teams.get, body.team)
    except ApiError as exc:
        if exc.status == 404:
            raise ApiError(codes.NOT_FOUND, f"no team {body.team}", "team") from None
        raise
    params = validate(ReserveNodes, {"rack": body.rack.lower(), "nodes": body.nodes,
                                     "team": body.team})
    await ork_call(ctx, RESERVE_NODES, params)
    return ok()


async def release_nodes(ctx: Ctx, request: Request) -> Response:
    await _operator(ctx, request)
    body = await ctx.body(request, ReleaseIn)
    params = validate(ReleaseNodes, {"rack": body.rack.lower(), "nodes": body.nodes})
    await ork_call(ctx, RELEASE_NODES, params)
    return ok()


async def _capacity(ctx: Ctx) -> dict[str, Any]:
    racks = (await ork_call(ctx, LIST_RACKS, Empty())).racks
    nodes = (await ork_call(ctx, LIST_NODES, Empty())).nodes
    return {"racks": RacksOut(racks=list(racks)).model_dump(mode="json")["racks"],
            "nodes": NodesOut(nodes=list(nodes)).model_dump(mode="json")["nodes"]}


async def racks_events(ctx: Ctx, request: Request) -> Response:
    """Server-sent events of the racks' capacity (operators): ``racks`` ``{racks,
    nodes}`` (as ``GET /racks`` and ``GET /nodes``) at once, then again whenever a
    job's change moved it (GPUs claimed or freed); keep-alives meanwhile; ``lagged``
    then the end when the stream fell behind or wrk-ork went away (open it again).
    A rack's own report (a node added) shows at the next job change or reopen."""
    await _operator(ctx, request)
    hub = _hub(ctx)
    stack = ExitStack()
    try:
        sub = _subscribe(stack, hub)  # before the first read: no change falls between
        first = await _capacity(ctx)
    except BaseException:
        stack.close()
        raise

    async def produce(write: Write) -> None:
        last = first
        await write(sse("racks", first))
        while True:
            item = await _next(sub, write)
            if item is None or item is RESYNC:
                await write(sse("lagged", {}))
                return
            while True:  # a burst of changes is one read
                try:
                    sub.receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            try:
                now = await _capacity(ctx)
            except ApiError:  # wrk-ork unreachable: the client opens it again
                await write(sse("lagged", {}))
                return
            if now != last:
                await write(sse("racks", now))
                last = now

    return EventStream(produce, stack)


ROUTES = [
    RouteSpec("GET", "/racks", list_racks, "Registered racks with capacity (operators)",
              answer=RacksOut),
    RouteSpec("POST", "/racks", register_rack, "Register a worker's rack (operators)",
              RackIn, RackInfo, 201),
    RouteSpec("GET", "/racks/events", racks_events, "Server-sent events of the racks' "
              "capacity: racks at once, then after each change that moved it (operators)"),
    RouteSpec("DELETE", "/racks/{rack}", remove_rack, "Remove a rack (operators)",
              status=204),
    RouteSpec("GET", "/nodes", list_nodes, "Every node with free GPUs (operators)",
              answer=NodesOut),
    RouteSpec("POST", "/nodes/reserve", reserve_nodes, "Keep nodes for one team (operators)",
              ReserveIn, status=204),
    RouteSpec("POST", "/nodes/release", release_nodes, "Release reserved nodes (operators)",
              ReleaseIn, status=204),
]

__all__ = ["ROUTES", "require_operator"]
