"""wrk-monitor's RPC service ``cosmicac-monitor/1``: records pushed in, followed live.

Theory of operation
-------------------
:class:`MonitorService` is a :class:`~p2p.host.RpcService` the daemon adds to
its swarm, over one :class:`~nodes.monitor._buffer.LogBuffer`. ``logs.push``
decodes a batch (``contracts.monitor.decode_batch``: shape and bounds, no
model per record) and appends it synchronously, so a push costs no task
switch beyond the RPC's own; it answers the count taken. ``logs.follow`` is a
server stream: the matching records still in the buffer, then live ones, in
:class:`~contracts.monitor.RecordBatch` items of up to
``MAX_BATCH_RECORDS`` records, each item as many records as were waiting (so a
busy stream sends few large items and an idle one a record as soon as it
comes). A follower whose queue overflows (its client does not read: the RPC
stream's credit runs out and the handler stops taking) is cut off by the
buffer; its stream sends what it holds and ends with ``LAGGED``.

Why a unary push and not a one-way channel: one 500-record push is one round
trip per 500 records, ~100 calls/s at the 50,000 records/s target, far below
what one RPC channel carries (p2p/rpc README: ~2,000 calls/s one at a time),
and the answer is the shipper's acknowledgement (it keeps a batch until it is
answered). A shipper may keep a few pushes in flight.

Who may call what (:data:`METHOD_ROLES`, least privilege): every method names
the one allow-list whose keys may call it, and the router's guard (the stack's
``p2p.rpc.AccessTable``, as wrk-ork's) checks every call before it is routed
or its params read; a method without a row cannot be added, and a name the
table does not list is ``FORBIDDEN`` to everyone. The lists are the daemon's
settings, each naming exactly the peers that need it (``cosmicac up`` and
``bootstrap`` write them):

==================  =============  =======================================================
method              allow-list     who is in it
==================  =============  =======================================================
logs.push           ``pushers``    the daemons that ship their logs (app-node, wrk-ork,
                                   the workers, the proxies), or anyone while
                                   ``allow_any_pusher`` is set (see below)
metrics.push        ``proxies``    proxy-inference (its per-job windows: model health)
metrics.agents      ``workers``    the workers (their agents' figures)
logs.follow,        ``followers``  app-node (it checks the user's team, then reads for
logs.tail,                         them: ``GET /api/jobs/{id}/logs``)
logs.query,
health.jobs,
agents.heard,
service.status,
observability.*
==================  =============  =======================================================

An empty list admits nobody (a wrk-monitor started with no ``followers`` serves
no logs; it never opens up). ``allow_any_pusher`` admits any key to
``logs.push`` only: agents' keys are not known in advance (today agents ship
through their worker, so it stays off); a pusher can only add records, which
are labelled by what it claims (the ``service`` field is not proven). It never
admits ``metrics.push`` (an agent could paint any job Unhealthy) or
``metrics.agents`` (an agent could speak for other agents). Refusals are
``FORBIDDEN`` naming the setting to add the key to.

The protocol (its methods, models, error codes and the
``metrics_sender_ages`` status detail) is :mod:`contracts.monitor`; this module
serves it. ``logs.query`` reads the buffer with the same filter as a follow,
then asks Loki for the older part (records strictly older than the buffer's
first, within :data:`LOKI_QUERY_TIMEOUT_S`), as the HTTP side does.
``observability.*`` are answered by the Loki and Prometheus in force, swapped
at runtime by :class:`~nodes.monitor.observability.ObservabilityHolder`
(``UNAVAILABLE`` on a service built without one). A ``metrics.push`` is kept
as that sender's newest report in the :class:`~nodes.monitor.health.HealthBook`
(wrk-monitor's clock, at most ``health.max_senders`` senders, else
``TOO_MANY_SENDERS``), which ``health.jobs`` reads. ``service.status`` lists
every metrics sender seen since start (at most ``MAX_REMEMBERED_SENDERS``
remembered) with :func:`~contracts.monitor.sender_ages_detail`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Protocol

import trio

from contracts.health import STATUS, ServiceStatus, StatusRequest, service_status
from contracts.monitor import (
    FOLLOW,
    HEALTH_JOBS,
    MAX_BATCH_RECORDS,
    METRICS_PUSH,
    OBSERVABILITY_CLEAR,
    OBSERVABILITY_GET,
    OBSERVABILITY_SET,
    PROTOCOL,
    PUSH,
    QUERY,
    SENDER_AGES,
    TAIL,
    BadBatch,
    Follow,
    HealthQuery,
    HealthResult,
    LogRecord,
    MetricsReport,
    MetricsResult,
    Observability,
    ObservabilityClear,
    ObservabilityQuery,
    ObservabilityState,
    PushBatch,
    PushResult,
    Query,
    QueryResult,
    RecordBatch,
    Tail,
    TailBatch,
    decode_batch,
    encode_batch,
    make_record,
    parse_cursor,
    sender_ages_detail,
    split_batches,
    stream_order,
)
from p2p.host import RpcService
from p2p.rpc import (
    AccessTable,
    CallContext,
    Method,
    Router,
    RpcConfig,
    RpcError,
    StreamMethod,
)

from ._buffer import Follower, LogBuffer, Numbered
from .health import HealthBook, TooManySenders
from .loki import LokiError, LokiReader, LokiRecord

__all__ = ["LOKI_QUERY_TIMEOUT_S", "MAX_FOLLOWERS", "METHOD_ROLES", "ROLES", "MonitorService"]

log = logging.getLogger(__name__)

#: The allow-lists (settings of the same names), each the keys of one kind of peer.
ROLES = ("pushers", "proxies", "workers", "followers")
#: Who may call each method (the module docstring's table). A method not here
#: cannot be added to the service.
METHOD_ROLES: dict[str, str] = {
    "logs.push": "pushers",
    "metrics.push": "proxies",
    "metrics.agents": "workers",
    "logs.follow": "followers",
    "logs.tail": "followers",
    "agents.heard": "followers",
    "logs.query": "followers",
    "health.jobs": "followers",
    "service.status": "followers",
    "observability.set": "followers",
    "observability.get": "followers",
    "observability.clear": "followers",
}
#: Who each allow-list is for, in a refusal's message.
_ROLE_PEERS = {"pushers": "the daemons that ship their logs", "proxies": "proxy-inference",
               "workers": "the workers", "followers": "app-node"}

#: Follow streams at once; more get TOO_MANY_FOLLOWERS.
MAX_FOLLOWERS = 256
#: How long ``logs.query`` waits for Loki's history: under app-node's call
#: bound (10 s), so a slow Loki costs the history, not the answer.
LOKI_QUERY_TIMEOUT_S = 5.0
#: How far back ``logs.query`` asks Loki when no ``since_ns`` is given.
HISTORY_S = 7 * 24 * 3600
#: Records of a job's older history a tail reads from Loki at most (the newest ones).
TAIL_HISTORY_RECORDS = 5_000


#: Senders whose last report is remembered (keys are pushers only, so few; the
#: bound only keeps a reconfigured monitor's memory finite).
MAX_REMEMBERED_SENDERS = 256


class _LokiCounters(Protocol):
    buffered: int
    dropped: int
    failed: int


class LokiStats(Protocol):
    """What the service reads of Loki's pusher (``LokiPusher.statistics``)."""

    def statistics(self) -> _LokiCounters: ...


class Observer(Protocol):
    """What the service reads of the Loki in force and asks to swap it
    (:class:`~nodes.monitor.observability.ObservabilityHolder`)."""

    @property
    def reader(self) -> LokiReader | None: ...

    def statistics(self) -> _LokiCounters: ...

    def state(self) -> ObservabilityState: ...

    async def set(self, value: Observability) -> ObservabilityState: ...

    async def clear(self) -> ObservabilityState: ...


class MonitorService(RpcService):
    """The ``cosmicac-monitor/1`` service over ``buffer``.

    Args:
        buffer: the ring and followers (the daemon also hands it to Loki's pusher).
        pushers: keys allowed to push logs (``logs.push``).
        allow_any_pusher: anyone may push logs (see the module docstring); may be
            changed while running.
        proxies: keys allowed to push the proxies' metrics (``metrics.push``).
        workers: keys allowed to push the agents' metrics (``metrics.agents``).
        followers: keys allowed to read (``logs.*``, ``health.jobs``,
            ``service.status``, ``observability.*``): app-node's.
        config: the RPC server's limits.
        on_records: called with every accepted batch once it is in the buffer
            (the daemon hands them to Loki's pusher); synchronous, so it must
            be O(batch) and never block: ingestion waits for it.
        health: the proxies' metrics reports (a fresh book by default).
        loki: Loki's pusher, whose backlog ``service.status`` reports (None: no Loki).
        observability: the Loki and Prometheus in force (``observability.*``,
            ``logs.query``'s history, and ``service.status`` when ``loki`` is None).
        clock: monotonic seconds, for the reports' staleness.
        wall_clock: seconds since the epoch, for ``last_report_at``.
        started_at: when the daemon started (wall clock).
    """

    def __init__(self, buffer: LogBuffer, *, pushers: Iterable[bytes] = (),
                 allow_any_pusher: bool = False, proxies: Iterable[bytes] = (),
                 workers: Iterable[bytes] = (), followers: Iterable[bytes] = (),
                 config: RpcConfig | None = None,
                 on_records: Callable[[list[LogRecord], Callable[[], list[str]]], object]
                 | None = None,
                 health: HealthBook | None = None, loki: LokiStats | None = None,
                 observability: Observer | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time,
                 started_at: float | None = None) -> None:
        self.buffer = buffer
        self.on_records = on_records
        self.health = health if health is not None else HealthBook()
        #: The agents' figures, once installed (``agent_metrics.install``).
        self.agent_metrics: Any = None
        self.observability = observability
        self.loki = loki if loki is not None else observability
        self.clock = clock
        self.wall_clock = wall_clock
        self.started_at = wall_clock() if started_at is None else started_at
        #: The newest accepted push of logs or metrics (wall clock), or None.
        self.last_report_at: float | None = None
        #: Metrics reports refused (``TOO_MANY_SENDERS``).
        self.refused_reports = 0
        #: Each metrics sender's last taken report (``clock``), oldest first: what
        #: ``service.status`` lists (the book forgets stale senders; this does not).
        self._sender_seen: dict[bytes, float] = {}
        #: The allow-lists (sets: a reload may change them while running).
        self.pushers = set(pushers)
        self.allow_any_pusher = allow_any_pusher
        self.proxies = set(proxies)
        self.workers = set(workers)
        self.followers = set(followers)
        #: Batches refused as malformed (``BAD_BATCH``).
        self.bad_batches = 0
        self._streams = 0
        #: The check every call passes before it is routed (p2p.rpc.AccessTable).
        self.access = AccessTable(
            "wrk-monitor", {method: {role} for method, role in METHOD_ROLES.items()},
            self._roles_of,
            hint=lambda roles: f"add the key to wrk-monitor's {' or '.join(sorted(roles))} "
                               f"setting ({', '.join(_ROLE_PEERS[r] for r in sorted(roles))})")
        super().__init__(PROTOCOL, Router(guard=self.access.check), config=config)
        self.add_method(PUSH, self._push)
        self.add_method(FOLLOW, self._follow)
        self.add_method(TAIL, self._tail)
        self.add_method(QUERY, self._query)
        self.add_method(METRICS_PUSH, self._metrics_push)
        self.add_method(HEALTH_JOBS, self._health_jobs)
        self.add_method(STATUS, self._status)
        self.add_method(OBSERVABILITY_SET, self._observability_set)
        self.add_method(OBSERVABILITY_GET, self._observability_get)
        self.add_method(OBSERVABILITY_CLEAR, self._observability_clear)

    def _roles_of(self, key: bytes) -> set[str]:
        """The allow-lists ``key`` is on (read per call: a reload may change them)."""
        roles = {role for role in ROLES if key in getattr(self, role)}
        if self.allow_any_pusher:
            roles.add("pushers")
        return roles

    def allowed(self, method: str, key: bytes | None) -> bool:
        """May ``key`` call ``method``? (:data:`METHOD_ROLES`; an unknown method: no.)"""
        return self.access.allowed(method, key)

    def add_method(self, method: Method | StreamMethod, handler: Callable[..., Any]) -> None:
        """Serve ``method`` with ``handler``, for the keys of its allow-list only (the
        router's guard refuses the others before the call is routed).

        Raises:
            ValueError: ``method`` has no row in :data:`METHOD_ROLES`.
        """
        if method.name not in METHOD_ROLES:
            raise ValueError(f"{method.name!r} names no allow-list in METHOD_ROLES")
        self.router.add(method, handler)

    async def _push(self, params: PushBatch, ctx: CallContext) -> PushResult:
        try:
            records = decode_batch(params.records)
        except BadBatch as exc:
            self.bad_batches += 1
            raise RpcError("BAD_BATCH", str(exc)) from None
        self.buffer.append(records)
        if self.on_records is not None and records:
            self.on_records(records, self.buffer.last_cursors)
        self.last_report_at = self.wall_clock()
        return PushResult(accepted=len(records))

    async def _metrics_push(self, params: MetricsReport, ctx: CallContext) -> MetricsResult:
        key = ctx.remote_public_key
        assert key is not None  # add_method checked it is a proxy's
        try:
            self.health.accept(key, params, self.clock())
        except TooManySenders as exc:
            self.refused_reports += 1
            raise RpcError("TOO_MANY_SENDERS", f"{exc}; raise health.max_senders") from None
        seen = self._sender_seen
        seen.pop(key, None)  # re-inserted last: the dict stays oldest first
        seen[key] = self.clock()
        if len(seen) > MAX_REMEMBERED_SENDERS:
            del seen[next(iter(seen))]
        self.last_report_at = self.wall_clock()
        return MetricsResult(accepted=len(params.jobs))

    async def _health_jobs(self, params: HealthQuery, ctx: CallContext) -> HealthResult:
        return HealthResult(jobs=tuple(self.health.health(params.job_ids, self.clock())))

    def status(self) -> ServiceStatus:
        """What ``service.status`` answers (also read by tests)."""
        stats = self.buffer.stats
        details: dict[str, int | float | str | bool | None] = {
            "metrics_senders": self.health.senders(self.clock()),
            "metrics_reports": self.health.accepted,
            "buffered_records": stats.records,
            "evicted_records": stats.evicted,
            "followers": self.buffer.followers,
            "bad_batches": self.bad_batches,
        }
        now = self.clock()
        details[SENDER_AGES] = sender_ages_detail(
            (key, now - at) for key, at in reversed(self._sender_seen.items()))
        queue_depth = 0
        if self.loki is not None:
            loki = self.loki.statistics()
            queue_depth = loki.buffered
            details.update(loki_dropped=loki.dropped, loki_failed=loki.failed)
        if self.observability is not None:
            state = self.observability.state()  # URLs without credentials
            details.update(loki=state.loki, loki_url=state.loki_url,
                           prometheus_url=state.prometheus_url, observability_from=state.origin)
        return service_status("wrk-monitor", started_at=self.started_at,
                              queue_depth=queue_depth, last_report_at=self.last_report_at,
                              details=details)

    async def _status(self, params: StatusRequest, ctx: CallContext) -> ServiceStatus:
        return self.status()

    def _observer(self) -> Observer:
        if self.observability is None:
            raise RpcError("UNAVAILABLE", "this wrk-monitor takes no observability settings")
        return self.observability

    async def _observability_set(self, params: Observability, ctx: CallContext
                                 ) -> ObservabilityState:
        return await self._observer().set(params)

    async def _observability_clear(self, params: ObservabilityClear, ctx: CallContext
                                   ) -> ObservabilityState:
        return await self._observer().clear()

    async def _observability_get(self, params: ObservabilityQuery, ctx: CallContext
                                 ) -> ObservabilityState:
        return self._observer().state()

    async def _query(self, params: Query, ctx: CallContext) -> QueryResult:
        # A follower without notify, emptied at once: the buffer's own filter.
        follower = self.buffer.follow(job_id=params.job_id, source=params.source,
                                      since_ns=params.since_ns, snapshot=True)
        try:
            matching = [record for _, record in follower.take(follower.pending)]
        finally:
            self.buffer.unfollow(follower)
        tail = matching[-params.limit:]
        older: list[LogRecord] = []
        history = "buffer"
        more = len(tail) < len(matching)
        reader = None if self.observability is None else self.observability.reader
        if reader is not None and params.job_id is not None and len(tail) < params.limit:
            want = params.limit - len(tail)
            older, history = await self._history(reader, params, want, tail)
            more = more or len(older) >= want
        records = older + tail
        # The newest records that fit one batch's bytes.
        chunks = list(split_batches(records))
        newest = chunks[-1] if chunks else []
        return QueryResult(records=encode_batch(newest),
                           more=more or len(newest) < len(records), history=history)

    async def _history(self, reader: LokiReader, params: Query, want: int,
                       held: list[LogRecord]) -> tuple[list[LogRecord], str]:
        """Up to ``want`` matching records older than the buffer, from Loki."""
        assert params.job_id is not None
        first = self.buffer.first
        end_ns = first.time_ns if first is not None else int(self.wall_clock() * 1e9) + 1
        start_ns = (params.since_ns if params.since_ns is not None
                    else end_ns - HISTORY_S * 10**9)
        if start_ns >= end_ns:
            return [], "loki"
        with trio.move_on_after(LOKI_QUERY_TIMEOUT_S):
            try:
                found = await reader.query_range(params.job_id, source=params.source,
                                                 start_ns=max(0, start_ns), end_ns=end_ns,
                                                 limit=want, direction="backward")
            except LokiError as exc:
                return [], f"loki-error: {str(exc)[:1000]}"
            # A record that arrived late (older than the ring's first) is in both.
            seen = {(r.time_ns, r.source, r.service, r.text) for r in held}
            return [make_record(r.line, service=r.service, source=r.source, level=0,
                                job_id=r.job_id or None, time_ns=r.time_ns)
                    for r in found
                    if (r.time_ns, r.source, r.service, r.line) not in seen], "loki"
        return [], f"loki-error: no answer within {LOKI_QUERY_TIMEOUT_S} s"

    async def _follow(self, params: Follow, ctx: CallContext) -> AsyncIterator[RecordBatch]:
        async for items in self._followed(params.job_id, params.source, params.since_ns,
                                          snapshot=params.snapshot):
            seqs = [seq for seq, _, _ in items]
            done = 0
            # Each item within the byte bound; ``seq`` is its last record's.
            for chunk in split_batches([record for _, record, _ in items]):
                done += len(chunk)
                yield RecordBatch(records=encode_batch(chunk), seq=seqs[done - 1])

    async def _tail(self, params: Tail, ctx: CallContext) -> AsyncIterator[TailBatch]:
        after = parse_cursor(params.after) if params.after is not None else None
        job_id = params.job_id
        #: The stream the numbers sent so far belong to, and the last number.
        stream, last = self.buffer.job_stream(job_id), 0
        history: list[TailBatch] = []

        async def older(follower: Follower) -> None:
            # Once the follower holds its snapshot: what Loki has before it.
            history.extend(await self._tail_history(params, after, follower))

        async for items in self._followed(job_id, params.source, params.since_ns,
                                          snapshot=True, numbered=True, after=after,
                                          before=older):
            for batch in history:
                yield batch
            history.clear()
            for run in _runs(items, last):
                # A number not above the last one: the job's counter began again (a
                # new stream) while these waited; the stream is the job's now.
                if stream is None or run[0][2] <= last:
                    stream = self.buffer.job_stream(job_id)
                last = run[-1][2]
                if stream is None:  # a numbered record's job has a stream: cannot be
                    continue
                for batch in _tail_batches(run, stream):
                    yield batch

    async def _tail_history(self, params: Tail, after: tuple[str, int] | None,
                            follower: Follower) -> list[TailBatch]:
        """What Loki holds of the job before what ``follower`` starts with, after
        ``after``, numbered by its cursors, oldest stream first: records evicted from
        the ring, and those of an earlier wrk-monitor (its streams sort before ours).
        Nothing when the ring reaches back to the cursor, without Loki, or when Loki
        fails or is slow (the follow goes on from the ring; logged)."""
        reader = None if self.observability is None else self.observability.reader
        if reader is None:
            return []
        job_id = params.job_id
        current = self.buffer.job_stream(job_id)
        first = follower.first_pending()
        first_number = first[2] if first is not None else None
        if after is not None and after[0] == current:
            # Resuming in the job's stream: Loki is needed only for a gap the ring
            # no longer holds (without a cursor, or one of an earlier stream, Loki
            # may hold an earlier wrk-monitor's records: always asked).
            if first_number is not None and first_number <= after[1] + 1:
                return []
            if first_number is None and after[1] == self.buffer.last_number(job_id):
                return []  # caught up
        end_ns = first[1].time_ns + 1 if first is not None else int(self.wall_clock() * 1e9)
        start_ns = (params.since_ns if params.since_ns is not None
                    else end_ns - HISTORY_S * 10**9)
        found: list[LokiRecord] = []
        with trio.move_on_after(LOKI_QUERY_TIMEOUT_S) as waited:
            try:
                found = await reader.query_range(job_id, source=params.source,
                                                 start_ns=max(0, start_ns), end_ns=end_ns,
                                                 limit=TAIL_HISTORY_RECORDS,
                                                 direction="backward")
            except LokiError as exc:
                log.warning("monitor.tail_history_failed job=%s error=%s", job_id, exc)
        if waited.cancelled_caught:
            log.warning("monitor.tail_history_slow job=%s limit_s=%s", job_id,
                        LOKI_QUERY_TIMEOUT_S)
        after_key = None if after is None else (stream_order(after[0]), after[1])
        numbered: dict[tuple[tuple[int, int], int], tuple[str, LogRecord]] = {}
        for record in found:
            try:
                stream, seq = parse_cursor(record.cursor)
                key = (stream_order(stream), seq)
            except ValueError:
                continue  # kept without a cursor (an older wrk-monitor): not placeable
            if after_key is not None and key <= after_key:
                continue
            if stream == current and first_number is not None and seq >= first_number:
                continue  # the ring's snapshot has it
            numbered[key] = (stream, make_record(
                record.line, service=record.service, source=record.source, level=0,
                job_id=job_id, time_ns=record.time_ns))
        batches: list[TailBatch] = []
        by_stream: dict[str, list[Numbered]] = {}
        for key in sorted(numbered):
            stream, record = numbered[key]
            by_stream.setdefault(stream, []).append((0, record, key[1]))
        for stream, items in by_stream.items():
            batches.extend(_tail_batches(items, stream))
        return batches

    async def _followed(self, job_id: str | None, source: str | None, since_ns: int | None,
                        *, snapshot: bool, numbered: bool = False,
                        after: tuple[str, int] | None = None,
                        before: Callable[[Follower], Awaitable[None]] | None = None
                        ) -> AsyncIterator[list[Numbered]]:
        """What a follower takes, as it comes (snapshot first); ``numbered`` and
        ``after`` as :meth:`LogBuffer.follow`. Raises ``LAGGED`` once it was cut off.
        ``before(follower)`` runs once the follower holds its snapshot, then an empty
        list is yielded (so the caller may send something first)."""
        if self._streams >= MAX_FOLLOWERS:
            raise RpcError("TOO_MANY_FOLLOWERS", f"wrk-monitor serves at most {MAX_FOLLOWERS} "
                                                 "follow streams; close one first")
        wake = trio.Event()

        def notify() -> None:
            wake.set()

        self._streams += 1
        follower = self.buffer.follow(job_id=job_id, source=source, since_ns=since_ns,
                                      snapshot=snapshot, notify=notify,
                                      numbered=numbered, after=after)
        try:
            if before is not None:
                await before(follower)
                yield []
            while True:
                items = follower.take_numbered(MAX_BATCH_RECORDS)
                if not items:
                    if follower.lagged:
                        raise RpcError("LAGGED", f"this follow fell more than "
                                                 f"{follower.limit} records behind; "
                                                 "follow again (with since_ns)")
                    await wake.wait()
                    wake = trio.Event()
                    continue
                yield items
        finally:
            self._streams -= 1
            self.buffer.unfollow(follower)


def _runs(items: list[Numbered], last: int) -> list[list[Numbered]]:
    """``items`` cut where a job's number is not above the one before (its numbering
    began again); ``last`` is the number sent before them."""
    runs: list[list[Numbered]] = []
    previous = last
    for item in items:
        if not runs or item[2] <= previous:
            runs.append([])
        runs[-1].append(item)
        previous = item[2]
    return runs


def _tail_batches(items: list[Numbered], stream: str) -> Iterator[TailBatch]:
    """``items`` (one stream's) as batches within a batch's bounds."""
    done = 0
    for chunk in split_batches([record for _, record, _ in items]):
        seqs = [job_seq for _, _, job_seq in items[done:done + len(chunk)]]
        done += len(chunk)
        yield TailBatch(records=encode_batch(chunk), stream=stream, seqs=seqs)
