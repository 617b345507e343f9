"""The health history's core: rows, a service's state now, a window's uptime.

Theory of operation
-------------------
Every ``interval_s`` app-node's prober asks each watched service how it is and
records one :class:`HealthRow` per service: when (wall clock), whether it
answered, what it answered (version, queue depth, last report, small details),
how long the answer took, and why not when it did not. Nothing here awaits or
reads a clock: time is the ``now`` argument, and the stores
(:mod:`._sqlite`, :mod:`._redis`) only keep rows.

From the rows:

- :func:`service_state`: a service's state *now* from its newest row: ``up``
  (answered, no error), ``error`` (answered with a refusal, e.g. wrk-ork does
  not trust app-node's key, or a peer too old to know ``service.status``),
  ``down`` (no answer within the probe's timeout), ``stale`` (the newest row is
  older than :data:`STALE_INTERVALS` intervals: the prober itself stopped), or
  ``unknown`` (no row yet);
- :func:`overall`: ``ok`` when every service is up, ``unknown`` before any
  row, ``degraded`` otherwise (app-node answering is itself the proof that it
  is not down);
- :func:`summarise`: over a window, probes, up and down counts, uptime (the
  share of rows that are up) and ``buckets`` equal slices of the window, each
  the share of its rows that are up (None: no row), for a sparkline.

Bounds: a row's ``error`` is cut to :data:`MAX_ERROR_CHARS`, ``details`` to
``contracts.health.MAX_DETAILS`` scalars; stores keep :data:`RETENTION_S`
(24 h: what ``cosmicac status`` and an operator's look back need; Prometheus
keeps weeks, this is no replacement for it) and a history answer holds at
most :data:`MAX_ROWS` rows.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from contracts.health import MAX_DETAILS, ServiceStatus

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_WINDOW_S",
    "MAX_ERROR_CHARS",
    "MAX_ROWS",
    "PROXY_FORGET_S",
    "PROXY_FRESH_S",
    "PROXY_REPORT_INTERVAL_S",
    "RETENTION_S",
    "STALE_INTERVALS",
    "HealthRow",
    "Overall",
    "ServiceState",
    "WindowSummary",
    "answered",
    "clamp_window",
    "newest_by_service",
    "not_answered",
    "ordered_services",
    "overall",
    "service_state",
    "summarise",
]

#: How often every service is asked (seconds): Prometheus's default scrape is
#: 15 s too; at 15 s a day is 5,760 rows a service.
DEFAULT_INTERVAL_S = 15.0
#: A probe's bound: waiting for the connection plus the answer.
DEFAULT_TIMEOUT_S = 5.0
#: Rows are kept this long, then pruned.
RETENTION_S = 24 * 3600.0
#: The default window of a history read and of ``last_hour``.
DEFAULT_WINDOW_S = 3600.0
#: Rows in one history answer (a day of five services at 15 s is 28,800).
MAX_ROWS = 5000
#: A row's error message is cut here.
MAX_ERROR_CHARS = 300
#: A newest row older than this many intervals: the prober has stopped.
STALE_INTERVALS = 3
#: A proxy reports to wrk-monitor every 5 s (``nodes.kit.reporter``'s
#: default, not configurable on the proxy); up while its last report is at most
#: three reports old.
PROXY_REPORT_INTERVAL_S = 5.0
PROXY_FRESH_S = 3 * PROXY_REPORT_INTERVAL_S
#: A proxy silent this long is no longer watched (scaled down, or its key changed).
PROXY_FORGET_S = 3600.0

Scalar = int | float | str | bool | None


class HealthRow(BaseModel):
    """One probe of one service: what the history keeps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: When the probe started (seconds since the epoch, app-node's clock).
    at: float = Field(ge=0)
    service: str = Field(min_length=1, max_length=64)
    #: The service answered (with its status or with a refusal).
    reachable: bool
    version: str | None = Field(default=None, max_length=64)
    queue_depth: int | None = Field(default=None, ge=0)
    last_report_at: float | None = Field(default=None, ge=0)
    #: From the probe's start to its answer or failure.
    latency_ms: float | None = Field(default=None, ge=0)
    #: Why the service did not answer, or what it refused.
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)
    details: dict[str, Scalar] = Field(default_factory=dict, max_length=MAX_DETAILS)

    @property
    def up(self) -> bool:
        """Answered with its status."""
        return self.reachable and self.error is None


def _cut(error: str) -> str:
    error = " ".join(error.split()) or "failed"
    return error if len(error) <= MAX_ERROR_CHARS else error[:MAX_ERROR_CHARS - 1] + "…"


def answered(status: ServiceStatus, *, service: str, at: float, latency_ms: float
             ) -> HealthRow:
    """The row of a service that answered ``status`` (named ``service`` here,
    whatever it calls itself)."""
    return HealthRow(at=at, service=service, reachable=True, version=status.version,
                     queue_depth=status.queue_depth, last_report_at=status.last_report_at,
                     latency_ms=max(latency_ms, 0.0), details=dict(status.details))


def not_answered(service: str, *, at: float, latency_ms: float | None, error: str,
                 reachable: bool = False) -> HealthRow:
    """The row of a service that did not answer (``reachable=False``) or refused."""
    return HealthRow(at=at, service=service, reachable=reachable,
                     latency_ms=None if latency_ms is None else max(latency_ms, 0.0),
                     error=_cut(error))


class ServiceState(enum.StrEnum):
    """A service as its newest row shows it."""

    #: Answered with its status.
    UP = "up"
    #: Answered with a refusal (FORBIDDEN, UNKNOWN_METHOD...).
    ERROR = "error"
    #: Did not answer within the probe's timeout.
    DOWN = "down"
    #: The newest row is older than STALE_INTERVALS intervals.
    STALE = "stale"
    #: Never probed yet.
    UNKNOWN = "unknown"


class Overall(enum.StrEnum):
    """The control plane as a whole."""

    #: Every service is up.
    OK = "ok"
    #: Some service is not up.
    DEGRADED = "degraded"
    #: Nothing probed yet.
    UNKNOWN = "unknown"


def service_state(row: HealthRow | None, now: float, interval_s: float) -> ServiceState:
    """The service's state now, from its newest ``row``."""
    if row is None:
        return ServiceState.UNKNOWN
    if now - row.at > STALE_INTERVALS * interval_s:
        return ServiceState.STALE
    if not row.reachable:
        return ServiceState.DOWN
    return ServiceState.UP if row.error is None else ServiceState.ERROR


def overall(states: Iterable[ServiceState]) -> Overall:
    """``ok`` when every service is up, ``unknown`` when none was probed, else ``degraded``."""
    states = list(states)
    if not states or all(s is ServiceState.UNKNOWN for s in states):
        return Overall.UNKNOWN
    return Overall.OK if all(s is ServiceState.UP for s in states) else Overall.DEGRADED


class WindowSummary(BaseModel):
    """One service over a window."""

    model_config = ConfigDict(frozen=True)

    since: float
    until: float
    probes: int
    up: int
    down: int
    #: up / probes; None without a probe.
    uptime: float | None
    #: Equal slices of the window, oldest first: the share of rows up (None: no row).
    buckets: list[float | None]


def summarise(rows: Iterable[HealthRow], since: float, until: float, buckets: int = 12
              ) -> WindowSummary:
    """``rows`` (one service's) in ``[since, until]`` as counts, uptime and buckets.

    Raises:
        ValueError: an empty window or fewer than one bucket.
    """
    if until <= since or buckets < 1:
        raise ValueError("summarise needs since < until and at least one bucket")
    width = (until - since) / buckets
    ups, totals = [0] * buckets, [0] * buckets
    for row in rows:
        if not since <= row.at <= until:
            continue
        slot = min(buckets - 1, math.floor((row.at - since) / width))
        totals[slot] += 1
        ups[slot] += row.up
    probes, up = sum(totals), sum(ups)
    shares = [None if t == 0 else u / t for u, t in zip(ups, totals, strict=True)]
    return WindowSummary(since=since, until=until, probes=probes, up=up, down=probes - up,
                         uptime=None if probes == 0 else up / probes, buckets=shares)


def clamp_window(now: float, since: float | None, *, default_s: float = DEFAULT_WINDOW_S,
                 max_s: float = RETENTION_S) -> tuple[float, float]:
    """``(since, now)`` with ``since`` defaulting to ``default_s`` back and never
    more than ``max_s`` back (older rows are pruned anyway)."""
    start = now - default_s if since is None else since
    return max(start, now - max_s), now


def newest_by_service(rows: Iterable[HealthRow]) -> dict[str, HealthRow]:
    """Each service's newest row."""
    newest: dict[str, HealthRow] = {}
    for row in rows:
        if row.service not in newest or row.at >= newest[row.service].at:
            newest[row.service] = row
    return newest


def ordered_services(expected: Sequence[str], seen: Mapping[str, object]) -> list[str]:
    """The services to show: the expected ones in their order, then any other
    with rows (one no longer configured), by name."""
    return [*expected, *sorted(set(seen) - set(expected))]
