"""The control plane's health: now, and its history; platform operators only.

``GET /api/health`` answers each watched service's newest row, its state
(``up``, ``error``, ``down``, ``stale``, ``unknown``: :mod:`..health._model`) and
its last hour (probes, up, down, uptime, twelve 5-minute buckets), plus an
overall ``ok`` / ``degraded`` / ``unknown``. ``GET /api/health/history`` answers
the rows themselves: ``service`` (one, default every one), ``since`` (a
duration back or an RFC 3339 time, as the logs route takes it; default an
hour, at most the retention, 24 h), ``limit`` (1-5000, the newest kept).

Operators only, as racks and nodes are: the rows name the control plane's
versions, queue depths and the errors of its links (keys, addresses), which
are the platform's business, not a team's. Without a prober (``health.enabled``
false, or its store would not open) or while its store fails (Redis down):
503 ``HEALTH_UNAVAILABLE``.
"""

from __future__ import annotations

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from .. import codes
from ..health import (
    DEFAULT_WINDOW_S,
    MAX_ROWS,
    HealthProber,
    HealthRow,
    HealthStoreError,
    Overall,
    ServiceState,
    WindowSummary,
    clamp_window,
    ordered_services,
    overall,
    service_state,
    summarise,
)
from ._common import ApiError, Ctx, invalid, ok
from ._logs import parse_since
from ._racks import require_operator
from ._spec import RouteSpec

__all__ = ["ROUTES", "HealthOut", "HistoryOut", "ServiceHealthOut"]

#: Slices of ``last_hour`` (5 minutes each): what a sparkline shows.
BUCKETS = 12


class ServiceHealthOut(BaseModel):
    service: str
    state: ServiceState
    #: The newest row; None before the first probe.
    last: HealthRow | None
    last_hour: WindowSummary


class HealthOut(BaseModel):
    status: Overall
    #: app-node's clock when it answered (ages are relative to it).
    at: float
    interval_s: float
    services: list[ServiceHealthOut]


class HistoryOut(BaseModel):
    since: float
    until: float
    #: Oldest first.
    rows: list[HealthRow]
    #: More rows matched than ``limit``: the oldest were left out.
    truncated: bool


def _prober(ctx: Ctx) -> HealthProber:
    prober = ctx.services.health
    if prober is None:
        raise ApiError(codes.HEALTH_UNAVAILABLE, "app-node keeps no health history: "
                       "health.enabled is false or its store failed to open (see its log)")
    return prober


def _store_failed(exc: HealthStoreError) -> ApiError:
    return ApiError(codes.HEALTH_UNAVAILABLE, f"{exc}; retry once the store answers")


async def health_now(ctx: Ctx, request: Request) -> Response:
    await require_operator(ctx, await ctx.session(request))
    prober = _prober(ctx)
    now = ctx.now()
    since, until = clamp_window(now, None, default_s=DEFAULT_WINDOW_S)
    try:
        latest = await prober.store.latest()
        services = []
        for name in ordered_services(prober.services, latest):
            rows = await prober.store.history(since, until, service=name)
            row = latest.get(name)
            services.append(ServiceHealthOut(
                service=name, state=service_state(row, now, prober.interval_s), last=row,
                last_hour=summarise(rows, since, until, BUCKETS)))
    except HealthStoreError as exc:
        raise _store_failed(exc) from exc
    # A service no longer configured but with rows is shown; only the watched count.
    watched = [s.state for s in services if s.service in prober.services]
    return ok(HealthOut(status=overall(watched), at=now, interval_s=prober.interval_s,
                        services=services))


async def health_history(ctx: Ctx, request: Request) -> Response:
    await require_operator(ctx, await ctx.session(request))
    prober = _prober(ctx)
    query = request.query_params
    now = ctx.now()
    service = query.get("service") or None
    if service is not None and not 0 < len(service) <= 64:
        raise invalid("service", "a service's name, 1 to 64 characters")
    raw_since = query.get("since")
    since_s = parse_since(raw_since, now) / 1e9 if raw_since else None
    try:
        limit = int(query.get("limit", MAX_ROWS))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_ROWS:
        raise invalid("limit", f"a number of rows from 1 to {MAX_ROWS}")
    since, until = clamp_window(now, since_s, max_s=prober.retention_s)
    try:
        rows = await prober.store.history(since, until, service=service, limit=limit + 1)
    except HealthStoreError as exc:
        raise _store_failed(exc) from exc
    return ok(HistoryOut(since=since, until=until, rows=rows[-limit:],
                         truncated=len(rows) > limit))


ROUTES = [
    RouteSpec("GET", "/health", health_now, "Each control-plane service's health now and "
              "over the last hour (operators)", answer=HealthOut),
    RouteSpec("GET", "/health/history", health_history, "The health rows of a window "
              "(operators)", answer=HistoryOut, query=("service", "since", "limit")),
]
