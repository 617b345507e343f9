"""Pushing job log records to Loki and reading a job's history back.

Theory of operation
-------------------
:class:`LokiPusher` sits between wrk-monitor's receive path and the operator's
Loki. :meth:`LokiPusher.offer` is synchronous and O(1): it appends to a
bounded deque and wakes the pusher task. A sender must never block or lose its
own work because Loki is slow or down, so at ``max_buffered`` the
*oldest* record is dropped and counted (``dropped``), as the senders upstream
of wrk-monitor do.

:meth:`LokiPusher.run` (one task, owned by the caller's nursery) waits for a
record, then for ``flush_interval_s`` or a full batch, whichever comes first,
takes up to ``batch_max_records`` / ``batch_max_bytes`` from the front of the
deque, and sends it as one gzip JSON push (``POST /loki/api/v1/push``, body
``{"streams":[{"stream":{labels},"values":[["<ns string>","<line>"],...]}]}``,
reference §6). One batch is in flight at a time: Loki orders entries per
stream, and a second concurrent batch could arrive first.

Retries: a transport error, 429 or 5xx retries the same batch with exponential
backoff and jitter (``backoff_initial_s`` doubling to ``backoff_max_s``, as
promtail's ``backoff_config`` does: 0.5 s → 5 min, here 0.2 s → 30 s) up to
``max_retries`` times, then the batch is given up and counted as ``failed``.
Any other 4xx means Loki will never take this batch (bad timestamp, entry too
old, line too long): it is counted as ``rejected``, logged once per status,
and the next batch goes on. While a batch retries, new records keep arriving
in the bounded deque, so a long outage turns into ``dropped``, not memory.

Cancellation drains nothing. The pusher runs until wrk-monitor stops; on stop,
Loki may be the very thing that is down, and a flush with a deadline would
delay every shutdown by that deadline for records that still exist in the
monitor's local buffer and its senders' logs. What is buffered when the task
is cancelled is lost (``statistics().buffered`` says how much), and so is a
batch in flight: Loki may or may not have stored it.

Labels are ``service``, ``source`` and ``job_id``. The reference (§6) warns
that an unbounded label such as a job id multiplies streams; it is kept because
per-job history is then a plain ``{job_id="…"}``.

:class:`LokiReader` runs ``query_range`` for one job, paging through results
by moving ``start`` (forward) or ``end`` (backward) to the last timestamp
seen, and de-duplicating the entries at that timestamp it already returned.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import random
import urllib.parse
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import httpx
import orjson
import pydantic
import trio

from contracts.monitor import redact_url
from nodes.kit.tls import client_tls

from .errors import BackendError

__all__ = [
    "LokiError",
    "LokiPusher",
    "LokiPusherStatistics",
    "LokiReader",
    "LokiRecord",
    "encode_push",
    "logql_string",
    "split_credentials",
    "stream_selector",
]

logger = logging.getLogger(__name__)

PUSH_PATH = "/loki/api/v1/push"
QUERY_RANGE_PATH = "/loki/api/v1/query_range"
READY_PATH = "/ready"

DEFAULT_BATCH_MAX_RECORDS = 1000
#: Loki's default ``grpc_server_max_recv_msg_size`` is 4 MiB; promtail batches 1 MiB.
DEFAULT_BATCH_MAX_BYTES = 1 << 20
DEFAULT_FLUSH_INTERVAL_S = 0.5
DEFAULT_MAX_BUFFERED = 100_000
DEFAULT_BACKOFF_INITIAL_S = 0.2
DEFAULT_BACKOFF_MAX_S = 30.0
DEFAULT_MAX_RETRIES = 10
#: Per-entry overhead counted against ``batch_max_bytes``: the timestamp and JSON punctuation.
ENTRY_OVERHEAD_BYTES = 26

Direction = Literal["forward", "backward"]


class LokiRecord(NamedTuple):
    """One log line as Loki stores it: a time, the three labels, the text.

    A named tuple, not a frozen dataclass: one is built for every record
    wrk-monitor accepts (``to_loki`` in its ``on_records`` hook), and a frozen
    dataclass's ``__init__`` (``object.__setattr__`` per field) cost ~4x as much
    (bench/monitor.py, 50,000 records/s with Loki on).
    """

    #: Unix time in nanoseconds.
    time_ns: int
    #: The daemon or agent that wrote it (``app-node``, ``agent-inference``…).
    service: str
    #: ``System`` or ``Application`` (seeds/jobs.txt).
    source: str
    job_id: str
    line: str
    #: The record's number in its job (``<stream>:<seq>``), kept as structured
    #: metadata (not a label: one per line would make a stream per line); empty for
    #: a record of no job, or read back from a Loki that kept none.
    cursor: str = ""

    def labels(self) -> tuple[tuple[str, str], ...]:
        """The stream's label set, in a fixed order (it is a dict key)."""
        return (("service", self.service), ("source", self.source), ("job_id", self.job_id))


class LokiError(BackendError):
    """Loki answered with an error, or with something that is not its documented shape.

    ``status`` is the HTTP status (0 when no answer came); ``message`` is
    Loki's own text (its error bodies are plain text).
    """

    backend = "Loki"


def logql_string(value: str) -> str:
    """``value`` as a LogQL double-quoted string literal.

    LogQL strings are Go string literals (``strconv.Unquote``); JSON's escapes
    (``\\\\``, ``\\"``, ``\\n``, ``\\uXXXX``…) are a subset of Go's, and JSON
    escapes every control character, so ``json.dumps`` is exact.
    """
    return json.dumps(value, ensure_ascii=False)


def stream_selector(matchers: Iterable[tuple[str, str]]) -> str:
    """``{name="value",...}`` from equality matchers (names must be label names)."""
    return "{" + ",".join(f"{name}={logql_string(value)}" for name, value in matchers) + "}"


def encode_push(records: Iterable[LokiRecord]) -> bytes:
    """The JSON push body for ``records``: one stream per label set.

    Entries are sorted by time within each stream: Loki accepts out-of-order
    writes since 2.4 (``unordered_writes``), but older or stricter configs
    reject them. A stream already in order (one sender's, as a rule) is not
    sorted again.
    """
    streams: dict[tuple[str, str, str], list[LokiRecord]] = {}
    for record in records:
        streams.setdefault((record.service, record.source, record.job_id), []).append(record)
    body = {"streams": [
        {"stream": {"service": service, "source": source, "job_id": job_id},
         "values": [(str(r.time_ns), r.line, {"cursor": r.cursor}) if r.cursor
                    else (str(r.time_ns), r.line) for r in _in_time_order(entries)]}
        for (service, source, job_id), entries in streams.items()]}
    return orjson.dumps(body)


def _in_time_order(entries: list[LokiRecord]) -> list[LokiRecord]:
    if all(a.time_ns <= b.time_ns for a, b in itertools.pairwise(entries)):
        return entries
    return sorted(entries, key=lambda r: r.time_ns)


def _entry_bytes(record: LokiRecord) -> int:
    line = record.line
    # isascii() reads a flag CPython keeps on every str (O(1)); only other
    # text is encoded to count its bytes.
    return (len(line) if line.isascii() else len(line.encode())) + ENTRY_OVERHEAD_BYTES


def split_credentials(url: str) -> tuple[str, httpx.BasicAuth | None]:
    """``url`` without ``user:password@``, and those as basic auth (None without them).

    The credentials never travel inside the URL: httpx logs every request's URL
    (``HTTP Request: POST http://user:password@…``) at INFO.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url.rstrip("/"), None
    auth = httpx.BasicAuth(urllib.parse.unquote(parts.username or ""),
                           urllib.parse.unquote(parts.password or ""))
    return (redact_url(url) or "").rstrip("/"), auth


def _open_client(timeout_s: float) -> httpx.AsyncClient:
    """A client with ``trust_env=False``: an ``HTTP_PROXY`` must not capture Loki traffic."""
    return httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=timeout_s,
                             verify=client_tls())


@dataclass(frozen=True, slots=True)
class LokiPusherStatistics:
    """Counters for ``/metrics``; all counts are records except ``retries``."""

    #: Accepted by Loki (2xx).
    pushed: int
    #: Given up after ``max_retries`` retries of a transport error, 429 or 5xx.
    failed: int
    #: Dropped from the front of the buffer at ``max_buffered``, never sent.
    dropped: int
    #: Refused by Loki with a 4xx other than 429; never retried.
    rejected: int
    #: Push attempts that were retried.
    retries: int
    #: Waiting in the buffer (not counting a batch in flight).
    buffered: int


class LokiPusher:
    """Batches records into Loki pushes without ever blocking the caller of :meth:`offer`.

    Args:
        url: Loki's base URL (``http://loki:3100``).
        tenant: sent as ``X-Scope-OrgID`` when given (multi-tenant Loki).
        client: an ``httpx.AsyncClient`` to use (not closed here); one is
            opened and closed by :meth:`aclose` otherwise.
        rng: the jitter source (a seeded one in tests).
    """

    def __init__(self, url: str, *, tenant: str | None = None,
                 batch_max_records: int = DEFAULT_BATCH_MAX_RECORDS,
                 batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES,
                 flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
                 max_buffered: int = DEFAULT_MAX_BUFFERED,
                 backoff_initial_s: float = DEFAULT_BACKOFF_INITIAL_S,
                 backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
                 max_retries: int = DEFAULT_MAX_RETRIES,
                 timeout_s: float = 10.0,
                 client: httpx.AsyncClient | None = None,
                 rng: random.Random | None = None) -> None:
        if batch_max_records < 1 or batch_max_bytes < 1 or max_buffered < 1:
            raise ValueError("batch_max_records, batch_max_bytes and max_buffered must be >= 1")
        if flush_interval_s < 0 or backoff_initial_s <= 0 or backoff_max_s < backoff_initial_s:
            raise ValueError("need flush_interval_s >= 0, 0 < backoff_initial_s <= backoff_max_s")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if httpx.URL(url).scheme not in ("http", "https"):
            raise ValueError(f"Loki URL must be http(s)://host:port, not {url!r}")
        #: Loki's URL without credentials (sent as basic auth): what log lines name.
        self.url, self._auth = split_credentials(url)
        self.safe_url = self.url
        self._headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if tenant is not None:
            self._headers["X-Scope-OrgID"] = tenant
        self._batch_max_records = batch_max_records
        self._batch_max_bytes = batch_max_bytes
        self._flush_interval_s = flush_interval_s
        self._max_buffered = max_buffered
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._max_retries = max_retries
        self._owns_client = client is None
        self._client = client if client is not None else _open_client(timeout_s)
        self._rng = rng if rng is not None else random.Random()
        # Bound: max_buffered; at the bound offer() drops the oldest record (counted).
        self._buffer: deque[tuple[LokiRecord, int]] = deque()
        self._buffered_bytes = 0
        self._wakeup = trio.Event()
        self._pushed = self._failed = self._dropped = self._rejected = self._retries = 0
        self._logged_rejections: set[int] = set()
        #: Records of the batch being sent (0 between batches).
        self.in_flight = 0
        # Set when the batch in flight ends (sent, given up or rejected), then replaced.
        self._batch_done = trio.Event()

    def offer(self, record: LokiRecord) -> None:
        """Queue ``record`` for Loki; never blocks, never raises on a full buffer.

        At ``max_buffered`` the oldest queued record is dropped and counted.
        """
        if len(self._buffer) >= self._max_buffered:
            _, size = self._buffer.popleft()
            self._buffered_bytes -= size
            self._dropped += 1
        size = _entry_bytes(record)
        self._buffer.append((record, size))
        self._buffered_bytes += size
        self._wakeup.set()

    def offer_many(self, records: Iterable[LokiRecord]) -> None:
        """:meth:`offer` for each of ``records`` in order, with one wake-up: what
        wrk-monitor's hook calls once per accepted push (hundreds of records)."""
        buffer, limit = self._buffer, self._max_buffered
        added = dropped = 0
        for record in records:
            if len(buffer) >= limit:
                _, size = buffer.popleft()
                added -= size
                dropped += 1
            size = _entry_bytes(record)
            buffer.append((record, size))
            added += size
        self._buffered_bytes += added
        self._dropped += dropped
        self._wakeup.set()

    def statistics(self) -> LokiPusherStatistics:
        """The counters now."""
        return LokiPusherStatistics(pushed=self._pushed, failed=self._failed, dropped=self._dropped,
                                    rejected=self._rejected, retries=self._retries,
                                    buffered=len(self._buffer))

    def take_buffered(self) -> list[LokiRecord]:
        """Empty the buffer and return what it held, oldest first (not the batch in
        flight): a pusher being replaced hands these to its successor."""
        records = [record for record, _ in self._buffer]
        self._buffer.clear()
        self._buffered_bytes = 0
        return records

    async def wait_idle(self) -> None:
        """Until no batch is in flight (returns at once between batches)."""
        while self.in_flight:
            await self._batch_done.wait()

    async def wait_drained(self) -> None:
        """Until the buffer is empty and no batch is in flight (bound it with a timeout:
        while Loki is down this can take up to ``max_retries`` backoffs per batch)."""
        while self._buffer or self.in_flight:
            await self._batch_done.wait()  # run() takes and ends the next batch

    async def aclose(self) -> None:
        """Close the HTTP client if this pusher opened it. Buffered records are not flushed."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> LokiPusher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def run(self) -> None:
        """Push batches until cancelled (start it in a nursery). Drains nothing on cancel."""
        while True:
            await self._wait_for_batch()
            batch = self._take_batch()
            self.in_flight = len(batch)
            try:
                await self._send(batch)
            finally:
                self.in_flight = 0
                done, self._batch_done = self._batch_done, trio.Event()
                done.set()

    def _batch_full(self) -> bool:
        return (len(self._buffer) >= self._batch_max_records
                or self._buffered_bytes >= self._batch_max_bytes)

    async def _wait(self) -> None:
        event = self._wakeup = trio.Event()
        await event.wait()

    async def _wait_for_batch(self) -> None:
        """Until a record is queued, then until the batch is full or the flush interval passes."""
        while not self._buffer:
            await self._wait()
        with trio.move_on_after(self._flush_interval_s):
            while not self._batch_full():
                await self._wait()

    def _take_batch(self) -> list[LokiRecord]:
        """Up to one batch from the buffer's front (at least one record, even an oversized one)."""
        batch: list[LokiRecord] = []
        size = 0
        while self._buffer and len(batch) < self._batch_max_records:
            record, record_size = self._buffer[0]
            if batch and size + record_size > self._batch_max_bytes:
                break
            self._buffer.popleft()
            self._buffered_bytes -= record_size
            batch.append(record)
            size += record_size
        return batch

    def _backoff_s(self, attempt: int, retry_after_s: float | None) -> float:
        """Exponential backoff with jitter in [delay/2, delay], never below Loki's Retry-After."""
        delay = min(self._backoff_max_s, self._backoff_initial_s * 2 ** attempt)
        delay *= 0.5 + self._rng.random() / 2
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self._backoff_max_s))
        return delay

    async def _send(self, batch: list[LokiRecord]) -> None:
        """Push one batch, retrying transient failures; count the outcome."""
        # Level 1: log lines compress well even so, and CPU is what limits the rate.
        body = gzip.compress(encode_push(batch), compresslevel=1)
        url = self.url + PUSH_PATH
        for attempt in range(self._max_retries + 1):
            retry_after_s: float | None = None
            try:
                response = await self._client.post(url, content=body, headers=self._headers,
                                                   auth=self._auth or httpx.USE_CLIENT_DEFAULT)
            except httpx.HTTPError as exc:  # transport errors, and an answer that fails to decode
                reason = f"{type(exc).__name__}: {exc}"
            else:
                status = response.status_code
                if 200 <= status < 300:
                    self._pushed += len(batch)
                    return
                if status != 429 and status < 500:
                    self._rejected += len(batch)
                    if status not in self._logged_rejections:
                        self._logged_rejections.add(status)
                        logger.warning("loki.push.rejected url=%s status=%d records=%d message=%r"
                                       " (logged once per status)", self.safe_url, status,
                                       len(batch), response.text[:500])
                    return
                reason = f"status {status}: {response.text[:200]!r}"
                retry_after_s = _retry_after_s(response.headers.get("Retry-After"))
            if attempt == self._max_retries:
                break
            self._retries += 1
            delay = self._backoff_s(attempt, retry_after_s)
            logger.debug("loki.push.retry url=%s attempt=%d delay_s=%.3f reason=%s",
                         self.safe_url, attempt + 1, delay, reason)
            await trio.sleep(delay)
        self._failed += len(batch)
        logger.warning("loki.push.failed url=%s records=%d after=%d retries reason=%s",
                       self.safe_url, len(batch), self._max_retries, reason)


def _retry_after_s(value: str | None) -> float | None:
    """Retry-After in seconds (the HTTP-date form is ignored: Loki sends none)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


class _Stream(pydantic.BaseModel):
    stream: dict[str, str]
    # The optional third element: with ``categorize-labels`` asked, the entry's labels by
    # kind (``structuredMetadata``...); without (as here), Loki merges structured metadata
    # into ``stream``, so an entry's cursor is read from either.
    values: list[tuple[str, str] | tuple[str, str, dict[str, Any]]]


class _Data(pydantic.BaseModel):
    resultType: Literal["streams"]  # Loki's field name
    result: list[_Stream]


class _QueryResponse(pydantic.BaseModel):
    status: Literal["success"]
    data: _Data


class LokiReader:
    """Reads a job's records back from Loki with ``query_range``.

    Args:
        url: Loki's base URL.
        tenant: sent as ``X-Scope-OrgID`` when given.
        client: an ``httpx.AsyncClient`` (not closed here); one is opened otherwise.
    """

    def __init__(self, url: str, *, tenant: str | None = None, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None) -> None:
        #: Loki's URL without credentials (sent as basic auth): what errors name.
        self.url, self._auth = split_credentials(url)
        self.safe_url = self.url
        self._headers = {} if tenant is None else {"X-Scope-OrgID": tenant}
        self._owns_client = client is None
        self._client = client if client is not None else _open_client(timeout_s)

    async def aclose(self) -> None:
        """Close the HTTP client if this reader opened it."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> LokiReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def ready(self) -> bool:
        """Whether ``GET /ready`` answers 200 (a transport error is "not ready")."""
        try:
            response = await self._client.get(self.url + READY_PATH, headers=self._headers,
                                              auth=self._auth or httpx.USE_CLIENT_DEFAULT)
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def query_range(self, job_id: str, *, source: str | None = None,
                          start_ns: int, end_ns: int, limit: int = 5000,
                          direction: Direction = "backward",
                          page_limit: int = 1000, max_pages: int = 1000) -> list[LokiRecord]:
        """The job's records in ``[start_ns, end_ns)``, oldest first.

        ``direction`` picks which end ``limit`` keeps: ``backward`` the newest
        ``limit`` records, ``forward`` the oldest. Pages of ``page_limit`` are
        fetched until ``limit`` records, an empty or short page, or
        ``max_pages``. A page after a boundary asks for ``page_limit`` plus
        the entries it repeats; keep that under Loki's
        ``max_entries_limit_per_query`` (5000 by default).

        Raises:
            LokiError: Loki answered with a non-2xx status (with its message),
                an undocumented body, or could not be reached (status 0).
        """
        if limit < 1 or page_limit < 1:
            raise ValueError("limit and page_limit must be >= 1")
        matchers = [("job_id", job_id)] + ([("source", source)] if source is not None else [])
        query = stream_selector(matchers)
        out: list[LokiRecord] = []
        # Entries already returned at the boundary timestamp: the next page includes that
        # timestamp again (start inclusive / end moved just past it) and repeats them.
        seen: set[tuple[int, tuple[tuple[str, str], ...], str]] = set()
        boundary_ts: int | None = None
        lo, hi = start_ns, end_ns
        for _ in range(max_pages):
            if lo >= hi or len(out) >= limit:
                break
            # The boundary entries come first again: ask for that many more, so every page
            # can bring page_limit new ones even when thousands share one nanosecond.
            # ``seen`` holds only returned records, so it is bounded by ``limit``.
            want = page_limit + len(seen)
            page = await self._page(query, lo, hi, want, direction)
            fresh = [e for e in page if e not in seen]
            out.extend(_record(*e) for e in fresh[:limit - len(out)])
            if len(page) < want:
                break  # Loki had no more in the range
            last_ts = page[-1][0]
            at_last = {e for e in page if e[0] == last_ts}
            seen = seen | at_last if last_ts == boundary_ts else at_last
            boundary_ts = last_ts
            if not fresh:
                # A full page of repeats cannot happen (it holds page_limit more entries
                # than ``seen``) unless Loki repeats entries within a page. Step past that
                # nanosecond rather than loop.
                logger.warning("loki.query.skipped_timestamp job_id=%s ts=%d page_limit=%d",
                               job_id, last_ts, page_limit)
                seen, boundary_ts = set(), None
                last_ts += 1 if direction == "forward" else -1
            if direction == "forward":
                lo = last_ts  # start is inclusive
            else:
                hi = last_ts + 1  # end is exclusive
        if direction == "backward":
            out.reverse()
        return out

    async def _page(self, query: str, start_ns: int, end_ns: int, limit: int,
                    direction: Direction) -> list[tuple[int, tuple[tuple[str, str], ...], str]]:
        """One query_range call: its entries across streams, in ``direction`` order."""
        params = {"query": query, "start": str(start_ns), "end": str(end_ns),
                  "limit": str(limit), "direction": direction}
        url = self.url + QUERY_RANGE_PATH
        try:
            response = await self._client.get(url, params=params, headers=self._headers,
                                              auth=self._auth or httpx.USE_CLIENT_DEFAULT)
        except httpx.TransportError as exc:
            raise LokiError(0, f"{type(exc).__name__}: {exc}", url=self.safe_url) from exc
        if response.status_code != 200:
            raise LokiError(response.status_code, response.text.strip()[:1000], url=self.safe_url)
        try:
            parsed = _QueryResponse.model_validate_json(response.content)
        except pydantic.ValidationError as exc:
            raise LokiError(response.status_code, f"undocumented query_range answer: {exc}",
                            url=self.safe_url) from exc
        entries = []
        for stream in parsed.data.result:
            stream_labels = tuple(sorted(stream.stream.items()))
            for value in stream.values:
                labels = stream_labels
                if len(value) == 3 and isinstance(value[2].get("structuredMetadata"), dict):
                    meta = {k: str(v) for k, v in value[2]["structuredMetadata"].items()}
                    labels = tuple(sorted({**stream.stream, **meta}.items()))
                try:
                    ts = int(value[0])
                except ValueError as exc:
                    raise LokiError(response.status_code, f"bad timestamp {value[0]!r}",
                                    url=self.safe_url) from exc
                entries.append((ts, labels, value[1]))
        entries.sort(key=lambda e: e[0], reverse=direction == "backward")
        return entries


def _record(ts: int, labels: tuple[tuple[str, str], ...], line: str) -> LokiRecord:
    named = dict(labels)
    return LokiRecord(time_ns=ts, service=named.get("service", ""),
                      source=named.get("source", ""), job_id=named.get("job_id", ""), line=line,
                      cursor=named.get("cursor", ""))

