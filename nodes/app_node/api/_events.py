"""Job status changes as server-sent events: one job's, or every job of a team's.

``GET /api/jobs/{job}/events`` (a member of the job's team; 404 otherwise, like
``GET /api/jobs/{job}``) answers ``text/event-stream``:

- ``event: job`` first, its data the job document exactly as ``GET
  /api/jobs/{job}`` returns it (a client needs no separate GET); then again
  after every status change of the job, **re-read** (from app-node's copy of
  wrk-ork's jobs, which has the change before the stream is told, or from
  wrk-ork while the copy is not synced; so statuses
  use the API's names, ``running`` for Active, and replicas are current). A
  change that leaves the document as it was last sent sends nothing.
- ``event: gone`` (data ``{"id"}``) once wrk-ork has removed the job; the
  stream ends (the job's record is marked deleted, as ``GET`` would).
- ``event: lagged`` (data ``{"id"}``) when app-node dropped this stream (it
  fell ``capacity`` changes behind, or a re-read failed): the stream ends; the
  client subscribes again (and gets the current document first).
- a comment (``: keep-alive``) every :data:`KEEPALIVE_S` seconds of silence,
  so proxies keep the connection and clients can tell it is alive.

``GET /api/jobs/events?team_id=`` (a member; the active team by default) streams
every job of the team: ``event: ready`` (data ``{"team"}``) once subscribed
(list the jobs after it and no change is missed), then ``event: status`` per
change, data ``{id, team, status, previous, reason, at}`` (wrk-ork's
``JobEvent`` with the API's status names; ``at`` in wrk-ork's seconds), ``event:
gone`` (``{id, team}``) per removed job, keep-alives, and ``event: lagged`` then
the end when it fell behind or app-node's watch of wrk-ork restarted (changes
may have been missed: list again and subscribe again).

A stream ends when the client disconnects. Who may follow is checked when it
starts (a member who leaves the team keeps an open stream until it ends). An
error after the answer began (the store failing) ends the stream, logged. The
rate limiter counts the
connection as one request (it is asked once, before the route runs; a long
answer costs nothing more); app-node holds at most ``JobHub.max_subscribers``
streams (503 ``TOO_MANY_STREAMS`` beyond). Without wrk-ork (or its watch) the
routes answer 503 ``ORK_UNAVAILABLE``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import ExitStack
from typing import Any

import trio
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from contracts.model import api_status
from contracts.ork import JobEvent

from .. import codes
from ..job_events import RESYNC, JobHub, Subscription, TooManySubscribers
from ..model import JobRecord, Role
from ._common import ApiError, Ctx, team_of
from ._jobs import _own_job, decorate, job_out, ork_unavailable, view_of
from ._models import JobOut
from ._spec import RouteSpec

__all__ = ["KEEPALIVE_S", "ROUTES", "EventStream", "JobStatusOut", "sse"]

_log = logging.getLogger(__name__)

#: Seconds of silence before a keep-alive comment.
KEEPALIVE_S = 15.0

Write = Callable[[str], Awaitable[None]]
Produce = Callable[[Write], Awaitable[None]]


class JobStatusOut(BaseModel):
    """One status change in a team's stream (``event: status``)."""

    id: str
    team: str
    #: The API's names (``running`` for Active); None in ``gone``.
    status: str | None
    previous: str | None
    reason: str
    at: float


def sse(event: str, data: Any, *, id: str | None = None) -> str:
    """One server-sent event: ``event:``, its ``id:`` if given, and one ``data:`` line
    of JSON (``json.dumps`` escapes line breaks, so one line holds it all)."""
    head = f"event: {event}\n" + (f"id: {id}\n" if id is not None else "")
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n"


class EventStream(Response):
    """A ``text/event-stream`` answer written by ``produce(write)`` until it returns
    or the client disconnects (then ``produce`` is cancelled); ``finally`` (an
    :class:`ExitStack`: the subscription) is closed either way."""

    media_type = "text/event-stream"

    def __init__(self, produce: Produce, finally_: ExitStack) -> None:
        # Not Response.__init__: it would add ``content-length: 0`` for the empty body.
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache"),
                            # nginx-style proxies: pass each event on at once
                            (b"x-accel-buffering", b"no")]
        self._produce, self._finally = produce, finally_

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        with self._finally:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            gone = False

            async def write(text: str) -> None:
                await send({"type": "http.response.body", "body": text.encode(),
                            "more_body": True})

            async with trio.open_nursery() as nursery:
                async def until_disconnect() -> None:
                    nonlocal gone
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    gone = True
                    nursery.cancel_scope.cancel()

                nursery.start_soon(until_disconnect)
                try:
                    await self._produce(write)
                except Exception:  # the status is sent: all that is left is to end
                    _log.exception("%s: the event stream failed", scope.get("path"))
                nursery.cancel_scope.cancel()
            if not gone:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


def _hub(ctx: Ctx) -> JobHub:
    hub = ctx.services.events
    if hub is None or ctx.services.ork is None:
        raise ork_unavailable("app-node does not follow wrk-ork's job changes (wrk-ork is "
                              "not configured); poll GET /api/jobs/{job} instead")
    return hub


def _subscribe(stack: ExitStack, hub: JobHub, **filter_: str) -> Subscription:
    try:
        return stack.enter_context(hub.subscribe(**filter_))
    except TooManySubscribers as exc:
        raise ApiError(codes.TOO_MANY_STREAMS, str(exc)) from None


async def _next(sub: Subscription, write: Write) -> Any:
    """The next item, sending keep-alives while none comes; None once dropped."""
    while True:
        with trio.move_on_after(KEEPALIVE_S):
            try:
                return await sub.receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return None
        await write(": keep-alive\n\n")


async def _read(ctx: Ctx, record: JobRecord) -> dict[str, Any] | None:
    """The job's document now; None once wrk-ork no longer has it (record marked deleted)."""
    try:
        view = await view_of(ctx, record)
    except ApiError as exc:
        if exc.code == "NOT_FOUND":
            return None
        raise
    # With what wrk-monitor knows (model health, agents last heard), as GET /jobs/{id}:
    # a page that renders the job from this stream shows them too.
    [job] = await decorate(ctx, [job_out(record, view)])
    return job.model_dump(mode="json")


async def job_events(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    record = await _own_job(ctx, session, request.path_params["job"])
    hub = _hub(ctx)
    stack = ExitStack()
    try:
        # Subscribed before the first read: no change falls between the two.
        sub = _subscribe(stack, hub, job_id=record.id)
        first = await _read(ctx, record)
        if first is None:
            raise ApiError(codes.NOT_FOUND, f"no job {record.id} in your teams", "job")
    except BaseException:
        stack.close()
        raise

    async def produce(write: Write) -> None:
        last = first
        await write(sse("job", first))
        while True:
            item = await _next(sub, write)
            if item is None:
                await write(sse("lagged", {"id": record.id}))
                return
            if isinstance(item, JobEvent) and item.status is None:
                await ctx.store(ctx.services.store.jobs.mark_deleted, record.id, now=ctx.now())
                await write(sse("gone", {"id": record.id}))
                return
            try:  # a change or a resync: what is the job now?
                now = await _read(ctx, record)
            except ApiError:  # wrk-ork unreachable: the client retries and learns why
                await write(sse("lagged", {"id": record.id}))
                return
            if now is None:
                await write(sse("gone", {"id": record.id}))
                return
            if now != last:
                await write(sse("job", now))
                last = now

    return EventStream(produce, stack)


#: How long the team's stream waits for app-node's record of a job wrk-ork has
#: just announced: the create route writes it as soon as wrk-ork answers, and
#: wrk-ork's first events can come before that write is done.
RECORD_WAIT_S = 5.0


async def _recorded(ctx: Ctx, job_id: str) -> bool:
    """Whether app-node holds the job's record, waiting up to :data:`RECORD_WAIT_S`
    for it: a status is announced only once ``GET /api/jobs/{job}`` can answer it."""
    deadline = trio.current_time() + RECORD_WAIT_S
    delay = 0.005
    while True:
        try:
            await ctx.store(ctx.services.store.jobs.get, job_id)
            return True
        except ApiError as exc:
            if exc.status != 404:
                raise
        if trio.current_time() >= deadline:
            return False
        await trio.sleep(delay)
        delay = min(delay * 2, 0.2)


async def team_events(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    team = team_of(session, request.query_params.get("team_id"))
    await ctx.require_role(session, team, Role.MEMBER)
    hub = _hub(ctx)
    stack = ExitStack()
    sub = _subscribe(stack, hub, team=team)

    async def produce(write: Write) -> None:
        await write(sse("ready", {"team": team}))
        recorded: set[str] = set()  # jobs this stream has seen app-node's record of
        while True:
            item = await _next(sub, write)
            if item is None or item is RESYNC:
                await write(sse("lagged", {"team": team}))
                return
            assert isinstance(item, JobEvent)
            if item.status is None:
                recorded.discard(item.job_id)
                await write(sse("gone", {"id": item.job_id, "team": item.team}))
                continue
            if item.job_id not in recorded:
                if not await _recorded(ctx, item.job_id):
                    continue  # never recorded here (its creation was undone)
                recorded.add(item.job_id)
            await write(sse("status", JobStatusOut(
                id=item.job_id, team=item.team, status=api_status(item.status),
                previous=None if item.previous is None else api_status(item.previous),
                reason=item.reason, at=item.at).model_dump(mode="json")))

    return EventStream(produce, stack)


_STREAM = "text/event-stream"

ROUTES = [
    RouteSpec("GET", "/jobs/events", team_events,
              "Server-sent events: ready, then status/gone per change of the team's jobs; "
              "lagged (then the end) when changes may have been missed",
              answer=JobStatusOut, query=("team_id",), media_type=_STREAM),
    RouteSpec("GET", "/jobs/{job}/events", job_events,
              "Server-sent events: the job document, again after each status change; "
              "gone once removed; lagged (then the end) to subscribe again",
              answer=JobOut, media_type=_STREAM),
]
