"""wrk-monitor's RPC API: protocol ``cosmicac-monitor/1``.

Every daemon ships its log records to wrk-monitor (``runtime.log_shipper``;
the job agents ship theirs through their worker); proxy-inference pushes its
per-job windows (model health), the workers their agents' figures; app-node
reads logs, model health and status, and sends the operator's Loki and
Prometheus. wrk-monitor (``nodes/monitor``) serves the protocol on its swarm;
a caller opens one channel per (protocol, id) on its connection. Methods::

    logs.push    PushBatch(records: bytes)                    -> PushResult(accepted)
    logs.follow  Follow(job_id?, source?, since_ns?, snapshot) => RecordBatch(records: bytes), ...
    logs.query   Query(job_id?, source?, since_ns?, limit)    -> QueryResult(records, more, history)
    logs.tail    Tail(job_id, source?, since_ns?, after?)     => TailBatch(records, stream, seqs)
    metrics.push MetricsReport(window_s, jobs)                -> MetricsResult(accepted)
    metrics.agents AgentMetricsReport(agents)                 -> MetricsResult(accepted)
    health.jobs  HealthQuery(job_ids)                         -> HealthResult(jobs)
    agents.heard HealthQuery(job_ids)                         -> HeardResult(jobs)
    service.status StatusRequest()                            -> ServiceStatus  (contracts.health)
    observability.set Observability(loki_url?, loki_tenant?, prometheus_url?) -> ObservabilityState
    observability.get ObservabilityQuery()                    -> ObservabilityState
    observability.clear ObservabilityClear()                  -> ObservabilityState

(``logs.query``, ``logs.tail`` and ``health.jobs``: their sections below; ``metrics.push``:
"Metrics from proxy-inference"; ``metrics.agents``: "Metrics of the job
agents"; ``service.status``: "Status"; ``observability.*``: "Where
wrk-monitor sends logs and metrics".)

Who may call what: each method is open to the keys of one of wrk-monitor's
allow-lists (its settings of the same names): ``logs.push`` the ``pushers``
(the daemons that ship their logs), ``metrics.push`` the ``proxies``,
``metrics.agents`` the ``workers``, every other method the ``followers``
(app-node). Anyone else: ``FORBIDDEN``, naming the setting to add the key to.

Error codes: ``FORBIDDEN``, ``BAD_BATCH`` (the batch is not valid records; the
message names the first bad one), ``LAGGED`` (a follower fell too far behind:
follow again with ``since_ns``), ``TOO_MANY_FOLLOWERS``, ``TOO_MANY_SENDERS``
(a new metrics sender past wrk-monitor's bound), ``UNAVAILABLE``
(``observability.*`` on a wrk-monitor that takes no observability settings); a
report or URL that breaks this module's bounds is ``INVALID_PARAMS`` (the RPC's
own validation).

Every model forbids unknown fields, so a field added to a params model is
refused by an older wrk-monitor: such a change is a new method or a new
protocol version (``cosmicac-monitor/2``), as ``observability.clear`` was added
beside ``observability.set`` rather than as a field of it.

Wire format of a record batch
-----------------------------
``records`` is a msgpack array of at most :data:`MAX_BATCH_RECORDS` records,
at most :data:`MAX_BATCH_BYTES` bytes encoded; each record is a 7-element array
(the fields of :class:`LogRecord`, in order)::

    [time_ns: uint, job_id: str|nil, replica: uint|nil, source: "System"|"Application",
     level: uint (logging's levelno, ≤ 100), service: str (≤ 64), text: str (≤ 16,384)]

Why bytes and tuples instead of a pydantic model per record: the target is
50,000 records/s into one wrk-monitor in pure Python on a shared 2-core
machine. Measured (2026-12-02 00:55 UTC, this 2-core machine, 500-record
batches, 100-char texts): ``msgpack`` of a list of tuples encodes at ~1.9 M
records/s and decodes plus :func:`decode_batch`'s checks at ~0.6 M records/s;
pydantic models (``model_dump`` / ``model_validate`` per record) manage ~0.32 M
and ~0.20 M, i.e. 3-5 µs of a 20 µs budget per record on each side before the
RPC, the ring and the followers. So a batch is one ``bytes`` field (the RPC's
pydantic validation is one length check) and :func:`decode_batch` checks each
record's shape and bounds with plain ``type()`` tests. A text longer than
:data:`MAX_TEXT_CHARS` is cut with :data:`CUT_MARKER` by the sender
(:func:`make_record`); the decoder refuses an over-long one (a sender that
skipped the cut is broken, not chatty).
"""

from __future__ import annotations

import enum
import re
import time
import urllib.parse
from collections.abc import Iterable, Iterator
from typing import Annotated, Literal, NamedTuple

import msgpack
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from p2p.rpc import Method, StreamMethod

__all__ = [
    "APPLICATION",
    "CUT_MARKER",
    "FOLLOW",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "MAX_SERVICE_CHARS",
    "MAX_TEXT_CHARS",
    "PROTOCOL",
    "PUSH",
    "SOURCES",
    "SYSTEM",
    "BadBatch",
    "Follow",
    "LogRecord",
    "PushBatch",
    "PushResult",
    "RecordBatch",
    "decode_batch",
    "encode_batch",
    "make_record",
    "record_size",
    "split_batches",
    "utf8_safe",
]

#: The channel protocol wrk-monitor serves.
PROTOCOL = "cosmicac-monitor/1"
SYSTEM = "System"
APPLICATION = "Application"
SOURCES = frozenset({SYSTEM, APPLICATION})
#: A log line is for a human; a 1 MB stack of JSON is cut, never refused.
MAX_TEXT_CHARS = 16_384
CUT_MARKER = "…[cut]"
MAX_SERVICE_CHARS = 64
MAX_JOB_ID_CHARS = 64
#: Records in one push or follow batch; 500 a push is what a shipper sends.
MAX_BATCH_RECORDS = 1_000
#: Encoded bytes of one batch: well under a mux message (512 KiB) with the RPC's framing.
MAX_BATCH_BYTES = 256 << 10
#: Bytes of a record besides its strings (for the ring's byte bound).
RECORD_OVERHEAD = 64


class LogRecord(NamedTuple):
    """One log line. A tuple, so msgpack encodes it as an array as it is."""

    #: Nanoseconds since the epoch (the sender's wall clock).
    time_ns: int
    job_id: str | None
    replica: int | None
    #: :data:`SYSTEM` (the platform's own steps) or :data:`APPLICATION` (the model server's output).
    source: str
    #: ``logging``'s levelno (10 DEBUG … 50 CRITICAL).
    level: int
    #: Who sent it, e.g. ``wrk-ork``, ``agent-inference``.
    service: str
    text: str


def record_size(record: LogRecord) -> int:
    """Roughly the bytes ``record`` holds: what the ring's byte bound counts."""
    return RECORD_OVERHEAD + len(record.text) + len(record.service) + len(record.job_id or "")


def make_record(text: str, *, service: str, source: str = SYSTEM, level: int = 20,
                job_id: str | None = None, replica: int | None = None,
                time_ns: int | None = None) -> LogRecord:
    """A record within bounds: the text cut with :data:`CUT_MARKER`, the rest clamped,
    and every string encodable as UTF-8 (see :func:`utf8_safe`)."""
    text = utf8_safe(text)
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS - len(CUT_MARKER)] + CUT_MARKER
    if source not in SOURCES:
        source = SYSTEM
    return LogRecord(time.time_ns() if time_ns is None else time_ns,
                     None if job_id is None else utf8_safe(job_id)[:MAX_JOB_ID_CHARS],
                     replica, source, min(max(level, 0), 100),
                     utf8_safe(service)[:MAX_SERVICE_CHARS], text)


def utf8_safe(text: str) -> str:
    """``text``, with lone surrogates written as ``\\udcff`` escapes.

    A log line may hold them (a file name or a process's output decoded with
    ``surrogateescape``); msgpack cannot encode them, and one such line would
    otherwise fail its whole batch. ASCII text (``isascii`` reads a flag, O(1))
    is returned as it is.
    """
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


class BadBatch(ValueError):
    """A batch that is not msgpack of valid records; ``index`` is the first bad record."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message if index is None else f"record {index}: {message}")
        self.index = index


def encode_batch(records: list[LogRecord] | tuple[LogRecord, ...]) -> bytes:
    """``records`` (at most :data:`MAX_BATCH_RECORDS`) as a batch's bytes."""
    return msgpack.packb(records, use_bin_type=True)


def _check(rec: object, i: int) -> LogRecord:
    if type(rec) is not tuple or len(rec) != 7:
        raise BadBatch("not a 7-element array", i)
    t, job, replica, source, level, service, text = rec
    if type(t) is not int or t < 0:
        raise BadBatch("time_ns is not a non-negative int", i)
    if job is not None and (type(job) is not str or len(job) > MAX_JOB_ID_CHARS):
        raise BadBatch("job_id is not a short str or nil", i)
    if replica is not None and (type(replica) is not int or not 0 <= replica < 1 << 16):
        raise BadBatch("replica is not a small uint or nil", i)
    if type(source) is not str or source not in SOURCES:
        raise BadBatch("source is not System or Application", i)
    if type(level) is not int or not 0 <= level <= 100:
        raise BadBatch("level is not an int 0-100", i)
    if type(service) is not str or len(service) > MAX_SERVICE_CHARS:
        raise BadBatch("service is not a str of at most 64 chars", i)
    if type(text) is not str or len(text) > MAX_TEXT_CHARS:
        raise BadBatch(f"text is not a str of at most {MAX_TEXT_CHARS} chars", i)
    return LogRecord._make(rec)


def decode_batch(data: bytes) -> list[LogRecord]:
    """The records of a batch, or :class:`BadBatch` (never another exception)."""
    if len(data) > MAX_BATCH_BYTES:
        raise BadBatch(f"{len(data)} bytes, over {MAX_BATCH_BYTES}")
    try:
        # max_array_len bounds what a hostile header can make msgpack allocate.
        raw = msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=True,
                              max_array_len=MAX_BATCH_RECORDS, max_map_len=0,
                              max_ext_len=0)
    except Exception as exc:  # msgpack raises a zoo of types (ValueError, ExtraData, ...)
        raise BadBatch(f"not msgpack: {type(exc).__name__}: {exc}") from None
    if type(raw) is not tuple:
        raise BadBatch("not an array of records")
    check = _check
    return [check(rec, i) for i, rec in enumerate(raw)]


#: Estimated size (:func:`record_size`, chars) of one batch: a char is at most 4
#: UTF-8 bytes, so 4x this stays under :data:`MAX_BATCH_BYTES` with room for framing.
_BATCH_ESTIMATE = (MAX_BATCH_BYTES - 2048) // 4


def split_batches(records: Iterable[LogRecord], *, max_records: int = MAX_BATCH_RECORDS
                  ) -> Iterator[list[LogRecord]]:
    """``records`` in order, cut into lists that encode within a batch's bounds."""
    chunk: list[LogRecord] = []
    size = 0
    for record in records:
        n = record_size(record)
        if chunk and (len(chunk) >= max_records or size + n > _BATCH_ESTIMATE):
            yield chunk
            chunk, size = [], 0
        chunk.append(record)
        size += n
    if chunk:
        yield chunk


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PushBatch(_Model):
    """Records pushed by a sender: :func:`encode_batch`'s bytes."""

    records: bytes = Field(max_length=MAX_BATCH_BYTES)


class PushResult(_Model):
    #: Records taken: wrk-monitor takes a batch whole or refuses it whole; a worker
    #: answering ``agent.logs`` keeps the first ``accepted`` within the agent's log
    #: budget and drops the rest, counted (not an error: nothing is re-sent).
    accepted: int


class Follow(_Model):
    """What a follower wants: every filter None means everything."""

    job_id: str | None = Field(default=None, max_length=MAX_JOB_ID_CHARS)
    source: str | None = Field(default=None, pattern=r"^(System|Application)$")
    #: Only records with ``time_ns >= since_ns`` (the snapshot and live ones).
    since_ns: int | None = Field(default=None, ge=0)
    #: First send the matching records still in wrk-monitor's buffer.
    snapshot: bool = True


class RecordBatch(_Model):
    """Records sent to a follower, oldest first; ``seq`` is the last one's sequence number."""

    records: bytes = Field(max_length=MAX_BATCH_BYTES)
    seq: int = Field(ge=0)


PUSH = Method("logs.push", params=PushBatch, result=PushResult)
FOLLOW = StreamMethod("logs.follow", params=Follow, item=RecordBatch)


# ---------------------------------------------------------------------------
# Reading without a stream: ``logs.query``
# ---------------------------------------------------------------------------
#
# The same filter as ``logs.follow`` without the stream: the newest ``limit``
# matching records still in wrk-monitor's buffer, in one answer (app-node's
# ``GET /api/jobs/{job}/logs`` without ``follow``). With a Loki in force and a
# ``job_id`` asked, when the buffer holds fewer than ``limit`` the older part
# comes from Loki; ``history`` says where (``buffer``, ``loki``,
# ``loki-error: …``). A record read back from Loki has no level or replica:
# ``level`` 0 (``NOTSET``: unknown) and ``replica`` nil.


class Query(Follow):
    """``logs.query``: :class:`Follow`'s filter (``snapshot`` is ignored) and how many."""

    #: The newest this many matching records.
    limit: int = Field(default=MAX_BATCH_RECORDS, ge=1, le=MAX_BATCH_RECORDS)


class QueryResult(_Model):
    """The matching records, oldest first (a batch's bytes)."""

    records: bytes = Field(max_length=MAX_BATCH_BYTES)
    #: Older matching records were left out (over ``limit`` or a batch's bytes).
    more: bool
    #: Where records older than the buffer came from: ``buffer`` (no Loki asked),
    #: ``loki``, or ``loki-error: <why>`` (the buffer's records are still answered).
    history: str = Field(default="buffer", max_length=1200)


QUERY = Method("logs.query", params=Query, result=QueryResult)

__all__ += ["QUERY", "Query", "QueryResult"]


# ---------------------------------------------------------------------------
# One job's records, numbered: ``logs.tail``
# ---------------------------------------------------------------------------
#
# ``logs.follow`` for one job, with each record's number in its job (from 1, no
# gaps) so a reader resumes right after the last record it has: nothing
# missing, nothing twice (the logs tab, ``jobs logs -f``). The numbering is
# named by a stream id, ``<epoch>.<generation>``: a restarted wrk-monitor, or a
# job whose counter it forgot, starts a new stream, and a reader whose ``after``
# names another stream gets the buffer's records of the job again from the
# first. A cursor is ``<stream>:<number>`` (:func:`format_cursor`).

#: ``<epoch hex>.<generation>:<number>``.
CURSOR_PATTERN = r"^[0-9a-f]{1,16}\.[0-9]{1,19}:[0-9]{1,19}$"


def format_cursor(stream: str, seq: int) -> str:
    """The cursor of record ``seq`` of ``stream``."""
    return f"{stream}:{seq}"


def stream_order(stream: str) -> tuple[int, int]:
    """A stream id as a sort key: a later wrk-monitor's streams after an earlier one's
    (its epoch is its start in milliseconds, in hex), then by generation."""
    epoch, _, generation = stream.partition(".")
    return int(epoch, 16), int(generation)


def parse_cursor(cursor: str) -> tuple[str, int]:
    """``(stream, number)`` of a cursor; ValueError when it is not one."""
    if not re.match(CURSOR_PATTERN, cursor):
        raise ValueError("a cursor is <stream>:<number>, as a record's id gave it")
    stream, _, seq = cursor.partition(":")
    return stream, int(seq)


class Tail(_Model):
    """``logs.tail``: one job's records (filtered as :class:`Follow`), numbered."""

    job_id: str = Field(min_length=1, max_length=MAX_JOB_ID_CHARS)
    source: str | None = Field(default=None, pattern=r"^(System|Application)$")
    since_ns: int | None = Field(default=None, ge=0)
    #: Resume after this record (a cursor); None: the buffer's records of the job first.
    after: str | None = Field(default=None, max_length=64, pattern=CURSOR_PATTERN)


class TailBatch(_Model):
    """Records of the job, oldest first, all of one stream."""

    records: bytes = Field(max_length=MAX_BATCH_BYTES)
    #: The numbering's stream id (``<epoch>.<generation>``).
    stream: str = Field(min_length=3, max_length=40)
    #: Each record's number in the job, ascending (gaps only where ``source`` or
    #: ``since_ns`` left records out).
    seqs: list[int] = Field(max_length=MAX_BATCH_RECORDS)

    @model_validator(mode="after")
    def _ascending(self) -> TailBatch:
        if any(b <= a for a, b in zip(self.seqs, self.seqs[1:], strict=False)) or \
                any(n < 1 for n in self.seqs[:1]):
            raise ValueError("seqs must be positive and ascending")
        return self


TAIL = StreamMethod("logs.tail", params=Tail, item=TailBatch)

__all__ += ["CURSOR_PATTERN", "TAIL", "Tail", "TailBatch", "format_cursor", "parse_cursor",
            "stream_order"]


# ---------------------------------------------------------------------------
# Metrics from proxy-inference: ``metrics.push`` (model health)
# ---------------------------------------------------------------------------
#
# Every few seconds each proxy sends wrk-monitor the latest snapshot of its
# per-job sliding window (nodes/proxy_inference/health.py); wrk-monitor keeps
# the newest report per sender, merges the senders' windows and classifies
# each job's model health (nodes/monitor/health.py), which ``health.jobs`` answers::
#
#     metrics.push  MetricsReport(window_s, jobs[JobWindow]) -> MetricsResult(accepted)
#
# A report is a snapshot, not a delta: a lost or refused one costs nothing but
# its few seconds of freshness, so a sender never queues or retries one.
# Latency is a fixed-bucket histogram (counts per bucket of
# :data:`LATENCY_BOUNDS_MS`, the last bucket +Inf) rather than a percentile:
# histograms of several proxies add up exactly, percentiles do not.

#: Upper bounds (milliseconds, inclusive) of the latency buckets a proxy counts
#: in; one more bucket holds everything slower. Fine below 2 s (a chat model's
#: first token), coarse up to a minute (a long transcription's whole answer).
LATENCY_BOUNDS_MS = (10, 25, 50, 100, 250, 500, 750, 1_000, 1_500, 2_000, 3_000, 5_000,
                     7_500, 10_000, 15_000, 20_000, 30_000, 60_000)
LATENCY_BUCKETS = len(LATENCY_BOUNDS_MS) + 1
#: Jobs in one report: ~120 bytes each on the wire, so a full report stays
#: near 128 KiB, a quarter of a mux message.
MAX_REPORT_JOBS = 1_000
#: HTTP statuses counted per job; a proxy lumps any beyond into ``"Nxx"``.
MAX_STATUS_CODES = 16
_COUNT = 2**53  # a JSON-safe count


class ModelHealth(enum.StrEnum):
    """How a job's model answers, apart from the job's status (seeds/jobs.txt)."""

    #: Answers within the thresholds (or too few requests to judge).
    HEALTHY = "Healthy"
    #: Error rate or first-byte p95 over the degraded threshold.
    DEGRADED = "Degraded"
    #: Error rate or first-byte p95 over the unhealthy threshold.
    UNHEALTHY = "Unhealthy"


Count = Annotated[int, Field(ge=0, le=_COUNT)]
StatusKey = Annotated[str, Field(pattern=r"^[1-5](\d\d|xx)$")]


class JobWindow(_Model):
    """One job's figures over the sender's window (``window_s`` up to the report)."""

    job_id: str = Field(min_length=1, max_length=MAX_JOB_ID_CHARS)
    #: Requests the proxy finished (answered or failed) for the job.
    requests: Count = 0
    #: Of them, the proxy's or the model server's failures: 5xx answers, a
    #: stream broken midway, no replica. A client's 4xx is not one.
    errors: Count = 0
    #: Counts per :data:`LATENCY_BOUNDS_MS` bucket of request start to the
    #: model server's first frame (requests that got one).
    first_byte_ms: tuple[Count, ...] = Field(default=(0,) * LATENCY_BUCKETS,
                                             min_length=LATENCY_BUCKETS,
                                             max_length=LATENCY_BUCKETS)
    #: The same for request start to the last byte sent.
    total_ms: tuple[Count, ...] = Field(default=(0,) * LATENCY_BUCKETS,
                                        min_length=LATENCY_BUCKETS, max_length=LATENCY_BUCKETS)
    #: Requests since the sender started, by HTTP status (a counter, not windowed).
    requests_total: dict[StatusKey, Count] = Field(default_factory=dict,
                                                   max_length=MAX_STATUS_CODES)

    @model_validator(mode="after")
    def _consistent(self) -> JobWindow:
        if self.errors > self.requests:
            raise ValueError("errors exceed requests")
        if sum(self.first_byte_ms) > self.requests or sum(self.total_ms) > self.requests:
            raise ValueError("a latency histogram counts more than the requests")
        return self


class MetricsReport(_Model):
    """A proxy's latest snapshot: its window's length and each job's figures."""

    #: The sliding window's length, seconds.
    window_s: float = Field(gt=0, le=3600)
    jobs: tuple[JobWindow, ...] = Field(default=(), max_length=MAX_REPORT_JOBS)

    @model_validator(mode="after")
    def _unique(self) -> MetricsReport:
        if len({job.job_id for job in self.jobs}) != len(self.jobs):
            raise ValueError("a job is reported twice")
        return self


class MetricsResult(_Model):
    #: Jobs taken (all of them: a report is taken whole or refused whole).
    accepted: int


METRICS_PUSH = Method("metrics.push", params=MetricsReport, result=MetricsResult)

__all__ += ["LATENCY_BOUNDS_MS", "LATENCY_BUCKETS", "MAX_REPORT_JOBS", "MAX_STATUS_CODES",
            "METRICS_PUSH", "JobWindow", "MetricsReport", "MetricsResult", "ModelHealth"]


# ---------------------------------------------------------------------------
# Model health, as wrk-monitor judges it: ``health.jobs``
# ---------------------------------------------------------------------------
#
# wrk-monitor merges the fresh senders' windows per job and judges each job's
# model health against its thresholds (nodes/monitor/health.py)::
#
#     health.jobs  HealthQuery(job_ids) -> HealthResult(jobs[JobHealth])
#
# One entry per asked job, in the order asked; a job no fresh report names has
# ``health`` None (unknown).

#: Job ids in one ``health.jobs`` call (a page of app-node's job list is 50).
MAX_HEALTH_QUERY = 500


class JobHealth(_Model):
    """One job's model health and the figures it was judged on."""

    job_id: str
    #: None: unknown (no fresh report names the job).
    health: ModelHealth | None
    requests: int = 0
    errors: int = 0
    error_rate: float = 0.0
    #: Request start to the model server's first frame (None: no request got one).
    first_byte_p50_ms: float | None = None
    first_byte_p95_ms: float | None = None
    #: Request start to its last byte.
    total_p95_ms: float | None = None
    window_s: float = 0.0
    senders: int = 0


class HealthQuery(_Model):
    """``health.jobs``: the jobs to judge."""

    job_ids: tuple[Annotated[str, Field(min_length=1, max_length=MAX_JOB_ID_CHARS)], ...] = (
        Field(max_length=MAX_HEALTH_QUERY))


class HealthResult(_Model):
    """One entry per asked job, in the order asked (unknown ones with ``health`` None)."""

    jobs: tuple[JobHealth, ...]


HEALTH_JOBS = Method("health.jobs", params=HealthQuery, result=HealthResult)

__all__ += ["HEALTH_JOBS", "MAX_HEALTH_QUERY", "HealthQuery", "HealthResult", "JobHealth"]


# ---------------------------------------------------------------------------
# Status: ``service.status`` (contracts.health)
# ---------------------------------------------------------------------------
#
# wrk-monitor answers the ``service.status`` every service serves:
# ``queue_depth`` the records waiting for Loki (0 without Loki),
# ``last_report_at`` the newest push of logs or metrics (wall clock),
# ``details`` the metrics senders, buffered records and drop counts. Among them
# ``metrics_sender_ages`` (:data:`SENDER_AGES`): every key whose
# ``metrics.push`` was taken since wrk-monitor started (fresh or not, at most
# :data:`MAX_LISTED_SENDERS`, the newest first) with the seconds since its last
# report, on wrk-monitor's monotonic clock (an age, so no clock skew between
# hosts); app-node's health history makes a row of each proxy from it.
# ``metrics_senders`` stays the count of fresh ones.
#
# Why a string: ``ServiceStatus.details`` is a flat map of scalars shared by
# every service's ``service.status``, and a model that forbids unknown fields
# cannot grow a typed field without refusing older peers' answers (or older
# peers refusing ours). So the listing is encoded by :func:`sender_ages_detail`
# and read back by :func:`parse_sender_ages`, both here, beside the rest of
# the protocol; a typed listing would be a method or version of its own.

#: Metrics senders listed in ``service.status`` (the newest first); a listing is
#: then at most ~1.5 KB (16 hex digits, ``:``, an age, ``,`` each).
MAX_LISTED_SENDERS = 64
#: The ``service.status`` detail listing the metrics senders.
SENDER_AGES = "metrics_sender_ages"
#: Hex digits of a sender's key in the listing (64 bits: enough to tell proxies apart).
SENDER_KEY_HEX = 16


def sender_ages_detail(ages: Iterable[tuple[bytes, float]]) -> str:
    """``ages`` (key, seconds since its last report) as the ``metrics_sender_ages``
    detail: ``<16 hex digits>:<seconds, 1 decimal>`` joined by ``,``, in the
    order given, at most :data:`MAX_LISTED_SENDERS`. A flat string because a
    status detail is a scalar and their number is bounded (``MAX_DETAILS``)."""
    items = []
    for key, age in ages:
        if len(items) >= MAX_LISTED_SENDERS:
            break
        items.append(f"{key.hex()[:SENDER_KEY_HEX]}:{max(age, 0.0):.1f}")
    return ",".join(items)


def parse_sender_ages(text: str) -> list[tuple[str, float]]:
    """The ``(key hex prefix, age seconds)`` pairs of a ``metrics_sender_ages`` detail.

    Raises:
        ValueError: ``text`` is not such a listing (naming the first bad entry).
    """
    if not text:
        return []
    out = []
    for entry in text.split(",")[:MAX_LISTED_SENDERS + 1]:
        key, sep, age = entry.partition(":")
        try:
            if not sep or len(key) != SENDER_KEY_HEX or bytes.fromhex(key).hex() != key:
                raise ValueError
            seconds = float(age)
        except ValueError:
            raise ValueError(f"not a metrics sender's key and age: {entry[:40]!r}") from None
        if not 0.0 <= seconds < 1e12:  # also refuses nan and inf
            raise ValueError(f"a metrics sender's age out of range: {entry[:40]!r}")
        out.append((key, seconds))
    if len(out) > MAX_LISTED_SENDERS:
        raise ValueError(f"more than {MAX_LISTED_SENDERS} metrics senders listed")
    return out


__all__ += ["MAX_LISTED_SENDERS", "SENDER_AGES", "SENDER_KEY_HEX", "parse_sender_ages",
            "sender_ages_detail"]


# ---------------------------------------------------------------------------
# Where wrk-monitor sends logs and metrics: ``observability.*``
# ---------------------------------------------------------------------------
#
# "cosmicac-app-node sends cosmicac-wrk-monitor the URLs of your Loki and
# Prometheus" (seeds/architecture.txt, Observability). app-node calls, on each
# connection to wrk-monitor (followers only)::
#
#     observability.set  Observability(loki_url?, loki_tenant?, prometheus_url?)
#                        -> ObservabilityState(loki, loki_url?, loki_tenant?,
#                                              prometheus_url?, origin, persisted)
#     observability.get  ObservabilityQuery() -> ObservabilityState
#     observability.clear  ObservabilityClear() -> ObservabilityState
#
# ``set`` replaces all three at once: a None clears that one (no Loki: live
# logs and wrk-monitor's buffer only). ``clear`` (app-node sends it on each
# connection when none of its ``observability`` settings is set) forgets what
# app-node sent: wrk-monitor goes back to its own ``loki`` settings, else no
# Loki, and deletes what it persisted. A method of its own, not a field of
# ``set``: every model here forbids unknown fields, so an older wrk-monitor
# would refuse every ``set`` carrying one; it answers ``UNKNOWN_METHOD`` to
# ``clear`` instead, which costs app-node nothing but the clear (logged, with
# the workaround: delete its ``observability.json``). A URL may carry credentials
# (``https://user:token@loki.example``, sent as HTTP basic auth); what comes
# back, what is logged and what ``service.status`` shows has them stripped
# (:func:`redact_url`).

#: A URL's length bound: far above any real base URL, far below a mux message.
MAX_URL_CHARS = 2048
#: Loki's own bound on a tenant id (``X-Scope-OrgID``), and its characters
#: (alphanumerics and ``!-_.*'()``; ``|`` joins tenants for a multi-tenant query).
MAX_TENANT_CHARS = 150
TENANT_PATTERN = r"^[A-Za-z0-9!\-_.*'()|]+$"


def check_base_url(url: str) -> str:
    """``url`` if it is an http(s) base URL with a host, no query and no fragment.

    Raises:
        ValueError: naming what is wrong (pydantic turns it into the field's error).
    """
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"longer than {MAX_URL_CHARS} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError("contains whitespace or control characters")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("must start with http:// or https://")
    if not parts.hostname:
        raise ValueError("has no host")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise ValueError("a base URL has no query or fragment")
    return url


def redact_url(url: str | None) -> str | None:
    """``url`` without its user and password (what may be logged or reported)."""
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query,
                                    parts.fragment))


class Observability(_Model):
    """The operator's Loki and Prometheus, as app-node sends them to wrk-monitor."""

    #: Loki's base URL (``http://loki:3100``); None: no Loki.
    loki_url: str | None = None
    #: ``X-Scope-OrgID`` for a multi-tenant Loki; None: no header.
    loki_tenant: str | None = Field(default=None, min_length=1, max_length=MAX_TENANT_CHARS,
                                    pattern=TENANT_PATTERN)
    #: Prometheus's base URL (kept and reported; wrk-monitor is scraped by it).
    prometheus_url: str | None = None

    @field_validator("loki_url", "prometheus_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        return None if url is None else check_base_url(url)

    def redacted(self) -> Observability:
        """The same without credentials in the URLs."""
        return Observability.model_construct(loki_url=redact_url(self.loki_url),
                                             loki_tenant=self.loki_tenant,
                                             prometheus_url=redact_url(self.prometheus_url))


class ObservabilityQuery(_Model):
    """``observability.get`` takes nothing."""


class ObservabilityClear(_Model):
    """``observability.clear`` takes nothing (a model so a later version may add some)."""


class ObservabilityState(_Model):
    """What is in force on wrk-monitor (URLs without credentials)."""

    #: Records are pushed to a Loki now.
    loki: bool
    loki_url: str | None = None
    loki_tenant: str | None = None
    prometheus_url: str | None = None
    #: Where it came from: ``settings`` (wrk-monitor's own ``loki``: at start
    #: without a file, or after an ``observability.clear``), ``app-node`` (an
    #: ``observability.set``), ``file`` (what app-node last sent, read back at
    #: start from ``<storage>/observability.json``), or ``none``.
    origin: Literal["settings", "app-node", "file", "none"]
    #: What app-node sent is on disk (a restart keeps it); False after a failed write.
    persisted: bool = False


OBSERVABILITY_SET = Method("observability.set", params=Observability, result=ObservabilityState)
OBSERVABILITY_GET = Method("observability.get", params=ObservabilityQuery,
                           result=ObservabilityState)
OBSERVABILITY_CLEAR = Method("observability.clear", params=ObservabilityClear,
                             result=ObservabilityState)

__all__ += ["MAX_TENANT_CHARS", "MAX_URL_CHARS", "OBSERVABILITY_CLEAR", "OBSERVABILITY_GET",
            "OBSERVABILITY_SET", "TENANT_PATTERN", "Observability", "ObservabilityClear",
            "ObservabilityQuery", "ObservabilityState", "check_base_url", "redact_url"]


# ---------------------------------------------------------------------------
# Metrics of the job agents, forwarded by their workers: ``metrics.agents``
# ---------------------------------------------------------------------------
#
# Agents never dial wrk-monitor: each sends its figures to its worker with
# its heartbeat (``contracts/agent_report.py``, ``Heartbeat.metrics``). Every
# few seconds each worker sends wrk-monitor the latest figures of the agents
# it knows, labelled with what the worker knows of each VMI (job id, replica,
# node rank, service), never with what an agent claims::
#
#     metrics.agents  AgentMetricsReport(agents[AgentMetrics]) -> MetricsResult(accepted)
#
# A snapshot again: wrk-monitor keeps the newest report per worker and drops
# a worker's whole report once it is stale. A name ending in ``_total`` is a
# counter, any other a gauge (wrk-monitor exposes ``cosmicac_agent_<name>``).

#: Agents in one report: a worker's VMIs (~200 bytes each with a dozen
#: figures; 4,096 of them stay under a mux message).
MAX_REPORT_AGENTS = 4_096
#: Figures per agent (``contracts.agent_report`` bounds a heartbeat's alike).
MAX_AGENT_VALUES = 32

AgentMetricName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,47}$")]
#: Strict: a number on the wire, never a string or a bool pydantic would coerce.
AgentMetricValue = Annotated[float, Field(ge=0, le=2.0**63, allow_inf_nan=False, strict=True)]


class AgentMetrics(_Model):
    """One agent's latest figures, labelled by its worker."""

    job_id: str = Field(min_length=1, max_length=MAX_JOB_ID_CHARS)
    replica: int = Field(ge=0, lt=1 << 16)
    node_rank: int = Field(ge=0, le=64)
    #: ``agent-inference`` or ``agent-instance`` (``agent_service``).
    service: str = Field(pattern=r"^[a-z][a-z0-9-]{0,63}$")
    values: dict[AgentMetricName, AgentMetricValue] = Field(default_factory=dict,
                                                           max_length=MAX_AGENT_VALUES)


class AgentMetricsReport(_Model):
    """A worker's latest snapshot of its agents' figures."""

    agents: tuple[AgentMetrics, ...] = Field(default=(), max_length=MAX_REPORT_AGENTS)

    @model_validator(mode="after")
    def _unique(self) -> AgentMetricsReport:
        slots = {(a.job_id, a.replica, a.node_rank) for a in self.agents}
        if len(slots) != len(self.agents):
            raise ValueError("an agent (job_id, replica, node_rank) is reported twice")
        return self


METRICS_AGENTS = Method("metrics.agents", params=AgentMetricsReport, result=MetricsResult)

#: The figure a worker adds for every agent that said hello, silent ones too:
#: seconds since it last heard from the agent (its clock, so no skew between
#: machines). A job's "last heard from its agents" (``agents.heard``) is read
#: from it, the symptom seeds/relay.txt names: statuses stop updating and the
#: last communication is minutes old.
HEARD_AGE = "heard_age_seconds"


class JobHeard(_Model):
    """When a job's agents were last heard from, as their workers said."""

    job_id: str
    #: Wall clock (wrk-monitor's) of the least recently heard agent's last report;
    #: None: no fresh worker report names an agent of the job.
    heard_at: float | None
    #: Agents of the job the reports name.
    agents: int = 0


class HeardResult(_Model):
    """One entry per asked job, in the order asked."""

    jobs: tuple[JobHeard, ...]


#: ``agents.heard``: the asked jobs' last word from their agents (followers: app-node).
AGENTS_HEARD = Method("agents.heard", params=HealthQuery, result=HeardResult)

__all__ += ["AGENTS_HEARD", "HEARD_AGE", "MAX_AGENT_VALUES", "MAX_REPORT_AGENTS",
            "METRICS_AGENTS", "AgentMetrics", "AgentMetricsReport", "HeardResult", "JobHeard"]
