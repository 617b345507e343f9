"""RPC server: answers requests arriving on one mux channel.

Theory of operation
-------------------
Messages are handled by :meth:`RpcServer._on_message`, synchronously and never
waiting for a handler. On a mux channel it runs in the mux's reader task as each
message is parsed (push delivery: no hop through a read-loop task); on other
channels :meth:`RpcServer.run` pulls messages and calls it. Each call is kept
in a table by request id. A REQUEST is handed to an idle worker task (a new one
is started only when all are busy, so there are at most as many as the table
bound); a worker runs calls one after another inside one cancel scope, and CANCEL
cancels that scope while the call's handler runs in it (the worker then opens a
fresh scope). Entering a cancel scope and spawning a task cost about as much as
the rest of a small call, hence the reuse. A STREAM_REQUEST gets its own task
and scope; STREAM_CREDIT adds to the stream's item credit. The table is bounded by
``max_concurrent_calls``: a request beyond it is answered ``BUSY`` at once. We
answer rather than stop reading because a stalled reader would also stall the
CANCEL and STREAM_CREDIT messages that let running calls finish.

Immediate answers (``BUSY``, ``UNKNOWN_METHOD``, ``INVALID_PARAMS``) are queued
on the channel without waiting. If the channel cannot take one now (the client
is not reading its replies, so credit or buffer room ran out), a task sends it;
at most ``max_concurrent_calls`` such tasks run, and beyond that the answer is
dropped and counted (``replies_dropped``): that client already has that many
answers it is not reading.

Errors become ERROR replies and never end the connection: unknown method ->
``UNKNOWN_METHOD``; params failing validation -> ``INVALID_PARAMS`` naming the
fields; :class:`RpcError` from a handler -> its code; any other exception ->
``INTERNAL`` (traceback logged, not sent); a result or item failing validation ->
``INTERNAL``. Undecodable messages are dropped and counted.

When the channel ends (EOF, closed or broken) running handlers are cancelled
and :meth:`RpcServer.run` returns.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import pydantic
import trio

from p2p.rpc._config import RpcConfig
from p2p.rpc._errors import RpcError, RpcProtocolError, RpcUsageError
from p2p.rpc._messages import (
    Cancel,
    Error,
    Request,
    Response,
    StreamCredit,
    StreamEnd,
    StreamItem,
    StreamRequest,
    decode_message,
    encode_message,
)
from p2p.rpc._method import Method, StreamMethod
from p2p.rpc._sending import deliver_messages, send_bytes, send_bytes_nowait

__all__ = ["CallContext", "Router", "RpcServer", "ServerStatistics", "serve_rpc"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a handler knows about the call it serves."""

    #: The client's request id.
    request_id: int
    #: The method's wire name.
    method: str
    #: The server's ``name`` (for logs).
    name: str
    #: The caller's public key, proven by the secret stream's handshake (None
    #: when the channel is not over one, e.g. an in-memory test channel).
    remote_public_key: bytes | None = None
    #: The peer connection the call came over (a :class:`p2p.connection.Connection`).
    connection: Any = None


UnaryHandler = Callable[[Any, CallContext], Awaitable[Any]]
StreamHandler = Callable[[Any, CallContext], AsyncIterator[Any]]


class Router:
    """Maps method names to (declaration, handler); shared by any number of servers."""

    def __init__(self) -> None:
        self._routes: dict[str, tuple[Method | StreamMethod, Callable[..., Any]]] = {}

    def add(self, method: Method | StreamMethod, handler: Callable[..., Any]) -> None:
        """Register ``handler`` for ``method``.

        For a :class:`Method`, ``async def handler(params, ctx) -> Result``; for a
        :class:`StreamMethod`, an async generator ``async def handler(params, ctx)``
        that yields items.

        Raises:
            RpcUsageError: ``DUPLICATE_METHOD`` if the name is taken.
        """
        if method.name in self._routes:
            raise RpcUsageError("DUPLICATE_METHOD", f"method {method.name!r} already added")
        self._routes[method.name] = (method, handler)

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


class _Call:
    """One running call, in the table by request id."""

    __slots__ = ("cancelled", "credit", "ctx", "handler", "lot", "method", "params", "scope")

    def __init__(
        self, method: Method | StreamMethod, handler: Callable[..., Any], params: Any,
        ctx: CallContext,
    ) -> None:
        self.method = method
        self.handler = handler
        self.params = params
        self.ctx = ctx
        #: The scope CANCEL cancels, while the handler runs in it.
        self.scope: trio.CancelScope | None = None
        #: CANCEL arrived (maybe before a worker picked the call up).
        self.cancelled = False
        self.credit = 0
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
        value = model_cls.model_validate(value)
    return value.model_dump(mode="python")


class RpcServer:
    """Serves ``router``'s methods on one channel.

    Args:
        channel: any :class:`trio.abc.Channel` of bytes (a mux channel).
        router: the methods.
        config: limits.
        name: names this server in logs and in :class:`CallContext`.

    Run it with ``await server.run()`` or ``nursery.start_soon(server.run)``.
    """

    def __init__(
        self,
        channel: trio.abc.Channel[bytes],
        router: Router,
        *,
        config: RpcConfig | None = None,
        name: str = "rpc-server",
        connection: Any = None,
        remote_public_key: bytes | None = None,
    ) -> None:
        self._channel = channel
        self.connection = connection
        if remote_public_key is None and connection is not None:
            remote_public_key = connection.remote_public_key
        self.remote_public_key = remote_public_key
        self._router = router
        self.config = config or RpcConfig()
        self.name = name
        self._calls: dict[int, _Call] = {}
        self._nursery: trio.Nursery | None = None
        self._calls_started = 0
        self._calls_failed = 0
        self._busy = 0
        self._bad = 0
        self._reply_tasks = 0
        #: Idle unary workers, parked in _next_call (bounded: see _start).
        self._idle: list[_Worker] = []
        self._replies_dropped = 0

    def statistics(self) -> ServerStatistics:
        """Return a snapshot of the server's counters."""
        return ServerStatistics(
            calls_running=len(self._calls),
            calls_started=self._calls_started,
            calls_failed=self._calls_failed,
            busy_replies=self._busy,
            bad_messages=self._bad,
            replies_dropped=self._replies_dropped,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until the channel ends; then cancel running handlers and return.

        The channel is closed on return.
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._read_loop()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self._channel)

    async def _read_loop(self) -> None:
        await deliver_messages(self._channel, self._on_message, logger=logger, name=self.name)

    def _on_message(self, data: bytes) -> None:
        """Handle one message (synchronous; may run in the mux reader task)."""
        if self._nursery is None:
            return  # the server has stopped
        try:
            msg = decode_message(data)
        except RpcProtocolError as exc:
            self._bad += 1
            logger.debug("rpc.server.bad_message server=%s code=%s", self.name, exc.code)
            return
        t = type(msg)
        if t is Request or t is StreamRequest:
            self._start(msg)  # type: ignore[arg-type]
        elif t is Cancel:
            call = self._calls.get(msg.id)
            if call is not None:
                call.cancelled = True
                if call.scope is not None:
                    call.scope.cancel()
        elif t is StreamCredit:
            call = self._calls.get(msg.id)
            if call is not None:
                call.credit += msg.credit  # type: ignore[union-attr]
                if call.lot is not None:
                    call.lot.unpark_all()
        else:  # a reply type sent to the server
            self._bad += 1

    def _start(self, msg: Request | StreamRequest) -> None:
        rid = msg.id
        if rid in self._calls:
            self._bad += 1  # a duplicate id would make replies ambiguous; drop it
            return
        if len(self._calls) >= self.config.max_concurrent_calls:
            self._busy += 1
            self._reply_now(Error(rid, "BUSY", "too many concurrent calls; retry later"))
            return
        route = self._router.get(msg.method)
        is_stream = type(msg) is StreamRequest
        if route is None or isinstance(route[0], StreamMethod) != is_stream:
            kind = "stream method" if is_stream else "method"
            self._reply_now(Error(rid, "UNKNOWN_METHOD", f"unknown {kind} {msg.method!r}"))
            return
        method, handler = route
        try:
            params = method.params.model_validate(msg.params)
        except pydantic.ValidationError as exc:
            err = _invalid_params(exc)
            self._reply_now(Error(rid, err.code, err.message, err.data))
            return
        call = _Call(method, handler, params, CallContext(rid, method.name, self.name,
                                                          self.remote_public_key, self.connection))
        self._calls[rid] = call
        self._calls_started += 1
        assert self._nursery is not None
        if is_stream:
            call.credit = msg.credit  # type: ignore[union-attr]
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

    def _reply_now(self, msg: Error) -> None:
        data = encode_message(msg)
        try:
            if send_bytes_nowait(self._channel, data):
                return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the channel is gone; the read loop sees it end
        # The channel cannot take it now: bounded by max_concurrent_calls (see
        # the module docstring); at the bound the answer is dropped.
        if self._reply_tasks >= self.config.max_concurrent_calls or self._nursery is None:
            self._replies_dropped += 1
            return
        self._reply_tasks += 1
        self._nursery.start_soon(self._send_reply_task, data)

    async def _send_reply_task(self, data: bytes) -> None:
        try:
            await self._send_data(data, more=True)  # see _run_stream on more=True
        finally:
            self._reply_tasks -= 1

    async def _send(self, msg: Any, *, checkpoint: bool = True, more: bool = False) -> None:
        await self._send_data(encode_message(msg), checkpoint=checkpoint, more=more)

    async def _send_data(
        self, data: bytes, *, checkpoint: bool = True, more: bool = False
    ) -> None:
        try:
            await send_bytes(self._channel, data, checkpoint=checkpoint, more=more)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            # The channel is gone: nobody can hear any other reply either.
            logger.debug("rpc.server.send_failed server=%s reason=%r", self.name, exc)
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()

    def _error_reply(self, rid: int, exc: Exception, ctx: CallContext) -> Error:
        self._calls_failed += 1
        if isinstance(exc, RpcError):
            return Error(rid, exc.code, exc.message, exc.data)
        logger.error(
            "rpc.server.handler_failed server=%s method=%s id=%d",
            self.name, ctx.method, rid, exc_info=exc,
        )
        return Error(rid, "INTERNAL", f"internal error in {ctx.method!r}")

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
                    reply = await self._run_unary(call, scope)
                    if scope.cancel_called:
                        break  # the client cancelled: it waits for no reply
                    if reply is not None:
                        # No checkpoint needed: parking for the next call is
                        # one. With other calls running their replies likely
                        # follow: leave ours to the mux writer's batch.
                        await self._send(reply, checkpoint=False, more=bool(self._calls))
                    call = await self._next_call(worker)
            call = await self._next_call(worker)

    async def _run_unary(self, call: _Call, scope: trio.CancelScope) -> Any:
        ctx = call.ctx
        rid = ctx.request_id
        try:
            if call.cancelled:
                return None
            call.scope = scope
            try:
                result = await call.handler(call.params, ctx)
                return Response(rid, _dump(call.method.result, result))  # type: ignore[union-attr]
            except Exception as exc:
                return self._error_reply(rid, exc, ctx)
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
        item_cls = call.method.item  # type: ignore[union-attr]
        reply: Any = None
        lot = call.lot
        assert lot is not None
        scope = call.scope = trio.CancelScope()
        if call.cancelled:
            scope.cancel()
        try:
            with scope:
                try:
                    async with aclosing(call.handler(call.params, ctx)) as items:
                        async for item in items:
                            payload = _dump(item_cls, item)
                            while call.credit <= 0:
                                await lot.park()
                            call.credit -= 1
                            # more=True: queued for the mux writer, never
                            # written from here, so a CANCEL arriving now cannot
                            # cut a write short (that would end the mux).
                            await self._send(StreamItem(rid, payload), more=True)
                    reply = StreamEnd(rid)
                except Exception as exc:
                    reply = self._error_reply(rid, exc, ctx)
        finally:
            call.scope = None
            del self._calls[rid]
        if reply is not None:
            await self._send(reply, more=True)


async def serve_rpc(
    channel: trio.abc.Channel[bytes],
    router: Router,
    *,
    config: RpcConfig | None = None,
    name: str = "rpc-server",
    connection: Any = None,
    remote_public_key: bytes | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``router`` on ``channel`` until the channel ends (see :class:`RpcServer`).

    ``connection`` (or just ``remote_public_key``) is handed to every handler
    in its :class:`CallContext`, so handlers can authorise the caller by key.
    """
    server = RpcServer(channel, router, config=config, name=name, connection=connection,
                       remote_public_key=remote_public_key)
    await server.run(task_status=task_status)
