"""RPC server: the trio driver of :class:`~p2p.rpc._core.RpcServerCore`.

Theory of operation
-------------------
The core owns the table of admitted calls, cancellation and stream credit; this
driver routes requests to handlers and runs them. Messages are handled by
:meth:`RpcServer._on_message`, synchronously and never waiting for a handler. On
a mux channel it runs in the mux's reader task as each message is parsed (push
delivery: no hop through a read-loop task); on other channels
:meth:`RpcServer.run` pulls messages and calls it.

A REQUEST the core admits is routed and its params validated right there; it is
then handed to an idle worker task (a new one is started only when all are
busy, so there are at most ``max_concurrent_calls``); a worker runs calls one
after another inside one cancel scope, and CANCEL cancels that scope while the
call's handler runs in it (the worker then opens a fresh scope). Entering a
cancel scope and spawning a task cost about as much as the rest of a small
call, hence the reuse. A STREAM_REQUEST gets its own task and scope; its items
wait for the core's item credit. A worker sends its call's reply from its own
task (the mux writes it at once when nothing else is being written).

A router may have a guard (``Router(guard=...)``, e.g.
:class:`~p2p.rpc.AccessTable`'s ``check``): it sees every request's method and
the caller's key before the method is looked up, and its ``RpcError`` is the
answer (``FORBIDDEN``); nothing else is done with a refused request.

Immediate answers (``BUSY`` from the core; the guard's refusals,
``UNKNOWN_METHOD`` and ``INVALID_PARAMS`` from routing) are handed to the channel without waiting
(:class:`~p2p.rpc._sending.Outbox`). If the channel cannot take one now (the
client is not reading its replies) it waits for the outbox task; at most
``max_concurrent_calls`` answers wait, and beyond that the answer is dropped and
counted (``replies_dropped``): that client already has that many answers it is
not reading.

Errors become ERROR replies and never end the connection: unknown method ->
``UNKNOWN_METHOD``; params failing validation -> ``INVALID_PARAMS`` naming the
fields; :class:`RpcError` from a handler -> its code; any other exception ->
``INTERNAL`` (traceback logged, not sent); a result or item failing validation ->
``INTERNAL``. Undecodable messages are dropped and counted.

Each call's :class:`CallContext` carries the caller's Noise-proven public key
and its connection, so a handler can authorise by key; a router therefore
belongs to a service, not to a connection.

When the channel ends (EOF, closed or broken) running handlers are cancelled
and :meth:`RpcServer.run` returns.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic
import trio

from p2p.mux import Channel as MuxChannel
from p2p.rpc._config import RpcConfig
from p2p.rpc._core import RpcServerCore
from p2p.rpc._errors import RpcError, RpcUsageError
from p2p.rpc._messages import Cancel, Request, StreamCredit, StreamRequest
from p2p.rpc._method import Method, StreamMethod
from p2p.rpc._models import dump, validate
from p2p.rpc._sending import Outbox, deliver_messages, send_bytes

__all__ = [
    "CallContext",
    "PeerConnection",
    "Router",
    "RpcServer",
    "ServerStatistics",
    "serve_rpc",
]

logger = logging.getLogger(__name__)

_CHANNEL_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


class PeerConnection(Protocol):
    """What the RPC layer needs of the connection a channel belongs to."""

    @property
    def remote_public_key(self) -> bytes:
        """The peer's public key, proven by the Noise handshake."""
        ...


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a handler knows about the call it serves."""

    #: The client's request id.
    request_id: int
    #: The method's wire name.
    method: str
    #: The server's ``name`` (for logs).
    name: str
    #: The caller's public key, proven by the Noise handshake of its connection
    #: (None when the server was given neither a key nor a connection, e.g. over
    #: an in-memory channel in tests). Authorise callers by it.
    remote_public_key: bytes | None
    #: The peer connection the call's channel belongs to (opaque to RPC), or None.
    connection: Any


UnaryHandler = Callable[[Any, CallContext], Awaitable[Any]]
StreamHandler = Callable[[Any, CallContext], AsyncIterator[Any]]


class Router:
    """Maps method names to (declaration, handler); shared by any number of servers.

    Args:
        guard: ``guard(method, remote_public_key)``, run on every request
            before anything else (before the method is looked up and its
            params read): it returns to admit the call, or raises
            :class:`RpcError` (e.g. ``FORBIDDEN``), which is the answer. A
            guard that raises anything else refuses too (``INTERNAL``,
            logged): it fails closed. :class:`~p2p.rpc.AccessTable`'s
            ``check`` is one.
    """

    def __init__(self, *, guard: Callable[[str, bytes | None], None] | None = None) -> None:
        self._routes: dict[str, tuple[Method | StreamMethod, Callable[..., Any]]] = {}
        #: Unary methods whose handler is a plain function run in the reader.
        self._inline: frozenset[str] = frozenset()
        self.guard = guard

    @property
    def names(self) -> frozenset[str]:
        """Every method's wire name."""
        return frozenset(self._routes)

    def add(self, method: Method | StreamMethod, handler: Callable[..., Any], *,
            inline: bool = False) -> None:
        """Register ``handler`` for ``method``.

        For a :class:`Method`, ``async def handler(params, ctx) -> Result``; for a
        :class:`StreamMethod`, an async generator ``async def handler(params, ctx)``
        that yields items.

        ``inline=True`` declares a unary handler that never waits: a plain
        ``def handler(params, ctx) -> Result``, run in the connection's reader
        as the request is parsed, its answer queued at once, with no task of
        its own (a hand-off to a worker costs a scheduler pass per call). It
        must be quick (the reader parses nothing else meanwhile) and cannot be
        cancelled. Such a call still runs in a worker while earlier answers
        wait for the client to read them, so the reader never queues without
        bound.

        Raises:
            RpcUsageError: ``DUPLICATE_METHOD`` if the name is taken;
                ``BAD_HANDLER`` if ``inline`` is given for a stream method or a
                coroutine function.
        """
        if method.name in self._routes:
            raise RpcUsageError("DUPLICATE_METHOD", f"method {method.name!r} already added")
        if inline and (isinstance(method, StreamMethod) or inspect.iscoroutinefunction(handler)):
            raise RpcUsageError(
                "BAD_HANDLER",
                f"inline handler for {method.name!r} must be a plain function of a unary method",
            )
        self._routes[method.name] = (method, handler)
        if inline:
            self._inline = self._inline | {method.name}

    def is_inline(self, name: str) -> bool:
        """Whether ``name``'s handler was added with ``inline=True``."""
        return name in self._inline

    def get(self, name: str) -> tuple[Method | StreamMethod, Callable[..., Any]] | None:
        """Return the route for ``name``, or None."""
        return self._routes.get(name)


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """A snapshot of a server's counters."""

    calls_running: int
    calls_started: int
    calls_failed: int
    busy_replies: int
    bad_messages: int
    #: Immediate error answers dropped because the client was not reading.
    replies_dropped: int = 0
    #: Requests the router's guard refused.
    calls_refused: int = 0


class _Call:
    """One routed call: what its worker or stream task needs."""

    __slots__ = ("ctx", "handler", "inline", "lot", "method", "params", "scope")

    def __init__(
        self, method: Method | StreamMethod, handler: Callable[..., Any], params: Any,
        ctx: CallContext, inline: bool = False,
    ) -> None:
        self.method = method
        self.handler = handler
        #: A plain function (Router.add's ``inline``) run by a worker this time.
        self.inline = inline
        self.params = params
        self.ctx = ctx
        #: The scope CANCEL cancels, while the handler runs in it.
        self.scope: trio.CancelScope | None = None
        #: Streams: where the task waits for item credit.
        self.lot: trio.lowlevel.ParkingLot | None = None


class _Worker:
    """An idle unary worker task and the call handed to it."""

    __slots__ = ("call", "task")

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.call: _Call | None = None


def _invalid_params(exc: pydantic.ValidationError) -> RpcError:
    details = [
        {"field": ".".join(str(p) for p in err["loc"]) or "(params)", "error": err["msg"]}
        for err in exc.errors(include_url=False, include_input=False)
    ]
    fields = ", ".join(d["field"] for d in details)
    return RpcError("INVALID_PARAMS", f"invalid params: {fields}", data=details)


def _dump(model_cls: type[pydantic.BaseModel], value: Any) -> dict[str, Any]:
    if type(value) is not model_cls:
        value = validate(model_cls, value)
    return dump(value)


class RpcServer:
    """Serves ``router``'s methods on one channel.

    Args:
        channel: any :class:`trio.abc.Channel` of bytes (a mux channel).
        router: the methods.
        connection: the peer connection ``channel`` belongs to; handed to
            handlers as ``ctx.connection`` (opaque here).
        remote_public_key: the caller's Noise-proven key for ``ctx``; taken
            from ``connection.remote_public_key`` when not given.
        config: limits.
        name: names this server in logs and in :class:`CallContext`.

    Run it with ``await server.run()`` or ``nursery.start_soon(server.run)``.
    """

    def __init__(
        self,
        channel: trio.abc.Channel[bytes],
        router: Router,
        *,
        connection: PeerConnection | Any | None = None,
        remote_public_key: bytes | None = None,
        config: RpcConfig | None = None,
        name: str = "rpc-server",
    ) -> None:
        self._channel = channel
        #: ``send(data, *, checkpoint, more)``: a mux channel's own, else send_bytes.
        self._send = (
            channel.send if type(channel) is MuxChannel else functools.partial(send_bytes, channel)
        )
        self._router = router
        self.config = config or RpcConfig()
        self.name = name
        self.connection = connection
        if remote_public_key is None and connection is not None:
            remote_public_key = connection.remote_public_key
        self.remote_public_key = remote_public_key
        self._core = RpcServerCore(self.config)
        #: Routed calls by request id (within the core's table).
        self._calls: dict[int, _Call] = {}
        self._nursery: trio.Nursery | None = None
        self._calls_failed = 0
        self._calls_refused = 0
        #: Idle unary workers, parked in _next_call (bounded: see _start).
        self._idle: list[_Worker] = []
        self._outbox = Outbox(channel, limit=self.config.max_concurrent_calls)

    def statistics(self) -> ServerStatistics:
        """Return a snapshot of the server's counters."""
        core = self._core
        return ServerStatistics(
            calls_running=core.calls_running,
            calls_started=core.calls_started,
            calls_failed=self._calls_failed,
            busy_replies=core.busy_replies,
            bad_messages=core.bad_messages,
            replies_dropped=self._outbox.dropped,
            calls_refused=self._calls_refused,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until the channel ends; then cancel running handlers and return.

        The channel is closed on return.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._outbox.run)
                task_status.started()
                await self._read_loop()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self._outbox.close()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._channel)

    async def _read_loop(self) -> None:
        await deliver_messages(self._channel, self._on_message, logger=logger, name=self.name)

    def _on_message(self, data: bytes) -> None:
        """Handle one message (synchronous; may run in the mux reader task)."""
        if self._nursery is None:
            return  # the server has stopped
        core = self._core
        ev = core.receive_message(data)
        t = type(ev)
        if t is Request or t is StreamRequest:
            if self._start(ev):  # type: ignore[arg-type]
                return  # handed to a task: nothing queued
        elif t is Cancel:
            call = self._calls.get(ev.id)  # type: ignore[union-attr]
            if call is not None and call.scope is not None:
                call.scope.cancel()
        elif t is StreamCredit:
            call = self._calls.get(ev.id)  # type: ignore[union-attr]
            if call is not None and call.lot is not None:
                call.lot.unpark_all()
        # Inline answers, and BUSY, UNKNOWN_METHOD, INVALID_PARAMS: out at once;
        # the errors are dropped at the bound (an inline call only runs while
        # nothing waits, so its answer is never past it).
        self._outbox.put(core.messages_to_send(), droppable=True)

    def _start(self, msg: Request | StreamRequest) -> bool:
        """Route an admitted call to a task; False if it was answered at once."""
        rid = msg.id
        core = self._core
        guard = self._router.guard
        if guard is not None:
            try:
                guard(msg.method, self.remote_public_key)
            except RpcError as exc:
                self._calls_refused += 1
                core.send_error(rid, exc.code, exc.message, exc.data)
                return False
            except Exception:  # a bug in the guard: refuse, never admit
                logger.exception("rpc.guard_failed server=%s method=%.64r", self.name,
                                 msg.method)
                self._calls_refused += 1
                core.send_error(rid, "INTERNAL", "the server could not authorise this call")
                return False
        route = self._router.get(msg.method)
        is_stream = type(msg) is StreamRequest
        if route is None or isinstance(route[0], StreamMethod) != is_stream:
            kind = "stream method" if is_stream else "method"
            core.send_error(rid, "UNKNOWN_METHOD", f"unknown {kind} {msg.method!r}")
            return False
        method, handler = route
        try:
            params = validate(method.params, msg.params)
        except pydantic.ValidationError as exc:
            err = _invalid_params(exc)
            core.send_error(rid, err.code, err.message, err.data)
            return False
        ctx = CallContext(rid, method.name, self.name, self.remote_public_key, self.connection)
        inline = not is_stream and self._router.is_inline(msg.method)
        if inline and not self._outbox:
            self._run_inline(rid, method, handler, params, ctx)  # type: ignore[arg-type]
            return False
        call = _Call(method, handler, params, ctx, inline)
        self._calls[rid] = call
        assert self._nursery is not None
        if is_stream:
            call.lot = trio.lowlevel.ParkingLot()
            self._nursery.start_soon(self._run_stream, call)
        elif self._idle:
            worker = self._idle.pop()
            worker.call = call
            trio.lowlevel.reschedule(worker.task)
        else:
            # Bounded: a worker is only added when every worker is busy with a
            # call, so there are at most max_concurrent_calls of them.
            self._nursery.start_soon(self._worker, call)
        return True

    def _run_inline(self, rid: int, method: Method, handler: Callable[..., Any], params: Any,
                    ctx: CallContext) -> None:
        """Run a handler declared inline and queue its answer (see Router.add)."""
        try:
            result = handler(params, ctx)
            self._core.send_response(rid, _dump(method.result, result),
                                     max_bytes=self._max_message_bytes())
        except Exception as exc:
            self._error_reply(rid, exc, ctx)

    async def _send_out(self, *, checkpoint: bool = True, more: bool = False) -> None:
        """Send what the core queued for the calling task's call (maybe nothing)."""
        for data in self._core.messages_to_send():
            try:
                await self._send(data, checkpoint=checkpoint, more=more)
            except _CHANNEL_GONE as exc:
                self._channel_gone(exc)
                return

    def _channel_gone(self, exc: BaseException) -> None:
        # The channel is gone: nobody can hear any other reply either.
        logger.debug("rpc.server.send_failed server=%s reason=%r", self.name, exc)
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _max_message_bytes(self) -> int | None:
        """The largest message the channel takes now (None: no known limit)."""
        return getattr(self._channel, "max_message_bytes", None)

    def _error_reply(self, rid: int, exc: Exception, ctx: CallContext) -> None:
        self._calls_failed += 1
        if isinstance(exc, RpcError):
            self._core.send_error(rid, exc.code, exc.message, exc.data)
            return
        logger.error(
            "rpc.server.handler_failed server=%s method=%s id=%d",
            self.name, ctx.method, rid, exc_info=exc,
        )
        self._core.send_error(rid, "INTERNAL", f"internal error in {ctx.method!r}")

    async def _next_call(self, worker: _Worker) -> _Call:
        # Park as an idle worker until _start hands us a call.
        self._idle.append(worker)

        def abort(raise_cancel: object) -> trio.lowlevel.Abort:
            self._idle.remove(worker)
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        call = worker.call
        assert call is not None
        worker.call = None
        return call

    async def _worker(self, call: _Call) -> None:
        worker = _Worker(trio.lowlevel.current_task())
        # Runs unary calls one after another, all inside one cancel scope, so
        # entering and leaving a scope (and spawning a task) is not paid per
        # call. A CANCEL cancels the scope while its call's handler runs; the
        # worker then leaves it and opens a fresh one for the next call.
        while True:
            with trio.CancelScope() as scope:
                while True:
                    await self._run_unary(call, scope)
                    if scope.cancel_called:
                        break  # the client cancelled: it waits for no reply
                    # No checkpoint needed: parking for the next call is one.
                    # With other calls running their replies likely follow:
                    # leave ours to the mux writer's batch.
                    for data in self._core.messages_to_send():  # _send_out, inlined
                        try:
                            await self._send(data, checkpoint=False, more=bool(self._calls))
                        except _CHANNEL_GONE as exc:
                            self._channel_gone(exc)
                            break
                    call = await self._next_call(worker)
            call = await self._next_call(worker)

    async def _run_unary(self, call: _Call, scope: trio.CancelScope) -> None:
        ctx = call.ctx
        rid = ctx.request_id
        core = self._core
        try:
            if core.is_cancelled(rid):
                core.forget(rid)  # cancelled before it started: nothing to send
                return
            call.scope = scope
            try:
                if call.inline:
                    result = call.handler(call.params, ctx)
                else:
                    result = await call.handler(call.params, ctx)
                core.send_response(rid, _dump(call.method.result, result),  # type: ignore[union-attr]
                                   max_bytes=self._max_message_bytes())
            except Exception as exc:
                self._error_reply(rid, exc, ctx)
        except BaseException:
            core.forget(rid)  # cancelled (by the client or at shutdown): no answer
            raise
        finally:
            # From here on a CANCEL cannot reach the scope: sending the reply
            # is never cancelled by the client (a cancel part-way through a
            # write would end the whole mux).
            call.scope = None
            del self._calls[rid]

    async def _run_stream(self, call: _Call) -> None:
        # A stream is long-lived: its own task and cancel scope.
        ctx = call.ctx
        rid = ctx.request_id
        core = self._core
        item_cls = call.method.item  # type: ignore[union-attr]
        lot = call.lot
        assert lot is not None
        scope = call.scope = trio.CancelScope()
        if core.is_cancelled(rid):
            scope.cancel()
        try:
            with scope:
                try:
                    ended = False
                    async with aclosing(call.handler(call.params, ctx)) as items:
                        async for item in items:
                            # Our sends below only checkpoint shielded: let a
                            # CANCEL stop the stream here, once per item.
                            await trio.lowlevel.checkpoint_if_cancelled()
                            payload = _dump(item_cls, item)
                            while core.item_credit(rid) <= 0:
                                await lot.park()
                            if not core.send_item(rid, payload,
                                                  max_bytes=self._max_message_bytes()):
                                ended = True  # too large: the core ended the stream
                                break
                            # more=True: queued for the mux writer, never
                            # written from here, so a CANCEL arriving now cannot
                            # cut a write short (that would end the mux).
                            await self._send_out(more=True)
                    if not ended:
                        core.send_end(rid)
                except Exception as exc:
                    self._error_reply(rid, exc, ctx)
        finally:
            call.scope = None
            del self._calls[rid]
            core.forget(rid)
        await self._send_out(more=True)


async def serve_rpc(
    channel: trio.abc.Channel[bytes],
    router: Router,
    *,
    connection: PeerConnection | Any | None = None,
    remote_public_key: bytes | None = None,
    config: RpcConfig | None = None,
    name: str = "rpc-server",
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``router`` on ``channel`` until the channel ends (see :class:`RpcServer`)."""
    server = RpcServer(
        channel, router, connection=connection, remote_public_key=remote_public_key,
        config=config, name=name,
    )
    await server.run(task_status=task_status)
