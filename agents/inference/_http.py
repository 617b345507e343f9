"""A small HTTP/1.1 client for one server on loopback: keep-alive connections in a pool.

The agent sends every proxy request to its model server, so this client is on
the hot path of every inference request. A general client (httpx) spends
about as much time deciding what to do as the model server spends answering
a one-token request; this one knows its server (one origin, no proxies, no
redirects, no cookies, no TLS) and leaves HTTP's framing to ``h11``, the
sans-IO protocol machine hypercorn itself uses.

A connection goes back to the pool only after its response was read to the
end; one whose response was abandoned (the caller stopped reading, an error)
is closed, since its stream position is unknown. A request that fails on a
pooled connection before any response byte arrived, because the server had
closed that idle connection, is retried once on a fresh connection: the
server never saw it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import h11
import trio

__all__ = ["HttpError", "HttpPool", "Response"]

_READ_BYTES = 65536


class HttpError(Exception):
    """The request could not be completed.

    ``sent`` is False when the server cannot have seen the request (the
    connection could not be made), True when it may have.
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _Connection:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=64 << 10)
        self.reused = False

    async def next_event(self, timeout_s: float) -> h11.Event:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            with trio.move_on_after(timeout_s) as scope:
                data = await self.stream.receive_some(_READ_BYTES)
            if scope.cancelled_caught:
                raise HttpError(f"no answer for {timeout_s:g} s", sent=True)
            self.h11.receive_data(data)


@dataclass
class Response:
    """The status and headers; the body is read with :meth:`body` or :meth:`iter_body`."""

    status: int
    headers: dict[str, str]
    _connection: _Connection
    _timeout_s: float
    _finished: bool = False

    async def iter_body(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        while True:
            try:
                event = await self._connection.next_event(self._timeout_s)
            except (h11.RemoteProtocolError, OSError, trio.BrokenResourceError) as exc:
                raise HttpError(f"the response broke off: {exc!r}", sent=True) from None
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._finished = True
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise HttpError("the server closed the connection mid-response", sent=True)

    async def body(self, limit: int) -> bytes:
        """The whole body; :class:`HttpError` if it exceeds ``limit`` bytes."""
        parts, size = [], 0
        async for part in self.iter_body():
            size += len(part)
            if size > limit:
                raise HttpError(f"the response exceeds {limit} bytes", sent=True)
            parts.append(part)
        return b"".join(parts)


class HttpPool:
    """Keep-alive connections to ``host:port``.

    Args:
        host, port: the server (loopback).
        max_connections: requests in flight at once; more wait for a connection.
        connect_timeout_s: bound on opening a connection.
        read_timeout_s: longest silence while waiting for the response.
    """

    def __init__(self, host: str, port: int, *, max_connections: int = 256,
                 connect_timeout_s: float = 5.0, read_timeout_s: float = 600.0) -> None:
        self.host, self.port = host, port
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._authority = f"{host}:{port}".encode()
        self.opened = 0

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.stream.aclose()

    async def _connect(self) -> _Connection:
        try:
            with trio.fail_after(self.connect_timeout_s):
                stream = await trio.open_tcp_stream(self.host, self.port)
        except (OSError, trio.TooSlowError) as exc:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc}",
                            sent=False) from None
        self.opened += 1
        return _Connection(stream)

    @asynccontextmanager
    async def request(self, method: str, path: str, headers: Sequence[tuple[str, str]],
                      body: bytes) -> AsyncIterator[Response]:
        """Send one request; yield its :class:`Response` (read its body inside the block)."""
        async with self._slots:
            connection = self._idle.pop() if self._idle else await self._connect()
            response: Response | None = None
            try:
                try:
                    response = await self._send(connection, method, path, headers, body)
                except HttpError as exc:
                    if not (connection.reused and exc.sent and exc.args[0] == _STALE):
                        raise
                    await connection.stream.aclose()  # the server closed it while idle
                    connection = await self._connect()
                    response = await self._send(connection, method, path, headers, body)
                yield response
            finally:
                if (response is not None and response._finished
                        and connection.h11.our_state is h11.DONE
                        and connection.h11.their_state is h11.DONE):
                    connection.h11.start_next_cycle()
                    connection.reused = True
                    self._idle.append(connection)
                else:
                    with trio.CancelScope(shield=True):
                        await connection.stream.aclose()

    async def _send(self, connection: _Connection, method: str, path: str,
                    headers: Sequence[tuple[str, str]], body: bytes) -> Response:
        h = connection.h11
        request = h11.Request(method=method, target=path, headers=[
            ("host", self._authority), ("content-length", str(len(body))), *headers])
        try:
            await connection.stream.send_all(h.send(request) + h.send(h11.Data(data=body))
                                             + h.send(h11.EndOfMessage()))
            event = await connection.next_event(self.read_timeout_s)
        except (OSError, trio.BrokenResourceError, h11.RemoteProtocolError) as exc:
            # On a reused connection, a failure before the response's head is
            # the server having closed it while idle (a restarted server too).
            raise HttpError(_STALE if connection.reused else f"the request failed: {exc!r}",
                            sent=True) from None
        if isinstance(event, h11.ConnectionClosed):
            raise HttpError(_STALE if connection.reused else "the server closed the connection",
                            sent=True)
        if not isinstance(event, h11.Response):
            raise HttpError(f"unexpected {type(event).__name__} from the server", sent=True)
        return Response(status=event.status_code,
                        headers={k.decode("latin-1"): v.decode("latin-1")
                                 for k, v in event.headers},
                        _connection=connection, _timeout_s=self.read_timeout_s)


#: The message of a failure on a reused idle connection that the server had
#: closed: retried once on a new connection.
_STALE = "the idle connection was closed by the server"
