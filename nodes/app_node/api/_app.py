"""``create_app``: the Starlette app under ``/api``, behind the rate limiter.

Request bodies are read within :class:`~._body.BodyLimits` (each route's
``RouteSpec.max_body_bytes``, else the default); the limiter's buckets are per
client address unless a session was verified (:class:`~..ratelimit.VerifiedTokens`).

Every route is one :class:`~._spec.RouteSpec`; the app wraps each handler so
an :class:`~._common.ApiError` (or a store error) becomes the JSON error body,
and builds ``/api/openapi.json`` from the same table, so the schema lists
exactly the routes served.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from .. import codes
from ..auth import DEFAULT_PARAMS, ScryptParams
from ..errors import AppNodeError
from ..ratelimit import (
    RateLimitMiddleware,
    VerifiedTokens,
    key_by_session_or_ip,
    make_throttles,
)
from ..services import AppServices
from . import (
    _apikeys,
    _auth_routes,
    _events,
    _health,
    _jobs,
    _logs,
    _model_masters,
    _quotas,
    _racks,
    _swarm,
    _teams,
    _users,
)
from ._body import BodyLimits, BodyReader
from ._common import ApiError, Ctx, error_response
from ._models import ErrorOut
from ._spec import RouteSpec

__all__ = ["ROUTES", "create_app", "openapi"]

_log = logging.getLogger(__name__)

ROUTES: list[RouteSpec] = [*_auth_routes.ROUTES, *_users.ROUTES, *_teams.ROUTES,
                           *_quotas.ROUTES,
                           *_apikeys.ROUTES, *_model_masters.ROUTES,
                           # before _jobs: /jobs/events is not the job "events";
                           # /jobs/{job}/logs before any catch-all of _jobs'
                           *_events.ROUTES, *_logs.ROUTES, *_jobs.ROUTES,
                           *_racks.ROUTES, *_swarm.ROUTES, *_health.ROUTES]

_DOCS = """<!doctype html><html><head><meta charset="utf-8"><title>CosmicAC API</title></head>
<body><h1>CosmicAC API</h1><p>The schema of every route under <code>/api</code> is at
<a href="/api/openapi.json">/api/openapi.json</a>; load it into any OpenAPI viewer.</p>
</body></html>"""


def _endpoint(ctx: Ctx, spec: RouteSpec):
    async def endpoint(request: Request) -> Response:
        if spec.max_body_bytes is not None:
            request.scope["cosmicac.max_body_bytes"] = spec.max_body_bytes
        try:
            return await spec.handler(ctx, request)
        except ApiError as exc:
            return error_response(exc)
        except AppNodeError as exc:
            return error_response(ApiError.of(exc))
    endpoint.__name__ = spec.handler.__name__
    return endpoint


def openapi(routes: list[RouteSpec] = ROUTES) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (models referenced under ``components``)."""
    schemas: dict[str, Any] = {}

    def ref(model: type) -> dict[str, str]:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in schema.pop("$defs", {}).items():
            schemas[name] = sub
        schemas[model.__name__] = schema
        return {"$ref": f"#/components/schemas/{model.__name__}"}

    error = {"description": "an error", "content": {"application/json": {"schema": ref(ErrorOut)}}}
    paths: dict[str, Any] = {}
    for spec in routes:
        op: dict[str, Any] = {"summary": spec.summary, "operationId": spec.handler.__name__,
                              "responses": {"default": error}}
        if spec.auth:
            op["security"] = [{"bearer": []}]
        if spec.body is not None:
            op["requestBody"] = {"required": True, "content": {
                "application/json": {"schema": ref(spec.body)}}}
        params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                  for p in _path_params(spec.path)]
        params += [{"name": q, "in": "query", "required": False, "schema": {"type": "string"}}
                   for q in spec.query]
        if params:
            op["parameters"] = params
        answer: dict[str, Any] = {"description": "success"}
        if spec.answer is not None:
            answer["content"] = {spec.media_type: {"schema": ref(spec.answer)}}
        op["responses"][str(spec.status)] = answer
        paths.setdefault("/api" + _CONVERTOR.sub(r"{\1}", spec.path),
                         {})[spec.method.lower()] = op
    return {"openapi": "3.1.0", "info": {"title": "CosmicAC app-node API", "version": "1"},
            "paths": paths, "components": {"schemas": schemas, "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"}}}}


@functools.cache
def _served_openapi() -> dict[str, Any]:
    # Built on the first request, not per app: the schema walk costs about
    # 60 ms, which every app-node start and every test app paid for nothing.
    return openapi()


#: Starlette's ``{name:path}`` (a parameter that may hold ``/``) is ``{name}`` in OpenAPI.
_CONVERTOR = re.compile(r"\{(\w+):\w+\}")


def _path_params(path: str) -> list[str]:
    return [part[1:-1].partition(":")[0] for part in path.split("/") if part.startswith("{")]


def create_app(services: AppServices, *,
               password_params: ScryptParams = DEFAULT_PARAMS,
               body_limits: BodyLimits = BodyLimits()) -> Starlette:
    """The ASGI app of ``/api``.

    Args:
        services: what the routes use (store, database, email, limiter, clock).
        password_params: scrypt's cost for new password hashes (tests lower it).
        body_limits: request bodies' size, how many at once, JSON depth.
    """
    limits = services.limits
    verified = VerifiedTokens(max_entries=limits.max_keys)
    throttles = make_throttles(limits, services.limiter, services.clock)
    ctx = Ctx(services, password_params, bodies=BodyReader(body_limits), verified=verified,
              throttles=throttles)
    routes = [Route("/api" + spec.path, _endpoint(ctx, spec), methods=[spec.method])
              for spec in ROUTES]

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(_served_openapi())

    async def docs(request: Request) -> Response:
        return HTMLResponse(_DOCS)

    routes += [Route("/api/openapi.json", openapi_json, methods=["GET"]),
               Route("/api/docs", docs, methods=["GET"])]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: codes.NOT_FOUND, 405: codes.METHOD_NOT_ALLOWED}.get(exc.status_code,
                                                                         codes.HTTP_ERROR)
        return error_response(ApiError(code, f"{request.method} {request.url.path}: "
                                       f"{exc.detail}; see /api/docs", status=exc.status_code))

    async def crash(request: Request, exc: Exception) -> Response:
        _log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(ApiError(codes.INTERNAL, "app-node failed to answer; the "
                                       "error is in its log; retry, or report it"))

    return Starlette(routes=routes,
                     exception_handlers={HTTPException: http_error, Exception: crash},
                     middleware=[Middleware(RateLimitMiddleware, limiter=services.limiter,
                                            key_func=key_by_session_or_ip(limits, verified))])
