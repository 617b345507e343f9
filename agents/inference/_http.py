"""A small HTTP/1.1 client for one server on loopback: keep-alive connections in a pool.

The agent sends every proxy request to its model server, so this client is on
the hot path of every inference request. A general client (httpx) spends
about as much time deciding what to do as the model server spends answering
a one-token request; this one knows its server (one origin, no proxies, no
redirects, no cookies, no TLS) and leaves HTTP's framing to ``httptools``
(llhttp, in C: a response's head and a chunked body parse in microseconds,
where ``h11`` spent a tenth of the agent's time per request). What one read
brings is handed out as one piece: SSE events that arrived together travel on
together, as one frame.

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
from dataclasses import dataclass, field

import httptools
import trio

__all__ = ["HttpError", "HttpPool", "Response"]

_READ_BYTES = 65536
#: Largest response head taken from the model server.
_MAX_HEAD_BYTES = 64 << 10


class HttpError(Exception):
    """The request could not be completed.

    ``sent`` is False when the server cannot have seen the request (the
    connection could not be made), True when it may have.
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _Connection:
    """One keep-alive connection and the response parser (llhttp) of its answers.

    The parser's callbacks fill the current answer's head, its body pieces not
    yet handed out, and whether it is complete; :meth:`read` feeds it.
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reused = False
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        #: Bytes of the body parsed and not yet handed out (joined when handed out,
        #: so what one read brought is one piece: SSE events that came together stay
        #: together).
        self.pieces: list[bytes] = []
        #: The answer ends when the server closes (neither a length nor chunks).
        self._until_close = False
        self._head_bytes = 0
        self.eof = False

    def start_cycle(self) -> None:
        self.status, self.headers = 0, {}
        self.head_done = self.complete = self.keep_alive = self._until_close = False
        self.pieces = []
        self._head_bytes = 0

    # -- parser callbacks --

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self._until_close = ("content-length" not in self.headers
                             and "transfer-encoding" not in self.headers
                             and self.status not in (204, 304))
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    async def read(self, timeout_s: float) -> None:
        """One read into the parser.

        Raises:
            HttpError: silence for ``timeout_s``, bytes that are not HTTP/1.1, a
                head too large, or the server closing before the answer's end.
        """
        with trio.move_on_after(timeout_s) as scope:
            try:
                data = await self.stream.receive_some(_READ_BYTES)
            except (OSError, trio.BrokenResourceError) as exc:
                raise HttpError(f"the response broke off: {exc!r}", sent=True) from None
        if scope.cancelled_caught:
            raise HttpError(f"no answer for {timeout_s:g} s", sent=True)
        if not data:
            self.eof = True
            if self.head_done and self._until_close:
                self.complete, self.keep_alive = True, False
                return
            raise HttpError("the server closed the connection mid-response", sent=True)
        if not self.head_done:
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD_BYTES:
                raise HttpError("the response head is too large", sent=True)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise HttpError(f"the response is not HTTP/1.1: {exc}", sent=True) from None
        if self.complete and self._until_close:
            self.keep_alive = False

    def take_body(self) -> bytes:
        pieces, self.pieces = self.pieces, []
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


@dataclass
class Response:
    """The status and headers; the body is read with :meth:`body` or :meth:`iter_body`."""

    status: int
    headers: dict[str, str]
    _connection: _Connection
    _timeout_s: float
    _finished: bool = field(default=False)

    async def iter_body(self) -> AsyncIterator[bytes]:
        """The body as it arrives: what one read brought, as one piece."""
        connection = self._connection
        while True:
            if connection.pieces:
                yield connection.take_body()
                continue
            if connection.complete:
                self._finished = True
                return
            await connection.read(self._timeout_s)

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
        self._authority = f"{host}:{port}"
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
                if (response is not None and response._finished and connection.keep_alive
                        and not connection.eof):
                    connection.reused = True
                    self._idle.append(connection)
                else:
                    with trio.CancelScope(shield=True):
                        await connection.stream.aclose()

    def _encode(self, method: str, path: str, headers: Sequence[tuple[str, str]],
                body: bytes) -> bytes:
        lines = [f"{method} {path} HTTP/1.1\r\nhost: {self._authority}\r\n"
                 f"content-length: {len(body)}\r\n"]
        for name, value in headers:
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise HttpError(f"a header holds a line break: {name!r}", sent=False)
            lines.append(f"{name}: {value}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1") + body

    async def _send(self, connection: _Connection, method: str, path: str,
                    headers: Sequence[tuple[str, str]], body: bytes) -> Response:
        request = self._encode(method, path, headers, body)
        connection.start_cycle()
        try:
            await connection.stream.send_all(request)
            while not connection.head_done:
                await connection.read(self.read_timeout_s)
        except (OSError, trio.BrokenResourceError, HttpError) as exc:
            # On a reused connection, a failure before the response's head is
            # the server having closed it while idle (a restarted server too).
            if connection.reused and not connection.head_done and not (
                    isinstance(exc, HttpError) and exc.args[0].startswith("no answer")):
                raise HttpError(_STALE, sent=True) from None
            if isinstance(exc, HttpError):
                raise
            raise HttpError(f"the request failed: {exc!r}", sent=True) from None
        return Response(status=connection.status, headers=connection.headers,
                        _connection=connection, _timeout_s=self.read_timeout_s)


#: The message of a failure on a reused idle connection that the server had
#: closed: retried once on a new connection.
_STALE = "the idle connection was closed by the server"
