"""``GET /api/jobs/{job}/logs``: a job's log records from wrk-monitor's buffer, or live.

Without ``follow``: one JSON answer, ``{records, more}``, the newest ``limit``
matching records still in wrk-monitor's buffer (``logs.query``), oldest first.
With ``follow=1``: server-sent events: ``records`` ``{records: [...], stream}`` per
batch (the buffer's matching records first, then live ones as they come), each
record with ``seq``, its number in the job (from 1, no gaps but what ``source``
or ``since`` leave out), and the event's ``id`` the cursor of its last record
(``<stream>:<seq>``); ``: keep-alive`` comments while none come, and ``lagged``
``{message}`` then the end when the stream fell behind or wrk-monitor went away.
Follow again with ``after=<cursor>`` (or the ``Last-Event-ID`` header a browser's
EventSource sends): the records after that one, nothing missing, nothing twice.
A cursor of another stream (wrk-monitor restarted) reads the job from the first
record it holds.

Without ``follow``, records older than wrk-monitor's buffer come from the
operator's Loki when it has one (``history``: ``buffer``, ``loki`` or
``loki-error: <why>``, the buffer's records still answered); without Loki the
logs tab shows live logs and the last records only. Who may read: the job's team
(404 otherwise, as ``GET /api/jobs/{job}``). Without wrk-monitor configured, or
unreachable, 503 ``MONITOR_UNAVAILABLE``.

Query: ``source`` ``system`` | ``application`` (default both); ``since`` a
duration back from now (``90`` seconds, ``10m``, ``2h``, ``1d``) or an RFC 3339
time; ``limit`` 1-1000 (default 1000, without follow); ``after`` a cursor (with
follow).
"""

from __future__ import annotations

import datetime
import logging
import re
from contextlib import ExitStack
from typing import Any

import trio
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from contracts.monitor import (
    APPLICATION,
    MAX_BATCH_RECORDS,
    QUERY,
    SYSTEM,
    TAIL,
    BadBatch,
    LogRecord,
    Query,
    Tail,
    decode_batch,
    format_cursor,
    parse_cursor,
)
from nodes.kit.monitor_client import MonitorClient, MonitorUnavailable
from p2p.rpc import RpcError

from .. import codes
from ._common import ApiError, Ctx, ok
from ._events import KEEPALIVE_S, EventStream, Write, sse
from ._jobs import _own_job
from ._spec import RouteSpec

__all__ = ["ROUTES", "LogRecordOut", "LogsOut", "parse_since", "record_out"]

_log = logging.getLogger(__name__)

_SOURCES = {"system": SYSTEM, "application": APPLICATION}
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d{1,9})([smhd]?)$")


class LogRecordOut(BaseModel):
    """One log line."""

    #: Its number in the job, when followed (``follow=1``).
    seq: int | None = None
    #: RFC 3339, UTC, microseconds.
    time: str
    job_id: str | None
    replica: int | None
    #: ``system`` or ``application``.
    source: str
    #: ``logging``'s name (``INFO``...), or ``Level N``.
    level: str
    service: str
    text: str


class LogsOut(BaseModel):
    records: list[LogRecordOut]
    #: Older matching records were left out (over ``limit``).
    more: bool
    #: Where records older than wrk-monitor's buffer came from (see the module doc).
    history: str = "buffer"


def record_out(record: LogRecord, seq: int | None = None) -> dict[str, Any]:
    at = datetime.datetime.fromtimestamp(record.time_ns / 1e9, datetime.UTC)
    return {**({} if seq is None else {"seq": seq}),
            "time": at.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "job_id": record.job_id, "replica": record.replica,
            "source": record.source.lower(), "level": logging.getLevelName(record.level),
            "service": record.service, "text": record.text}


def parse_since(raw: str, now: float) -> int:
    """``since`` as nanoseconds since the epoch; ApiError 422 when it is neither form."""
    match = _DURATION.match(raw.strip())
    if match:
        return max(0, int((now - int(match[1]) * _UNITS[match[2]]) * 1e9))
    try:
        at = datetime.datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise ApiError(codes.INVALID, "since: a duration (90, 10m, 2h, 1d) or an RFC 3339 "
                                       "time with its offset", "since")
    return max(0, int(at.timestamp() * 1e9))


def _int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ApiError(codes.INVALID, f"{name}: an integer {low}-{high}", name)
    return int(raw)


def monitor_unavailable(message: str) -> ApiError:
    return ApiError(codes.MONITOR_UNAVAILABLE, message)


def _monitor(ctx: Ctx) -> MonitorClient:
    monitor = ctx.services.monitor
    if monitor is None:
        raise monitor_unavailable("wrk-monitor is not configured on app-node (set monitor and "
                                  "monitor_addresses in its settings): no logs to show")
    return monitor


def _refused(exc: RpcError) -> ApiError:
    if exc.code == "FORBIDDEN":
        return monitor_unavailable("wrk-monitor refuses app-node's key (a misconfiguration): "
                                   "add app-node's public key to wrk-monitor's followers")
    if exc.code == "TOO_MANY_FOLLOWERS":
        return ApiError(codes.TOO_MANY_STREAMS, exc.message)
    return ApiError(codes.MONITOR_ERROR, f"wrk-monitor failed ({exc.code}): {exc.message}")


async def job_logs(ctx: Ctx, request: Request) -> Response:
    session = await ctx.session(request)
    record = await _own_job(ctx, session, request.path_params["job"])
    raw_source = request.query_params.get("source", "").lower()
    if raw_source and raw_source not in _SOURCES:
        raise ApiError(codes.INVALID, "source: system or application", "source")
    source = _SOURCES.get(raw_source)
    raw_since = request.query_params.get("since")
    since_ns = parse_since(raw_since, ctx.now()) if raw_since else None
    limit = _int(request, "limit", MAX_BATCH_RECORDS, 1, MAX_BATCH_RECORDS)
    follow = _int(request, "follow", 0, 0, 1) == 1
    monitor = _monitor(ctx)
    if not follow:
        try:
            result = await monitor.call(QUERY, Query(job_id=record.id, source=source,
                                                     since_ns=since_ns, limit=limit))
            records = decode_batch(result.records)
        except MonitorUnavailable as exc:
            raise monitor_unavailable(str(exc)) from None
        except RpcError as exc:
            raise _refused(exc) from None
        except BadBatch as exc:
            raise ApiError(codes.MONITOR_ERROR, f"wrk-monitor sent a bad batch: {exc}") from None
        return ok(LogsOut.model_validate({"records": [record_out(r) for r in records],
                                          "more": result.more,
                                          "history": result.history}))
    after = request.query_params.get("after") or request.headers.get("last-event-id") or None
    if after is not None:
        try:
            parse_cursor(after)
        except ValueError as exc:
            raise ApiError(codes.INVALID, f"after: {exc}", "after") from None
    try:  # reachable now, or 503 before the stream's 200
        await monitor.ready()
    except MonitorUnavailable as exc:
        raise monitor_unavailable(str(exc)) from None
    params = Tail(job_id=record.id, source=source, since_ns=since_ns, after=after)

    async def produce(write: Write) -> None:
        await write(": following\n\n")  # the headers reach the client at once
        try:
            async with monitor.stream(TAIL, params) as items:
                while True:
                    with trio.move_on_after(KEEPALIVE_S):
                        try:
                            batch = await items.receive()
                        except trio.EndOfChannel:
                            break
                        records = decode_batch(batch.records)
                        if len(records) != len(batch.seqs):
                            raise BadBatch(f"{len(records)} records, {len(batch.seqs)} "
                                           "numbers")
                        await write(sse("records", {"records": [
                            record_out(r, n) for r, n in zip(records, batch.seqs,
                                                             strict=True)],
                            "stream": batch.stream},
                            id=format_cursor(batch.stream, batch.seqs[-1])
                            if batch.seqs else None))
                        continue
                    await write(": keep-alive\n\n")
        except (MonitorUnavailable, RpcError, BadBatch) as exc:
            message = exc.message if isinstance(exc, RpcError) else str(exc)
            await write(sse("lagged", {"id": record.id, "message": message}))
            return
        await write(sse("lagged", {"id": record.id, "message": "wrk-monitor ended the stream"}))

    return EventStream(produce, ExitStack())


ROUTES = [
    RouteSpec("GET", "/jobs/{job}/logs", job_logs,
              "The job's log records still in wrk-monitor's buffer (newest limit, oldest "
              "first); follow=1: server-sent events, records batches then lagged at the end",
              answer=LogsOut, query=("source", "since", "limit", "follow", "after")),
]
