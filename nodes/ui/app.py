"""The UI's routes: pages rendered from Jinja2 templates over app-node's ``/api``.

Every form is a real ``<form>`` that works without JavaScript: a POST answers
303 to the page to show next, or the form again (422 and the like) with the
API's errors tied to its fields and the values typed kept. A page the user may
not open answers with a readable page, never raw JSON.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from nodes.kit.forwarded import TrustedProxies, forwarded_for

from .api import ApiClient, ApiError
from .guard import SECURITY_HEADERS, cross_site_reason, request_is_https
from .job_pages import JobPages
from .key_pages import KeyPages
from .live import KEEPALIVE, Live, Piece, TopicError, TopicSource
from .log_pages import LogPages
from .operator_pages import OperatorPages
from .sessions import COOKIE, Session, SessionStore
from .team_pages import TeamPages
from .views import FormErrors, job_row, status_label

__all__ = ["UiApp", "build_app"]

log = logging.getLogger(__name__)

HERE = Path(__file__).parent

#: Form fields at most this long are read (a password manager's longest).
_MAX_FIELD = 4096


class UiApp:
    """The Starlette app with what its routes share: the API, the sessions, templates."""

    def __init__(self, http: httpx.AsyncClient, sessions: SessionStore, *,
                 streams: httpx.AsyncClient | None = None, max_streams: int = 1000,
                 trusted_proxies: TrustedProxies | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.api = ApiClient(http, streams)
        #: The door in front (the entry point, Caddy): its X-Forwarded-For is believed.
        self.trusted = trusted_proxies or TrustedProxies()
        #: The live streams' topics and their upstreams (at most ``max_streams``).
        self.live = Live(max_streams)
        self.live.register("jobs", self._jobs_topic)
        self.sessions = sessions
        self._clock, self._wall = clock, wall
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                                     autoescape=select_autoescape(["html"]),
                                     trim_blocks=False, lstrip_blocks=False)
        self.starlette = Starlette(routes=[
            Route("/healthz", self._healthz),
            Route("/", self._home),
            Route("/login", self._login_page),
            Route("/login", self._login, methods=["POST"]),
            Route("/signup", self._signup_page),
            Route("/signup", self._signup, methods=["POST"]),
            Route("/logout", self._logout, methods=["POST"]),
            Route("/team/active", self._switch_team, methods=["POST"]),
            Route("/jobs", self._jobs),
            Route("/ui/stream", self._stream),
            *JobPages(self).routes(),
            *LogPages(self).routes(),
            *KeyPages(self).routes(),
            *TeamPages(self).routes(),
            *OperatorPages(self).routes(),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ])

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.starlette(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        host = headers.get("x-forwarded-host") or headers.get("host", "")
        refused = cross_site_reason(scope["method"], headers, host)

        async def send_secured(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [
                    *message.get("headers", ()),
                    *((k.encode(), v.encode()) for k, v in SECURITY_HEADERS)]}
            await send(message)

        if refused is not None:
            page = self.render("error.html", None, heading="Refused", status=403,
                               message=f"This request was refused: {refused}. Use the "
                               "page's own buttons and forms.")
            await page(scope, receive, send_secured)
            return
        await self.starlette(scope, receive, send_secured)

    # -- rendering and sessions ------------------------------------------------

    def render(self, template: str, me: dict[str, Any] | None, *, status: int = 200,
               **context: Any) -> HTMLResponse:
        page = self.templates.get_template(template).render(me=me, **context)
        return HTMLResponse(page, status_code=status)

    def forwarded(self, request: Request) -> str | None:
        """The ``X-Forwarded-For`` to send app-node for ``request``: the browser's
        address as the door said it, then ours; app-node (trusting this UI's address)
        limits and throttles each browser, not the UI as one client."""
        peer = request.client.host if request.client else None
        return forwarded_for(peer, request.headers.getlist("x-forwarded-for"), self.trusted)

    def browser_api(self, request: Request) -> ApiClient:
        """The API as nobody yet, for this request's browser."""
        return self.api.for_browser(self.forwarded(request))

    def session_of(self, request: Request) -> Session | None:
        return self.session_of_id(request.cookies.get(COOKIE))

    def session_of_id(self, session_id: str | None) -> Session | None:
        """The live session ``session_id`` names (touched: it was used now), or None."""
        return self.sessions.get(session_id, self._clock(), self._wall())

    def clock(self) -> float:
        """Monotonic seconds now (sessions' idle time)."""
        return self._clock()

    def signed_in(self, request: Request, session: Session, to: str) -> Response:
        response = RedirectResponse(to, status_code=303)
        secure = request_is_https(request.url.scheme, request.headers)
        response.set_cookie(COOKIE, session.id, httponly=True, samesite="strict",
                            secure=secure, path="/")
        return response

    def wall(self) -> float:
        """POSIX seconds now (the clock app-node's times are in)."""
        return self._wall()

    async def form(self, request: Request, *names: str) -> dict[str, str]:
        """The named fields of the request's form, as text (missing: empty)."""
        return await _form(request, *names)

    async def page(self, request: Request,
                    work: Callable[[ApiClient, dict[str, Any]], Awaitable[Response]]
                    ) -> Response:
        """A signed-in page: ``work(api, me)``; sign-in first when there is no session
        (or app-node no longer takes its token)."""
        session = self.session_of(request)
        if session is None:
            return _to_login(request)
        api = self.api.as_user(session.token, self.forwarded(request))
        try:
            me = await api.get("/me")
            return await work(api, me)
        except ApiError as error:
            if error.status == 401:
                self.sessions.close(session.id)
                return _to_login(request)
            return self.error_page(error, None)

    def error_page(self, error: ApiError, me: dict[str, Any] | None,
                   back: str | None = None) -> HTMLResponse:
        status = error.status if 400 <= error.status < 600 else 502
        return self.render("error.html", me, status=status, heading=_ERROR_HEADINGS.get(
            status, "Something went wrong"), message=error.message or error.code,
            retry_after=error.retry_after, back=back)

    # -- routes ----------------------------------------------------------------

    async def _healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def _home(self, request: Request) -> Response:
        return RedirectResponse("/jobs", status_code=303)

    async def _login_page(self, request: Request) -> Response:
        if self.session_of(request) is not None:
            return RedirectResponse("/jobs", status_code=303)
        return self.render("login.html", None, heading="Sign in", errors=FormErrors(),
                           email="", next=_local_path(request.query_params.get("next")),
                           reset=request.query_params.get("reset") == "1")

    async def _login(self, request: Request) -> Response:
        form = await _form(request, "email", "password", "next")
        errors = FormErrors()
        try:
            answer = await self.browser_api(request).post("/auth/login", {"email": form["email"],
                                                         "password": form["password"]})
        except ApiError as error:
            errors.add(error.readable(), error.field, frozenset({"email", "password"}))
            return self.render("login.html", None, heading="Sign in", errors=errors,
                               email=form["email"], next=_local_path(form["next"]),
                               status=_form_status(error))
        session = self.sessions.open(answer["token"], answer["user"]["email"],
                                     float(answer["expires_at"]), self._clock())
        return self.signed_in(request, session, _local_path(form["next"]))

    async def _signup_page(self, request: Request) -> Response:
        return self.render("signup.html", None, heading="Create the first admin",
                           errors=FormErrors(), form=_blank(_SIGNUP), closed=False)

    async def _signup(self, request: Request) -> Response:
        form = await _form(request, *_SIGNUP, "password")
        errors = FormErrors()
        try:
            answer = await self.browser_api(request).post("/auth/signup", form)
        except ApiError as error:
            closed = error.status == 409
            errors.add(error.readable(), error.field, frozenset({*_SIGNUP, "password"}))
            return self.render("signup.html", None, heading="Create the first admin",
                               errors=errors, form=form, closed=closed,
                               status=_form_status(error))
        session = self.sessions.open(answer["token"], answer["user"]["email"],
                                     float(answer["expires_at"]), self._clock())
        return self.signed_in(request, session, "/jobs")

    async def _logout(self, request: Request) -> Response:
        session = self.sessions.close(request.cookies.get(COOKIE))
        if session is not None:
            self.live.end_session(session.id)
            try:
                await self.api.as_user(session.token, self.forwarded(request)).post(
                    "/auth/logout")
            except ApiError:
                pass  # signed out here whatever app-node says; its token expires
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    async def _switch_team(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            form = await _form(request, "team_id")
            try:
                await api.call("PUT", "/me/active-team", json={"team_id": form["team_id"]})
            except ApiError as error:
                return self.error_page(error, me, back="/jobs")
            return RedirectResponse("/jobs", status_code=303)

        return await self.page(request, work)

    async def _jobs(self, request: Request) -> Response:
        async def work(api: ApiClient, me: dict[str, Any]) -> Response:
            cursor = request.query_params.get("cursor") or None
            listed = await api.get("/jobs", cursor=cursor)
            now = self._wall()
            jobs = [job_row(job, now) for job in listed["jobs"]]
            teams = me["teams"]
            team_name = next((t["name"] for t in teams if t["id"] == me["active_team"]),
                             "your team")
            topic = f"jobs:{cursor}" if cursor else "jobs"
            return self.render("jobs.html", me, heading="Jobs", section="jobs", jobs=jobs,
                               teams=teams, active_team=me["active_team"],
                               team_name=team_name, next=listed.get("next"), topics=[topic],
                               first_page=cursor is None)

        return await self.page(request, work)


    # -- live updates: one stream per browser ------------------------------------

    async def _stream(self, request: Request) -> Response:
        """The browser's live stream: the topics its open pages show (:mod:`.live`)."""
        session = self.session_of(request)
        if session is None:
            return Response(status_code=401)
        try:
            topics = self.live.topics(request, request.query_params.getlist("topic"))
        except TopicError as error:
            return PlainTextResponse(str(error), status_code=400)
        api = self.api.as_user(session.token, self.forwarded(request))

        def still_signed_in() -> bool:  # an open live page counts as use of its session
            return self.session_of_id(session.id) is not None

        return await self.live.respond(api, topics, session.id, still_signed_in)

    def _jobs_topic(self, request: Request, cursor: str, resume: str | None
                    ) -> TopicSource:
        """``jobs[:cursor]``: the list's body first (what changed while the page was
        away included), then each change as a fragment."""
        async def translate(api: ApiClient, events: AsyncIterator[tuple[str, str]]
                            ) -> AsyncIterator[Piece]:
            async for piece in self._jobs_events(api, events, cursor or None):
                yield piece

        return TopicSource("/jobs/events", translate)

    async def _jobs_events(self, api: ApiClient, events: AsyncIterator[tuple[str, str]],
                           cursor: str | None) -> AsyncIterator[Piece]:
        """The list's page (``cursor``; None: the first, newest jobs) then its changes; a
        new job joins the first page only. Ends when app-node's stream ends or lags."""
        known: set[str] = set()
        async for event, data in events:
            if not event:
                yield KEEPALIVE
            elif event == "ready":  # subscribed: nothing is missed from here
                listed = await api.get("/jobs", cursor=cursor)
                now = self._wall()
                jobs = [job_row(job, now) for job in listed["jobs"]]
                known = {job["id"] for job in jobs}
                yield self.fragment("_jobs_body.html", jobs=jobs, oob=True)
            elif event == "status":
                change = json.loads(data)
                if change["id"] in known:
                    yield self.fragment("_job_status.html", job_id=change["id"],
                                        status=change["status"],
                                        label=status_label(change["status"]))
                elif cursor is None:
                    job = await api.get(f"/jobs/{quote(change['id'], safe='')}")
                    known.add(job["id"])
                    yield self.fragment("_job_added.html", job=job_row(job, self._wall()))
            elif event == "gone":
                job_id = json.loads(data)["id"]
                known.discard(job_id)
                yield self.fragment("_job_gone.html", job_id=job_id)
            elif event == "lagged":
                return

    def fragment(self, template: str, **context: Any) -> str:
        """A template rendered as a fragment of a live page (swapped in by its id)."""
        return self.templates.get_template(template).render(**context)


_SIGNUP = ("email", "name", "team_name")

_ERROR_HEADINGS = {400: "That request cannot be done", 403: "Not allowed",
                   404: "Not found", 409: "That cannot be done now", 429: "Too many requests",
                   502: "app-node cannot be reached", 503: "Not available now"}


def _to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='/')}", status_code=303)


def _local_path(value: str | None) -> str:
    """Where to go after sign-in: a path of this site only (never ``//evil``)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/jobs"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/jobs"
    return value


def _blank(names: tuple[str, ...]) -> dict[str, str]:
    return dict.fromkeys(names, "")


async def _form(request: Request, *names: str) -> dict[str, str]:
    """The named fields of a urlencoded or multipart form, as text (missing: empty)."""
    data = await request.form(max_files=0, max_fields=64)
    return {name: str(data.get(name) or "")[:_MAX_FIELD] for name in names}


def _form_status(error: ApiError) -> int:
    return error.status if 400 <= error.status < 500 else 502


def build_app(http: httpx.AsyncClient, sessions: SessionStore) -> UiApp:
    """The UI over ``http`` (a client of app-node's ``/api``)."""
    return UiApp(http, sessions)

