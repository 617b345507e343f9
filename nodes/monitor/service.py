"""wrk-monitor's RPC service ``cosmicac-monitor/1``: records pushed in, followed live.

Theory of operation
-------------------
:class:`MonitorService` is a :class:`~p2p.host.RpcService` the daemon adds to
its swarm, over one :class:`~nodes.monitor._buffer.LogBuffer`. ``logs.push``
decodes a batch (``contracts.telemetry.decode_batch``: shape and bounds, no
model per record) and appends it synchronously, so a push costs no task
switch beyond the RPC's own; it answers the count taken. ``logs.follow`` is a
server stream: the matching records still in the buffer, then live ones, in
:class:`~contracts.telemetry.RecordBatch` items of up to
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

Who may push: the keys in ``pushers`` (the platform's daemons, known from
config), or anyone while ``allow_any_pusher`` is set. Agents' keys are not known
in advance; the proposal (to be decided with the daemon's wiring) is that the
daemon sets ``allow_any_pusher`` while config ``telemetry.open`` is on, and
otherwise adds each agent's key when its worker learns it (``agent.hello``
binds it). A pusher can only add records, which are labelled by what it
claims; the ``service`` field is not proven (a later version may prefix it
with the caller's key). Who may follow: the keys in ``followers`` (app-node,
the CLI's key through app-node), since logs may hold secrets.

``logs.query`` (:data:`QUERY`) is the same filter without the stream: the newest
``limit`` matching records still in the buffer, in one answer (app-node's
``GET /api/jobs/{job}/logs`` without ``follow``); same followers only. A
stream's snapshot could serve it too, but a reader could not tell where the
snapshot ends and live records begin.

Error codes: ``FORBIDDEN``, ``BAD_BATCH`` (the batch is not valid records; the
message names the first bad one), ``LAGGED``, ``TOO_MANY_FOLLOWERS``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable

import trio
from pydantic import BaseModel, ConfigDict, Field

from contracts.telemetry import (
    FOLLOW,
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    PROTOCOL,
    PUSH,
    BadBatch,
    Follow,
    LogRecord,
    PushBatch,
    PushResult,
    RecordBatch,
    decode_batch,
    encode_batch,
    split_batches,
)
from p2p.host import RpcService
from p2p.rpc import CallContext, Method, Router, RpcConfig, RpcError

from ._buffer import LogBuffer

__all__ = ["MAX_FOLLOWERS", "QUERY", "MonitorService", "Query", "QueryResult"]

log = logging.getLogger(__name__)

#: Follow streams at once; more get TOO_MANY_FOLLOWERS.
MAX_FOLLOWERS = 256


class Query(Follow):
    """``logs.query``: :class:`Follow`'s filter (``snapshot`` is ignored) and how many."""

    #: The newest this many matching records.
    limit: int = Field(default=MAX_BATCH_RECORDS, ge=1, le=MAX_BATCH_RECORDS)


class QueryResult(BaseModel):
    """The matching records, oldest first (a batch's bytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    records: bytes = Field(max_length=MAX_BATCH_BYTES)
    #: Older matching records were left out (over ``limit`` or a batch's bytes).
    more: bool


QUERY = Method("logs.query", params=Query, result=QueryResult)


class MonitorService(RpcService):
    """The ``cosmicac-monitor/1`` service over ``buffer``.

    Args:
        buffer: the ring and followers (the daemon also hands it to Loki's pusher).
        pushers: keys allowed to push.
        allow_any_pusher: anyone may push (see the module docstring); may be changed
            while running.
        followers: keys allowed to follow.
        config: the RPC server's limits.
        on_records: called with every accepted batch once it is in the buffer
            (the daemon hands them to Loki's pusher); synchronous, so it must
            be O(batch) and never block: ingestion waits for it.
    """

    def __init__(self, buffer: LogBuffer, *, pushers: Iterable[bytes] = (),
                 allow_any_pusher: bool = False, followers: Iterable[bytes] = (),
                 config: RpcConfig | None = None,
                 on_records: Callable[[list[LogRecord]], object] | None = None) -> None:
        self.buffer = buffer
        self.on_records = on_records
        self.pushers = set(pushers)
        self.allow_any_pusher = allow_any_pusher
        self.followers = set(followers)
        #: Batches refused as malformed (``BAD_BATCH``).
        self.bad_batches = 0
        self._streams = 0
        router = Router()
        router.add(PUSH, self._push)
        router.add(FOLLOW, self._follow)
        router.add(QUERY, self._query)
        super().__init__(PROTOCOL, router, config=config)

    async def _push(self, params: PushBatch, ctx: CallContext) -> PushResult:
        key = ctx.remote_public_key
        if not self.allow_any_pusher and (key is None or key not in self.pushers):
            raise RpcError("FORBIDDEN", "this key may not push logs to wrk-monitor; "
                                        "add it to its pushers or open telemetry")
        try:
            records = decode_batch(params.records)
        except BadBatch as exc:
            self.bad_batches += 1
            raise RpcError("BAD_BATCH", str(exc)) from None
        self.buffer.append(records)
        if self.on_records is not None and records:
            self.on_records(records)
        return PushResult(accepted=len(records))

    def _check_follower(self, ctx: CallContext) -> None:
        key = ctx.remote_public_key
        if key is None or key not in self.followers:
            raise RpcError("FORBIDDEN", "this key may not follow wrk-monitor's logs")

    async def _query(self, params: Query, ctx: CallContext) -> QueryResult:
        self._check_follower(ctx)
        # A follower without notify, emptied at once: the buffer's own filter.
        follower = self.buffer.follow(job_id=params.job_id, source=params.source,
                                      since_ns=params.since_ns, snapshot=True)
        try:
            matching = [record for _, record in follower.take(follower.pending)]
        finally:
            self.buffer.unfollow(follower)
        tail = matching[-params.limit:]
        # The newest records that fit one batch's bytes.
        chunks = list(split_batches(tail))
        newest = chunks[-1] if chunks else []
        return QueryResult(records=encode_batch(newest), more=len(newest) < len(matching))

    async def _follow(self, params: Follow, ctx: CallContext) -> AsyncIterator[RecordBatch]:
        self._check_follower(ctx)
        if self._streams >= MAX_FOLLOWERS:
            raise RpcError("TOO_MANY_FOLLOWERS", f"wrk-monitor serves at most {MAX_FOLLOWERS} "
                                                 "follow streams; close one first")
        wake = trio.Event()

        def notify() -> None:
            wake.set()

        self._streams += 1
        follower = self.buffer.follow(job_id=params.job_id, source=params.source,
                                      since_ns=params.since_ns, snapshot=params.snapshot,
                                      notify=notify)
        try:
            while True:
                items = follower.take(MAX_BATCH_RECORDS)
                if not items:
                    if follower.lagged:
                        raise RpcError("LAGGED", f"this follow fell more than "
                                                 f"{follower.limit} records behind; "
                                                 "follow again (with since_ns)")
                    await wake.wait()
                    wake = trio.Event()
                    continue
                seqs = [seq for seq, _ in items]
                done = 0
                # Each item within the byte bound; ``seq`` is its last record's.
                for chunk in split_batches([record for _, record in items]):
                    done += len(chunk)
                    yield RecordBatch(records=encode_batch(chunk), seq=seqs[done - 1])
        finally:
            self._streams -= 1
            self.buffer.unfollow(follower)
