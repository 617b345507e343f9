"""wrk-monitor's HTTP side: ``/metrics`` and a job's logs, as JSON or live (SSE).

Routes (each also under ``/monitor``: the entry point strips that prefix
today, nodes/entry/routes.py, but a deployment behind another proxy may not)::

    GET /metrics                                   Prometheus text
    GET /jobs/{job_id}/logs?source=&since=&limit=  JSON {"job_id", "records", "history"}
    GET /jobs/{job_id}/logs?follow=1&source=&since= text/event-stream
    GET /jobs/{job_id}/metrics?minutes=60          JSON {"job_id", "minutes", "step_s",
                                                   "start", "end", "series": {name: [[t, v]]}}

Authentication (every route: each reveals a team's data, ``/metrics`` too,
whose labels name every team's jobs): ``Authorization: Bearer <token>``, the
operator's ``http.token`` (or ``http.token_file``), compared in constant time.
Checked by :class:`Guard`, in front of every route, before anything is read:

=====  =====================  ==========================================================
403    ``HTTP_TOKEN_NOT_SET``   wrk-monitor has no token: it serves nothing over HTTP
                                (fail closed); the message names the setting
401    ``UNAUTHORIZED``         no bearer, or not the token (``WWW-Authenticate: Bearer``)
413    ``BODY_NOT_ALLOWED``     the request has a body: no route reads one, so none is
                                read (``Connection: close``)
=====  =====================  ==========================================================

The token is the operator's and Prometheus' (a scrape's ``authorization``
with ``credentials_file``); users read their jobs' logs through app-node
(``GET /api/jobs/{id}/logs``, which checks their team and calls ``logs.query``
/ ``logs.follow`` over the swarm). Nothing in the platform reads this side.

``/metrics`` of a job: its request rate, error rate and first-byte p95 over the
last ``minutes`` (1-1440, default 60), read from the Prometheus app-node named
(:mod:`.prometheus`); 503 ``PROMETHEUS_UNAVAILABLE`` without one, 502
``PROMETHEUS_ERROR`` when it fails (its message).

``since`` is nanoseconds since the epoch (records at or after it); ``limit``
keeps the newest ``limit`` records (default 1000, at most 5000). A JSON read
takes the buffer's matching records; when Loki is configured and the buffer
gave fewer than ``limit``, the older part comes from Loki: records strictly
older than the buffer's oldest record (its first by arrival), less any the
buffer still holds (a record that arrived late), so none is repeated. The
buffer is scanned from its newest end until ``limit`` records match: a job's
tail is quick, a read that reaches Loki scans it whole (~15 ms per 100,000
records on the ingestion thread; an operator's route, not a hot path).
``history`` says where the older part came from: ``"buffer"`` (no Loki),
``"loki"``, or ``"loki-error: …"`` (the buffer's records are still returned).

Follow: the buffer's matching records, then live ones, each an SSE event
``id: <seq>`` / ``data: <record JSON>``; a comment (``: keep-alive``) every
:data:`KEEPALIVE_S` when idle (proxies close silent streams); a follower
that falls behind gets ``event: lagged`` and the stream ends (follow again
with ``since``). At most ``http.max_followers`` at once, and
``http.max_followers_per_client`` per client (503 ``TOO_MANY_FOLLOWERS``
beyond either), so one client cannot take them all. The client is its
address: the TCP peer's, or, when the peer is one of ``http.trusted_proxies``
(the entry point, Caddy), the ``X-Forwarded-For`` address nearest to it that
is not a trusted proxy (:func:`client_address`).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts.monitor import SOURCES, LogRecord
from nodes.kit.forwarded import TrustedProxies
from nodes.kit.forwarded import client_address as forwarded_client

from ._buffer import LogBuffer
from .loki import LokiError, LokiReader, LokiRecord
from .prometheus import MAX_MINUTES, PrometheusError, PrometheusReader

__all__ = ["KEEPALIVE_S", "MAX_HTTP_FOLLOWERS", "MAX_HTTP_FOLLOWERS_PER_CLIENT", "MAX_LIMIT",
           "TOKEN_SETTING", "Guard", "LogsFront", "client_address", "create_app"]

#: An idle follow stream sends a comment this often.
KEEPALIVE_S = 15.0
#: Follow streams over HTTP at once (``http.max_followers``).
MAX_HTTP_FOLLOWERS = 256
#: … of one client (``http.max_followers_per_client``).
MAX_HTTP_FOLLOWERS_PER_CLIENT = 16
#: What an operator sets to open the HTTP side (in the 403 without a token).
TOKEN_SETTING = ("http.token_file (or http.token; COSMICAC_MONITOR__HTTP__TOKEN_FILE); "
                 "cosmicac up and bootstrap write <storage>/http-token")
DEFAULT_LIMIT = 1000
MAX_LIMIT = 5000
#: How far back a history read without ``since`` asks Loki.
DEFAULT_HISTORY_S = 7 * 24 * 3600
#: Records per SSE write (one chunk).
SSE_BATCH = 500


@dataclass
class LogsFront:
    """What the routes read: the buffer, Loki's reader (optional), the metrics."""

    buffer: LogBuffer
    registry: CollectorRegistry
    #: A fixed reader (tests); the daemon passes ``readers`` instead.
    reader: LokiReader | None = None
    #: The reader of the Loki in force now (it is swapped at runtime: read per request).
    readers: Callable[[], LokiReader | None] | None = None
    #: The reader of the Prometheus in force now (None: no metrics history).
    prometheus: Callable[[], PrometheusReader | None] | None = None
    #: The bearer token every route wants; None: every route is refused (403).
    token: str | None = None
    keepalive_s: float = KEEPALIVE_S
    max_followers: int = MAX_HTTP_FOLLOWERS
    max_followers_per_client: int = MAX_HTTP_FOLLOWERS_PER_CLIENT
    #: Reverse proxies whose ``X-Forwarded-For`` names the client (``http.trusted_proxies``).
    trusted_proxies: Sequence[str] = ()
    #: HTTP follow streams now, and per client.
    streams: int = 0
    client_streams: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._trusted = TrustedProxies(self.trusted_proxies)

    def current_reader(self) -> LokiReader | None:
        return self.readers() if self.readers is not None else self.reader

    def client(self, scope: Scope) -> str:
        """The client of a request, for the per-client bound (:func:`client_address`)."""
        return client_address(scope, self._trusted)

    def take_stream(self, client: str) -> str | None:
        """Count a new follow stream of ``client``; None, or why it is refused."""
        if self.streams >= self.max_followers:
            return (f"wrk-monitor serves at most {self.max_followers} follow streams "
                    "(http.max_followers); close one first")
        if self.client_streams.get(client, 0) >= self.max_followers_per_client:
            return (f"at most {self.max_followers_per_client} follow streams per client "
                    "(http.max_followers_per_client); close one first")
        self.streams += 1
        self.client_streams[client] = self.client_streams.get(client, 0) + 1
        return None

    def release_stream(self, client: str) -> None:
        self.streams -= 1
        left = self.client_streams.get(client, 1) - 1
        if left > 0:
            self.client_streams[client] = left
        else:
            self.client_streams.pop(client, None)


def client_address(scope: Scope, trusted: TrustedProxies) -> str:
    """Who sent a request: the TCP peer's address, or, when the peer is a trusted
    proxy, the client its ``X-Forwarded-For`` names (:mod:`nodes.kit.forwarded`, the
    rule app-node's rate limits follow too)."""
    client = scope.get("client")
    peer = str(client[0]) if client else None
    forwarded = [value for name, value in scope.get("headers", ()) if name == b"x-forwarded-for"]
    return forwarded_client(peer, forwarded, trusted) or "unknown"


def record_json(record: LogRecord | LokiRecord, seq: int | None = None) -> dict[str, Any]:
    """One record as the routes answer it (a Loki record has no level or replica)."""
    if isinstance(record, LokiRecord):
        return {"time_ns": record.time_ns, "job_id": record.job_id, "replica": None,
                "source": record.source, "level": None, "service": record.service,
                "text": record.line, "seq": None}
    return {"time_ns": record.time_ns, "job_id": record.job_id, "replica": record.replica,
            "source": record.source, "level": record.level, "service": record.service,
            "text": record.text, "seq": seq}


def _error(status: int, code: str, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


class Guard:
    """In front of every route (ASGI): no body, and the operator's bearer token.

    Refuses before the app runs (the table in the module docstring): a route
    added later is guarded without doing anything.
    """

    def __init__(self, app: ASGIApp, front: LogsFront) -> None:
        self.app = app
        self.front = front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> Response | None:
        """The answer that refuses this request, or None to serve it."""
        length = _header(scope, b"content-length")
        if _header(scope, b"transfer-encoding") is not None or (
                length is not None and length.strip() != b"0"):
            response = _error(413, "BODY_NOT_ALLOWED", "wrk-monitor's routes take no "
                              "request body; send none")
            response.headers["connection"] = "close"  # the body is never read
            return response
        token = self.front.token
        if token is None:
            return _error(403, "HTTP_TOKEN_NOT_SET", "wrk-monitor serves nothing over HTTP "
                          f"until its operator sets {TOKEN_SETTING}; users read their "
                          "jobs' logs at /api/jobs/{id}/logs")
        scheme, _, given = (_header(scope, b"authorization") or b"").partition(b" ")
        if scheme.lower() != b"bearer" or not secrets.compare_digest(given.strip(),
                                                                       token.encode()):
            return _error(401, "UNAUTHORIZED", "send Authorization: Bearer <wrk-monitor's "
                          "http.token>; users read their jobs' logs at /api/jobs/{id}/logs")
        return None


class _FollowResponse(StreamingResponse):
    """A follow stream whose slot is given back however the response ends
    (even when its body is never started: the client left first)."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            release, self._release = self._release, lambda: None
            release()


def _int_param(request: Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    value = int(raw)  # ValueError: the caller answers 400
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be {lo}..{hi}")
    return value


def create_app(front: LogsFront) -> ASGIApp:
    """The ASGI app over ``front``, every route behind :class:`Guard`."""

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(front.registry), media_type=CONTENT_TYPE_LATEST)

    async def logs(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        source = request.query_params.get("source") or None
        if source is not None and source not in SOURCES:
            return _error(400, "BAD_REQUEST", f"source must be one of {sorted(SOURCES)}")
        try:
            since = _int_param(request, "since", None, 0, 2**63 - 1)
            limit = _int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        except ValueError as exc:
            return _error(400, "BAD_REQUEST", str(exc))
        assert limit is not None
        if request.query_params.get("follow") in ("1", "true", "yes"):
            client = front.client(request.scope)
            refused = front.take_stream(client)
            if refused is not None:
                return _error(503, "TOO_MANY_FOLLOWERS", refused)
            return _FollowResponse(_follow(front, job_id, source, since),
                                   lambda: front.release_stream(client))
        return JSONResponse(await _read(front, job_id, source, since, limit))

    async def job_metrics(request: Request) -> Response:
        try:
            minutes = _int_param(request, "minutes", 60, 1, MAX_MINUTES)
        except ValueError as exc:
            return _error(400, "BAD_REQUEST", str(exc))
        assert minutes is not None
        reader = front.prometheus() if front.prometheus is not None else None
        if reader is None:
            return _error(503, "PROMETHEUS_UNAVAILABLE", "no Prometheus is known: set "
                          "app-node's observability.prometheus_url")
        try:
            body = await reader.job_metrics(request.path_params["job_id"], minutes=minutes,
                                            now_s=time.time())
        except PrometheusError as exc:
            return _error(502, "PROMETHEUS_ERROR", str(exc))
        return JSONResponse(body)

    routes = []
    for prefix in ("", "/monitor"):
        routes += [Route(prefix + "/metrics", metrics, methods=["GET"]),
                   Route(prefix + "/jobs/{job_id}/logs", logs, methods=["GET"]),
                   Route(prefix + "/jobs/{job_id}/metrics", job_metrics, methods=["GET"])]
    return Guard(Starlette(routes=routes), front)


async def _read(front: LogsFront, job_id: str, source: str | None, since: int | None,
                limit: int) -> dict[str, Any]:
    """The newest ``limit`` matching records: the buffer's, older ones from Loki."""
    def wants(r: LogRecord) -> bool:
        return (r.job_id == job_id and (source is None or r.source == source)
                and (since is None or r.time_ns >= since))

    recent = front.buffer.newest(wants, limit)
    out: list[dict[str, Any]] = []
    history = "buffer"
    reader = front.current_reader()
    if reader is not None and len(recent) < limit:
        first = front.buffer.first
        end_ns = first.time_ns if first is not None else time.time_ns() + 1
        start_ns = since if since is not None else end_ns - DEFAULT_HISTORY_S * 10**9
        history = "loki"
        if start_ns < end_ns:
            try:
                older = await reader.query_range(
                    job_id, source=source, start_ns=start_ns, end_ns=end_ns,
                    limit=limit - len(recent), direction="backward")
            except LokiError as exc:
                history = f"loki-error: {exc}"
            else:
                # A record that arrived late (older than the ring's first) is in both.
                held = {(r.time_ns, r.source, r.service, r.text) for _, r in recent}
                out = [record_json(r) for r in older
                       if (r.time_ns, r.source, r.service, r.line) not in held]
    out += [record_json(r, seq) for seq, r in recent]
    return {"job_id": job_id, "records": out, "history": history}


async def _follow(front: LogsFront, job_id: str, source: str | None,
                  since: int | None) -> AsyncIterator[bytes]:
    """The SSE stream of one follower; ends when it lags or the client goes."""
    wake = trio.Event()

    def notify() -> None:
        wake.set()

    follower = front.buffer.follow(job_id=job_id, source=source, since_ns=since,
                                   snapshot=True, notify=notify)
    try:
        yield b": following\n\n"  # the headers and a first byte at once
        while True:
            items = follower.take(SSE_BATCH)
            if items:
                yield "".join(f"id: {seq}\ndata: {json.dumps(record_json(r, seq))}\n\n"
                              for seq, r in items).encode()
                continue
            if follower.lagged:
                yield (b"event: lagged\ndata: {\"message\": \"this follow fell behind; "
                       b"follow again with since\"}\n\n")
                return
            with trio.move_on_after(front.keepalive_s):
                await wake.wait()
            if not wake.is_set():
                yield b": keep-alive\n\n"
            wake = trio.Event()
    finally:
        front.buffer.unfollow(follower)

