"""RPC server: answers requests arriving on one mux channel.

Theory of operation
-------------------
One reader task takes messages off the channel and never waits for a handler.
Each REQUEST or STREAM_REQUEST becomes one task in a nursery the server owns,
inside its own cancel scope, kept in a table by request id; CANCEL cancels that
scope, STREAM_CREDIT adds to the stream's item credit. The table is bounded by
``max_concurrent_calls``: a request beyond it is answered ``BUSY`` at once. We
answer rather than stop reading because a stalled reader would also stall the
CANCEL and STREAM_CREDIT messages that let running calls finish.

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
from p2p.rpc._sending import send_bytes

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
    connection: str


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


class _Call:
    __slots__ = ("credit", "lot", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.credit = 0
        self.lot: trio.lowlevel.ParkingLot | None = None


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
    ) -> None:
        self._channel = channel
        self._router = router
        self.config = config or RpcConfig()
        self.name = name
        self._calls: dict[int, _Call] = {}
        self._nursery: trio.Nursery | None = None
        self._calls_started = 0
        self._calls_failed = 0
        self._busy = 0
        self._bad = 0

    def statistics(self) -> ServerStatistics:
        """Return a snapshot of the server's counters."""
        return ServerStatistics(
            calls_running=len(self._calls),
            calls_started=self._calls_started,
            calls_failed=self._calls_failed,
            busy_replies=self._busy,
            bad_messages=self._bad,
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
        channel = self._channel
        # Drain what is already buffered without a scheduling round per message
        # (mux channels offer receive_nowait), yielding at least every 64.
        receive_nowait = getattr(channel, "receive_nowait", None)
        burst = 0
        while True:
            try:
                data = None
                if receive_nowait is not None and burst < 16:
                    try:
                        data = receive_nowait()
                        burst += 1
                    except trio.WouldBlock:
                        pass
                if data is None:
                    burst = 0
                    data = await channel.receive()
            except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                logger.debug("rpc.server.channel_ended server=%s reason=%r", self.name, exc)
                return
            try:
                msg = decode_message(data)
            except RpcProtocolError as exc:
                self._bad += 1
                logger.debug("rpc.server.bad_message server=%s code=%s", self.name, exc.code)
                continue
            t = type(msg)
            if t is Request or t is StreamRequest:
                await self._start(msg)  # type: ignore[arg-type]
            elif t is Cancel:
                call = self._calls.get(msg.id)
                if call is not None:
                    call.scope.cancel()
            elif t is StreamCredit:
                call = self._calls.get(msg.id)
                if call is not None:
                    call.credit += msg.credit  # type: ignore[union-attr]
                    if call.lot is not None:
                        call.lot.unpark_all()
            else:  # a reply type sent to the server
                self._bad += 1

    async def _start(self, msg: Request | StreamRequest) -> None:
        rid = msg.id
        if rid in self._calls:
            self._bad += 1  # a duplicate id would make replies ambiguous; drop it
            return
        if len(self._calls) >= self.config.max_concurrent_calls:
            self._busy += 1
            await self._send(Error(rid, "BUSY", "too many concurrent calls; retry later"))
            return
        route = self._router.get(msg.method)
        is_stream = type(msg) is StreamRequest
        if route is None or isinstance(route[0], StreamMethod) != is_stream:
            kind = "stream method" if is_stream else "method"
            await self._send(Error(rid, "UNKNOWN_METHOD", f"unknown {kind} {msg.method!r}"))
            return
        method, handler = route
        try:
            params = method.params.model_validate(msg.params)
        except pydantic.ValidationError as exc:
            err = _invalid_params(exc)
            await self._send(Error(rid, err.code, err.message, err.data))
            return
        call = _Call()
        self._calls[rid] = call
        self._calls_started += 1
        ctx = CallContext(rid, method.name, self.name)
        assert self._nursery is not None
        if is_stream:
            call.credit = msg.credit  # type: ignore[union-attr]
            call.lot = trio.lowlevel.ParkingLot()
            self._nursery.start_soon(self._run_stream, call, method, handler, params, ctx)
        else:
            self._nursery.start_soon(self._run_unary, call, method, handler, params, ctx)

    async def _send(self, msg: Any) -> None:
        try:
            await send_bytes(self._channel, encode_message(msg))
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

    async def _run_unary(
        self, call: _Call, method: Method, handler: UnaryHandler, params: Any, ctx: CallContext
    ) -> None:
        rid = ctx.request_id
        reply: Any = None
        try:
            with call.scope:
                try:
                    result = await handler(params, ctx)
                    reply = Response(rid, _dump(method.result, result))
                except Exception as exc:
                    reply = self._error_reply(rid, exc, ctx)
        finally:
            del self._calls[rid]
        if reply is not None:  # None: cancelled by the client, which no longer waits
            await self._send(reply)

    async def _run_stream(
        self,
        call: _Call,
        method: StreamMethod,
        handler: StreamHandler,
        params: Any,
        ctx: CallContext,
    ) -> None:
        rid = ctx.request_id
        item_cls = method.item
        reply: Any = None
        lot = call.lot
        assert lot is not None
        try:
            with call.scope:
                try:
                    async with aclosing(handler(params, ctx)) as items:  # type: ignore[type-var]
                        async for item in items:
                            payload = _dump(item_cls, item)
                            while call.credit <= 0:
                                await lot.park()
                            call.credit -= 1
                            await self._send(StreamItem(rid, payload))
                    reply = StreamEnd(rid)
                except Exception as exc:
                    reply = self._error_reply(rid, exc, ctx)
        finally:
            del self._calls[rid]
        if reply is not None:
            await self._send(reply)


async def serve_rpc(
    channel: trio.abc.Channel[bytes],
    router: Router,
    *,
    config: RpcConfig | None = None,
    name: str = "rpc-server",
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``router`` on ``channel`` until the channel ends (see :class:`RpcServer`)."""
    await RpcServer(channel, router, config=config, name=name).run(task_status=task_status)
