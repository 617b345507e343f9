"""One table of routes: Starlette's routing and the OpenAPI schema both come from it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from ._common import Ctx

Handler = Callable[[Ctx, Request], Awaitable[Response]]


@dataclass(frozen=True)
class RouteSpec:
    """A route: ``path`` under ``/api``, its body and answer models, whether it needs a session."""

    method: str
    path: str
    handler: Handler
    summary: str
    body: type[BaseModel] | None = None
    answer: type[BaseModel] | None = None
    status: int = 200
    auth: bool = True
    query: tuple[str, ...] = field(default=())
    #: The answer's media type: ``text/event-stream`` for a stream of ``answer``s.
    media_type: str = "application/json"
    #: The largest body this route reads (bytes); None: ``BodyLimits.max_body_bytes``.
    max_body_bytes: int | None = None
