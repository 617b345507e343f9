"""What every route group shares: the error body, request parsing, the session check.

Errors leave as ``{"error": {"code", "message", "field"?}}``, with a code of
:mod:`nodes.app_node.codes` and the status its table gives (the store's
:class:`~nodes.app_node.errors.AppNodeError` codes included); auth failures are
``UNAUTHENTICATED`` (401) and ``FORBIDDEN`` (403). A team the caller does not
belong to answers 404 like a missing one, so its existence does not leak.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import trio
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import codes
from ..auth import ScryptParams, hash_token
from ..errors import AppNodeError, Expired, Invalid, NotFound
from ..model import Role, User
from ..services import AppServices
from ..store import NotCached, cache_only
from ._job_documents import JobDocuments

if TYPE_CHECKING:
    from ..ratelimit import FailureThrottle, VerifiedTokens
    from ._body import BodyReader

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
_log = logging.getLogger(__name__)

_RANK = {Role.MEMBER: 0, Role.ADMIN: 1, Role.OWNER: 2}


class ApiError(Exception):
    """An answer other than success: the body's code, message and field, and its status.

    Args:
        code: one of :mod:`nodes.app_node.codes`.
        message: for humans: what went wrong and what to do next.
        field: the request field at fault, if one is.
        status: the HTTP status; by default the one :data:`~nodes.app_node.codes.STATUS`
            gives the code (``HTTP_ERROR`` has none: pass it).
        headers: extra answer headers (``Retry-After``, ``Connection: close``).
    """

    def __init__(self, code: str, message: str, field: str | None = None, *,
                 status: int | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = codes.STATUS[code] if status is None else status
        self.code, self.message, self.field = code, message, field
        #: Extra answer headers (``Retry-After``, ``Connection: close``).
        self.headers = headers

    @classmethod
    def of(cls, exc: AppNodeError) -> ApiError:
        return cls(exc.code, exc.message, getattr(exc, "field", None),
                   status=codes.STATUS.get(exc.code, 500))


def error_response(exc: ApiError) -> JSONResponse:
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.field is not None:
        body["field"] = exc.field
    return JSONResponse({"error": body}, status_code=exc.status, headers=exc.headers)


def throttled(wait_s: float, reason: str, source: str) -> ApiError:
    """429 ``THROTTLED`` with ``Retry-After`` (whole seconds, at least 1); logged, so an
    operator sees who is guessing (the address, never the account)."""
    seconds = max(1, int(-(-wait_s // 1)))
    _log.info("api.throttled reason=%r source=%s retry_after_s=%d", reason, source, seconds)
    return ApiError(codes.THROTTLED, f"{reason}; retry in {seconds} s",
                    headers={"retry-after": str(seconds)})


def unauthenticated(message: str) -> ApiError:
    return ApiError(codes.UNAUTHENTICATED, message)


def forbidden(message: str) -> ApiError:
    return ApiError(codes.FORBIDDEN, message)


def ok(model: BaseModel | None = None, status: int = 200) -> Response:
    if model is None:
        return Response(status_code=204)
    # pydantic's own serialiser: a page of jobs through model_dump and json.dumps
    # was a fifth of a listing's CPU.
    return Response(model.model_dump_json(), status_code=status,
                    media_type="application/json")


@dataclass(frozen=True)
class Ctx:
    """What the routes close over: the services and the password hashing cost."""

    services: AppServices
    password_params: ScryptParams
    #: Set by ``create_app``: the body reader (bounds), the tokens verified lately
    #: (the rate limiter's buckets), and the failure throttles by name
    #: (``login``, ``reset_email``, ``token_guess``).
    bodies: BodyReader | None = None
    verified: VerifiedTokens | None = None
    throttles: dict[str, FailureThrottle] | None = None
    #: The job listing's JSON per job, kept while unchanged.
    documents: JobDocuments = field(default_factory=JobDocuments)

    def client(self, request: Request) -> str:
        """The client's address, through the trusted proxies (``limits.trusted_proxies``)."""
        from ..ratelimit import address_key, client_of
        return address_key(client_of(request.scope, self.services.limits.proxies()))

    def throttle(self, name: str) -> FailureThrottle:
        assert self.throttles is not None, "Ctx built outside create_app"
        return self.throttles[name]

    def now(self) -> float:
        return self.services.clock()

    async def store(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call a (blocking) store method in a worker thread; store errors become ApiErrors."""
        try:
            return await trio.to_thread.run_sync(functools.partial(method, *args, **kwargs))
        except AppNodeError as exc:
            raise ApiError.of(exc) from exc

    async def body(self, request: Request, model: type[M]) -> M:
        """The JSON body as ``model``; 422 naming the first bad field.

        Read within the route's bounds (``_body.BodyReader``): 413, 503, 408, and
        400 ``JSON_TOO_DEEP`` before any parsing."""
        assert self.bodies is not None, "Ctx built outside create_app"
        raw = await self.bodies.read(request, request.scope.get("cosmicac.max_body_bytes"))
        return validate(model, self.bodies.parse(raw))

    async def session(self, request: Request) -> Session:
        """The caller's session from ``Authorization: Bearer``; 401 without a valid one."""
        session, _ = await self.session_and(request, lambda session: None)
        return session

    async def session_and(self, request: Request, then: Callable[[Session], T]
                          ) -> tuple[Session, T]:
        """:meth:`session`, and ``then(session)`` run in the same worker thread right
        after it: a route's first store reads without a second trip to a thread
        (a listing's thread trips were a third of its CPU). ``then`` may raise
        :class:`ApiError` or the store's errors (mapped as :meth:`store` maps them).

        Both are first tried on the event loop from the store's kept answers
        (``store/_read_cache.py``: never older than the store, so a revoked token
        or a changed role counts at once); the thread only when one is missing.
        ``then`` must change nothing before its last read (it may run twice)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthenticated("send Authorization: Bearer <token>; log in to get one")
        token_hash = hash_token(token)
        store, now = self.services.store, self.now()

        def lookup() -> tuple[Session, T]:
            try:
                user = store.users.get(store.tokens.valid(token_hash, now=now).user)
            except (NotFound, Expired) as exc:
                raise unauthenticated(exc.message) from None
            session = Session(user=user, token_hash=token_hash)
            return session, then(session)

        try:
            try:
                with cache_only():
                    session, extra = lookup()
            except NotCached:
                session, extra = await trio.to_thread.run_sync(lookup)
        except AppNodeError as exc:
            raise ApiError.of(exc) from exc
        if self.verified is not None:
            self.verified.add(token_hash)  # its own rate-limit bucket from now on
        return session, extra

    async def require_role(self, session: Session, team_id: str, at_least: Role) -> Role:
        """The caller's role in ``team_id``: 404 if not a member, 403 if below ``at_least``."""
        role = await self.store(self.services.store.teams.role_of, session.user.id, team_id)
        return require_member(role, team_id, at_least)


def require_member(role: Role | None, team_id: str, at_least: Role = Role.MEMBER) -> Role:
    """``role`` (the caller's in ``team_id``, None: none): 404 if not a member, 403 if
    below ``at_least``."""
    if role is None:
        raise ApiError(codes.NOT_FOUND, f"no team {team_id} among yours; check the id")
    if _RANK[role] < _RANK[at_least]:
        raise forbidden(f"this needs the {at_least.value} role in the team; you are "
                        f"{role.value}; ask an owner or admin")
    return role


def outranks(role: Role, other: Role) -> bool:
    """Whether ``role`` may act on a member holding ``other``: owners on anyone, admins
    on anyone but owners."""
    return role is Role.OWNER or (role is Role.ADMIN and other is not Role.OWNER)


@dataclass(frozen=True)
class Session:
    user: User
    token_hash: str


def validate(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        raise ApiError(codes.INVALID, f"{field or 'body'}: {first['msg']}",
                       field) from None


def invalid(field: str, message: str) -> ApiError:
    return ApiError.of(Invalid(field, message))


def team_of(session: Session, team_id: str | None) -> str:
    """The team a request acts for: ``team_id`` if given, else the caller's active team."""
    team = team_id or session.user.active_team
    if team is None:
        raise ApiError(codes.INVALID, "you have no active team; pass team_id or set "
                       "one with PUT /api/me/active-team", "team_id")
    return team
