"""The agents a request goes to: one RPC client per agent connection, tries with one retry.

Theory of operation
-------------------
:class:`AgentPool` follows the routing table (:meth:`AgentPool.apply`). For
every endpoint agent of a routed job it keeps the connection up
(``stay_connected``, by key) and, on each connection, opens one
``cosmicac-inference/1`` channel with one :class:`~p2p.rpc.RpcClient`, which
every request to that agent shares. It also joins each routed job's DHT
topic as a client (``job_topic``), so agents are found where they announce;
the swarm's firewall (:meth:`AgentPool.allows`) refuses any announcer of a
job topic whose key wrk-ork does not list for that job, before dialling.

A request (:meth:`AgentPool.infer`) asks the :class:`~.replicas.Balancer` for
an agent, sends ``infer`` (after ``upload`` chunks for a body larger than
``MAX_INLINE_BODY``) and waits for the first frame; an answer the app expects
whole (a chat or completion that is not a stream, its body inline) is asked
with ``infer_whole`` instead, whose one reply is that frame. Anything that goes wrong
before that frame (the connection or channel ends, ``UNAVAILABLE``, ``BUSY``,
``UPSTREAM``, ``FORBIDDEN``, no frame at all) has shown the client nothing:
the agent is put in back-off and the request tried once more on another
agent. ``BAD_REQUEST`` and ``INVALID_PARAMS`` are the request's own fault and
are not retried. After the first frame the answer is the caller's; a failure
then ends it (:class:`UpstreamFailed` from the frame iterator).
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import trio

from contracts.inference import (
    INFER,
    INFER_WHOLE,
    MAX_INLINE_BODY,
    PROTOCOL,
    UPLOAD,
    InferFrame,
    InferRequest,
    UploadChunk,
)
from p2p.connection import Connection
from p2p.keys import format_key
from p2p.rpc import ItemStream, RpcClient, RpcError
from p2p.swarm import Swarm, SwarmError, UpkeepPolicy, stay_connected

from .replicas import Balancer
from .router import Route, RoutingTable

__all__ = ["AgentPool", "Answer", "NoReplica", "RequestRefused", "UpstreamFailed"]

log = logging.getLogger(__name__)

#: Tries per request: the first, and one retry on another replica.
MAX_TRIES = 2
#: Errors that are the request's own fault: another replica would say the same.
NOT_RETRIED = frozenset({"BAD_REQUEST", "INVALID_PARAMS"})
#: Reconnecting to an agent: quicker than the default upkeep at first (an
#: agent restarts in seconds), no slower at worst.
AGENT_UPKEEP = UpkeepPolicy(base_s=0.2, max_s=10.0, proven_after_s=5.0, dial_timeout_s=10.0)


class UpstreamError(Exception):
    """A request could not be answered by any agent; ``code`` is stable."""

    code = "UPSTREAM"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class NoReplica(UpstreamError):
    """No replica of the job is connected (or every try failed before answering): 503."""

    code = "NO_REPLICA"


class RequestRefused(UpstreamError):
    """The agent refused the request itself (``BAD_REQUEST``): 400."""

    code = "BAD_REQUEST"


class UpstreamFailed(UpstreamError):
    """The answer broke off after it began (the client saw part of it)."""

    code = "UPSTREAM"


#: Frames of a streamed answer handed on together at most (see Answer.batches).
BATCH_FRAMES = 64


@dataclass
class Answer:
    """An answer under way: its first frame, then :meth:`frames` for the rest."""

    first: InferFrame
    agent: bytes
    tries: int
    #: The rest of a streamed answer; None for one that came whole (``infer_whole``).
    _items: ItemStream[InferFrame] | None

    async def frames(self) -> AsyncIterator[InferFrame]:
        """The frames after the first, until the one with ``done``.

        Raises:
            UpstreamFailed: the stream ended or failed before ``done``.
        """
        async for batch in self.batches():
            for frame in batch:
                yield frame

    async def batches(self) -> AsyncIterator[list[InferFrame]]:
        """The frames after the first, in lists of those that arrived together.

        The first of each list was waited for; the rest had arrived by then
        (at most :data:`BATCH_FRAMES`), so a consumer writes them at once: one
        socket write per burst, not per frame, when the model server is ahead
        of the client. The last list ends with the frame that has ``done``.

        Raises:
            UpstreamFailed: the stream ended or failed before ``done``.
        """
        if self.first.done or self._items is None:
            return
        items = self._items
        while True:
            try:
                batch = [await items.receive()]
            except (trio.EndOfChannel, RpcError) as exc:
                raise _broken_off(exc) from exc
            ended: trio.EndOfChannel | RpcError | None = None
            while not batch[-1].done and len(batch) < BATCH_FRAMES:
                try:
                    batch.append(items.receive_nowait())
                except trio.WouldBlock:
                    break
                except (trio.EndOfChannel, RpcError) as exc:
                    ended = exc  # after the frames that came before it
                    break
            yield batch
            if batch[-1].done:
                return
            if ended is not None:
                raise _broken_off(ended) from ended


def _broken_off(exc: trio.EndOfChannel | RpcError) -> UpstreamFailed:
    """Why a streamed answer stopped before its ``done`` frame."""
    if isinstance(exc, RpcError):
        return UpstreamFailed(f"the answer broke off: {exc.code}: {exc}", code=exc.code)
    return UpstreamFailed("the agent ended the answer before it was done")


class AgentPool:
    """Connections to the agents of the routed jobs (see the module doc).

    Args:
        swarm: the proxy's running swarm; add :meth:`allows` as its firewall.
        balancer: picks the agent for each try.
        clock: the balancer's clock (trio's by default).
        on_retry: called with the route each time a request is tried again.
        connect_wait_s: how long a request waits for a replica the pool is still
            connecting to (see :meth:`_reach_a_replica`).
    """

    def __init__(self, swarm: Swarm, balancer: Balancer, *,
                 clock: Callable[[], float] = trio.current_time,
                 on_retry: Callable[[Route], object] | None = None,
                 connect_wait_s: float = 10.0) -> None:
        self.swarm = swarm
        self.connect_wait_s = connect_wait_s
        #: Set (then replaced) each time an agent's client is ready: what requests
        #: waiting for a replica of their job wake on.
        self._agent_ready = trio.Event()
        self.balancer = balancer
        self.table = RoutingTable()
        self.clients: dict[bytes, RpcClient] = {}
        self._clock = clock
        self._on_retry = on_retry
        self._keepers: dict[bytes, trio.CancelScope] = {}
        self._topics: set[bytes] = set()
        self._nursery: trio.Nursery | None = None
        #: Agents that answered ``infer_whole`` with ``UNKNOWN_METHOD`` (older ones):
        #: asked with ``infer`` only (bounded by the agents connected; forgotten with them).
        self._stream_only: set[bytes] = set()
        #: Answers begun, by agent (bounded by the agents the table lists, plus
        #: those it listed before: forgotten with them).
        self.answered: dict[bytes, int] = {}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the agents' connections until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.apply(self.table)
            task_status.started()
            await trio.sleep_forever()

    # -- following the table -----------------------------------------------------------

    def allows(self, remote_key: bytes, how: str) -> bool:
        """The swarm's firewall: an announcer of a job topic must be one of the job's agents."""
        if not how.startswith("topic:"):
            return True
        try:
            topic = bytes.fromhex(how[6:])
        except ValueError:
            return True
        if topic not in self._topics:
            return True  # not a job topic of ours (the database's, say)
        allowed = self.table.allows(remote_key, topic)
        if not allowed:
            log.info("proxy.agent_refused peer=%s job=%s reason=not listed by wrk-ork",
                     format_key(remote_key)[:12], self.table.topics.get(topic, "?"))
        return allowed

    def apply(self, table: RoutingTable) -> None:
        """Follow a new routing table: agents to keep connected, topics, endpoints."""
        old = self.table
        self.table = table
        for job_id in old.jobs.keys() - table.jobs.keys():
            self.balancer.forget_job(job_id)
        for route in table.jobs.values():
            self.balancer.set_endpoints(route.job_id, route.endpoints)
        nursery = self._nursery
        if nursery is None:
            return  # run() applies it once started
        wanted = table.connect_keys()
        for key in list(self._keepers.keys() - wanted):
            self._keepers.pop(key).cancel()
            self.balancer.forget_agent(key)
            self.answered.pop(key, None)
            self._stream_only.discard(key)
        for key in wanted - self._keepers.keys():
            scope = self._keepers[key] = trio.CancelScope()
            nursery.start_soon(self._keep, key, scope)
        topics = set(table.topics)
        for topic in topics - self._topics:
            try:
                self.swarm.join(topic, server=False, client=True)
            except SwarmError as exc:  # the swarm is stopping: so are we
                log.info("proxy.join_failed topic=%s reason=%s", format_key(topic)[:12], exc)
        for topic in self._topics - topics:
            nursery.start_soon(self._leave, topic)
        self._topics = topics

    async def _leave(self, topic: bytes) -> None:
        try:
            await self.swarm.leave(topic)
        except Exception as exc:  # leaving is tidying up; it must not stop the pool
            log.info("proxy.leave_failed topic=%s reason=%r", format_key(topic)[:12], exc)

    async def _keep(self, key: bytes, scope: trio.CancelScope) -> None:
        with scope:
            await stay_connected(self.swarm, key, backoff=AGENT_UPKEEP,
                                 on_connection=functools.partial(self._serve, key))

    async def _serve(self, key: bytes, connection: Connection) -> None:
        """One RPC client on one agent connection, shared by every request to it."""
        channel = await connection.open_channel(PROTOCOL)
        client = RpcClient(channel, name=f"proxy-agent-{format_key(key)[:8]}")
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            self.clients[key] = client
            self.balancer.connected(key)
            self._agent_ready.set()
            self._agent_ready = trio.Event()
            log.info("proxy.agent_connected peer=%s", format_key(key)[:12])
            try:
                await connection.wait_closed()
            finally:
                if self.clients.get(key) is client:
                    del self.clients[key]
                    self.balancer.disconnected(key)
                log.info("proxy.agent_disconnected peer=%s", format_key(key)[:12])
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await client.aclose()

    # -- requests ------------------------------------------------------------------------

    @asynccontextmanager
    async def infer(self, route: Route, *, path: str, content_type: str, body: bytes,
                    request_id: str, whole: bool = False) -> AsyncIterator[Answer]:
        """Send one request to one of ``route``'s agents; yield the answer once it begins.

        ``whole``: the answer is expected whole (a chat or completion that is not
        a stream): asked with ``infer_whole``, one message each way, when the
        body is inline; with ``infer`` otherwise, or when the agent cannot answer
        so (``UNKNOWN_METHOD``, ``TOO_LARGE``: asked again at once, same agent).

        Raises:
            NoReplica: no agent connected, or every try failed before answering.
            RequestRefused: the agent refused the request itself (``BAD_REQUEST``).
        """
        tried: list[bytes] = []
        last: str = "no replica of the job is connected"
        whole = whole and len(body) <= MAX_INLINE_BODY  # an upload is taken by one call
        if not any(key in self.clients for key in route.endpoints):
            await self._reach_a_replica(route)
        for attempt in range(MAX_TRIES):
            key = self.balancer.pick(route.job_id, self._clock(), tried)
            client = self.clients.get(key) if key is not None else None
            if key is None or client is None:
                break
            tried.append(key)
            if attempt:
                if self._on_retry is not None:
                    self._on_retry(route)
                log.info("proxy.retry job=%s request=%s peer=%s reason=%s", route.job_id,
                         request_id, format_key(key)[:12], last)
            request = await self._request(client, path, content_type, body, request_id)
            if whole and key not in self._stream_only:
                try:
                    frame = await client.call(INFER_WHOLE, request)
                except RpcError as exc:
                    if exc.code in NOT_RETRIED:
                        raise RequestRefused(str(exc), code=exc.code) from exc
                    if exc.code == "UNKNOWN_METHOD":
                        self._stream_only.add(key)  # an older agent: infer, as below
                    elif exc.code != "TOO_LARGE":
                        last = f"{exc.code}: {exc}"
                        self.balancer.failed(key, self._clock())
                        continue
                else:
                    self.balancer.succeeded(key)
                    self.answered[key] = self.answered.get(key, 0) + 1
                    yield Answer(frame, key, attempt + 1, None)
                    return
            stack = AsyncExitStack()
            try:
                items = await stack.enter_async_context(client.stream(INFER, request))
                first = await items.receive()
            except trio.EndOfChannel:
                await stack.aclose()
                last = "the agent ended the stream without answering"
            except RpcError as exc:
                await stack.aclose()
                if exc.code in NOT_RETRIED:
                    raise RequestRefused(str(exc), code=exc.code) from exc
                last = f"{exc.code}: {exc}"
            except BaseException:
                await stack.aclose()
                raise
            else:
                self.balancer.succeeded(key)
                self.answered[key] = self.answered.get(key, 0) + 1
                async with stack:
                    yield Answer(first, key, attempt + 1, items)
                return
            self.balancer.failed(key, self._clock())
        raise NoReplica(last if tried else "no replica of the job is connected")

    async def _reach_a_replica(self, route: Route) -> None:
        """Wait, at most :attr:`connect_wait_s`, until one of ``route``'s endpoints is
        connected, while the pool is connecting to one: a job is Active once its
        agents told their worker, and the proxy reaches them a moment later (through
        a relay, some round trips later), so a request sent right after ``jobs create
        --wait`` would be refused. With no endpoint being connected, no wait."""
        with trio.move_on_after(self.connect_wait_s):
            while not any(key in self.clients for key in route.endpoints) and any(
                    key in self._keepers for key in route.endpoints):
                await self._agent_ready.wait()

    async def _request(self, client: RpcClient, path: str, content_type: str, body: bytes,
                       request_id: str) -> InferRequest:
        if len(body) <= MAX_INLINE_BODY:
            # Built without validation (it costs as much as the rest of the send): the
            # path is one the app routes, the body's size is checked just above, and
            # the content type is the client's header, cut to the contract's bound.
            return InferRequest.model_construct(path=path, content_type=content_type[:256],
                                                body=body, upload_id=None,
                                                request_id=request_id)
        upload_id = secrets.token_hex(16)
        view = memoryview(body)
        for offset in range(0, len(body), MAX_INLINE_BODY):
            chunk = bytes(view[offset:offset + MAX_INLINE_BODY])
            await client.call(UPLOAD, UploadChunk(upload_id=upload_id, offset=offset,
                                                  total=len(body), data=chunk))
        return InferRequest.model_construct(path=path, content_type=content_type[:256],
                                            body=b"", upload_id=upload_id,
                                            request_id=request_id)
