"""The trio driver: connections accepted, requests parsed by the core, an ASGI app run inline.

Theory of operation
-------------------
:func:`serve_listener` accepts connections (at most ``max_connections`` at
once: past it, accepting waits and the kernel's backlog holds the rest) and
runs :func:`serve_connection` for each in its own task. That task is the
connection's only reader and its only writer: it waits for a request head
(``keep_alive_s`` for the first byte of it, then ``head_timeout_s`` for the
rest), then calls the ASGI app *in the same task* with that request's
``receive`` and ``send`` (no task, channel or queue per request: the hot
path of a small request is one read, the app, one write).

``receive`` hands out the body as the core parsed it, reading the socket
when nothing is parsed yet; once the body is complete it waits for the
client to leave (``http.disconnect``), reading ahead at most until the next
request's head and one read of its body are parsed (so a pipelining client
cannot make the server buffer more; those events are the next request's).
``send`` holds the answer's head until the first body message: a whole body
goes out with it in one write with a ``content-length``, a streamed one
(``more_body``) in chunks, each written before ``send`` returns, so a client
that reads slowly slows the app down instead of filling memory; a write that
makes no progress for ``send_timeout_s`` ends the connection.

Requests on a connection are answered one after the other, in order. The
connection is kept for another request when the client wants it, the app
did not say ``connection: close``, and the request was read to its end
(what is left of a body already buffered is dropped; one still on the wire
closes the connection). Bad input is answered with the core's status hint
(400, 408, 413, 431) and ``connection: close`` when no answer has begun,
and the connection closes; an app that raises gets a 500 the same way (or
the connection closed mid-answer), logged. Nothing a client sends ends the
server.

ASGI: HTTP only (``asgi.spec_version`` 2.3: after the client is gone, sends
are dropped and ``receive`` says ``http.disconnect``); no lifespan events
(the apps served this way keep their state outside), no websockets, no
trailers.
"""

from __future__ import annotations

import email.utils
import errno
import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import httptools
import trio

from ._core import Body, EndOfRequest, RequestHead, ServerConnection
from ._errors import LocalProtocolError, RemoteProtocolError

__all__ = ["ServerConfig", "serve_connection", "serve_listener"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

_ASGI = {"version": "3.0", "spec_version": "2.3"}
_DISCONNECT: dict[str, str] = {"type": "http.disconnect"}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: What a connection's timer (see ``_Connection.timer``) was waiting for when it fired.
_IDLE, _HEAD, _APP, _WRITE = "idle", "head", "app", "write"
#: Accept errors that mean "out of resources now": wait and accept again (as trio's
#: serve_listeners does).
_ACCEPT_RETRY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


@dataclass(frozen=True)
class ServerConfig:
    """The server's limits."""

    #: How long a connection may idle between requests (to the first byte of the next).
    keep_alive_s: float = 75.0
    #: From a head's first byte to its end (408 past it).
    head_timeout_s: float = 30.0
    #: Longest a write may wait for the client to read (the connection ends past it).
    send_timeout_s: float = 60.0
    #: Connections served at once; more wait in the kernel's backlog.
    max_connections: int = 2048
    #: Request head bytes and header fields taken (431 past either).
    max_head_bytes: int = 64 << 10
    max_headers: int = 128
    #: Bytes asked of the socket per read.
    read_bytes: int = 64 << 10


class _Date:
    """The ``date`` header's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = math.floor(time.time())
        if second != self._second:
            self._second = second
            self._value = email.utils.formatdate(second, usegmt=True).encode()
        return self._value


_date = _Date()


class _Connection:
    """One client connection: the core, the stream, and what the driver knows of it."""

    __slots__ = ("client", "config", "core", "eof", "gone", "phase", "server", "stream",
                 "timer")

    def __init__(self, stream: trio.abc.Stream, config: ServerConfig) -> None:
        self.stream = stream
        self.config = config
        self.core = ServerConnection(max_head_bytes=config.max_head_bytes,
                                     max_headers=config.max_headers)
        #: The client closed its side (or the read failed): nothing more will come.
        self.eof = False
        #: A write failed or timed out: nothing more can be sent.
        self.gone = False
        #: The connection's one timer: a cancel scope around its whole life whose
        #: deadline is set while waiting for a head or for a write, infinite while the
        #: app works (a scope per wait cost a tenth of a small request). When it
        #: fires, ``phase`` says what was late.
        self.timer = trio.CancelScope()
        self.phase = _APP
        sock = getattr(stream, "socket", None)  # None: a stream in memory (tests)
        self.client = _address(sock, "getpeername")
        self.server = _address(sock, "getsockname")

    async def read(self) -> None:
        """One read into the core (EOF on a broken read).

        Raises:
            RemoteProtocolError: what was read breaks HTTP/1.1 or a limit.
        """
        try:
            data = await self.stream.receive_some(self.config.read_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            data = b""
        if not data:
            self.eof = True
        self.core.receive_data(data)

    async def write(self, data: bytes) -> None:
        """Send ``data``; on failure mark the client gone and drop it and everything
        after it. No progress for ``send_timeout_s`` fires the timer (the connection
        ends, and the app with it)."""
        if self.gone:
            return
        timer = self.timer
        phase, self.phase = self.phase, _WRITE
        timer.deadline = trio.current_time() + self.config.send_timeout_s
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.gone = True
        finally:
            timer.deadline = math.inf
            self.phase = phase

    async def next_head(self) -> RequestHead | None:
        """The next request's head; None when the client left or idled out.

        Raises:
            RemoteProtocolError: bad bytes, a head too large, or too slow (408).
        """
        core = self.core
        event = core.next_event()
        if event is not None:
            return _head(event)
        timer = self.timer
        self.phase = _IDLE
        timer.deadline = trio.current_time() + self.config.keep_alive_s
        while True:
            if core.failure is not None:
                raise core.failure
            if core.input_closed:
                return None
            await self.read()  # the timer fires: serve_connection closes, or answers 408
            event = core.next_event()
            if event is not None:
                timer.deadline = math.inf
                self.phase = _APP
                return _head(event)
            if self.phase is _IDLE:
                self.phase = _HEAD
                timer.deadline = trio.current_time() + self.config.head_timeout_s


def _head(event: object) -> RequestHead:
    if type(event) is not RequestHead:  # the core orders events; the driver takes them all
        raise LocalProtocolError(f"expected a request head, got {type(event).__name__}")
    return event  # type: ignore[return-value]


def _address(sock: Any, which: str) -> tuple[str, int] | None:
    if sock is None:
        return None
    try:
        address = getattr(sock, which)()
    except OSError:
        return None
    return (address[0], address[1]) if isinstance(address, tuple) else None


def _target(target: bytes) -> tuple[str, bytes, bytes]:
    """``(path, raw_path, query_string)`` of a request target.

    Raises:
        RemoteProtocolError: a target that is not a path (or an absolute URL).
    """
    if target[:1] == b"/":
        raw_path, _, query = target.partition(b"?")
    else:
        try:
            url = httptools.parse_url(target)
        except httptools.HttpParserInvalidURLError:
            raise RemoteProtocolError("bad request target") from None
        raw_path, query = url.path or b"/", url.query or b""
    try:
        path = raw_path.decode("ascii")
    except UnicodeDecodeError:
        raise RemoteProtocolError("bad request target") from None
    if "%" in path:
        path = unquote(path)
    return path, raw_path, query


class _Cycle:
    """One request and its answer: the ASGI ``receive`` and ``send``."""

    __slots__ = (
        "connection",
        "ended",
        "head",
        "request_done",
        "response_head",
        "sent_continue",
        "started",
    )

    def __init__(self, connection: _Connection, head: RequestHead) -> None:
        self.connection = connection
        self.head = head
        self.request_done = False
        self.started = False
        self.ended = False
        self.sent_continue = not head.expect_continue
        self.response_head: tuple[int, list[tuple[bytes, bytes]]] | None = None

    # -- receive ----------------------------------------------------------------------

    async def receive(self) -> Message:
        connection = self.connection
        if self.request_done:
            await self._wait_gone()
            return _DISCONNECT
        core = connection.core
        while True:
            event = core.next_event()
            if event is None:
                if connection.eof or connection.gone or core.input_closed:
                    return _DISCONNECT
                if not self.sent_continue and not self.started:
                    self.sent_continue = True
                    await connection.write(_CONTINUE)
                try:
                    await connection.read()
                except RemoteProtocolError:
                    return _DISCONNECT  # answered after the app, if it has not answered
                continue
            if type(event) is Body:
                data = event.data  # type: ignore[union-attr]
                if core.next_is_end():
                    core.next_event()
                    self.request_done = True
                    return {"type": "http.request", "body": data, "more_body": False}
                return {"type": "http.request", "body": data, "more_body": True}
            if type(event) is EndOfRequest:
                self.request_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            raise LocalProtocolError("a request head inside a request")

    async def _wait_gone(self) -> None:
        """Until the client leaves; reads ahead only until the next request is parsed."""
        connection = self.connection
        core = connection.core
        while not (connection.eof or connection.gone):
            if core.has_events or core.input_closed:
                await trio.sleep_forever()  # the next request waits its turn
            try:
                await connection.read()
            except RemoteProtocolError:
                await trio.sleep_forever()  # answered once this request is

    def finish_request(self) -> bool:
        """Drop what is left of the request's body if it is all buffered; True if the
        request was read to its end (the connection can carry another)."""
        core = self.connection.core
        while not self.request_done:
            event = core.next_event()
            if event is None:
                return False
            if type(event) is EndOfRequest:
                self.request_done = True
        return True

    # -- send -------------------------------------------------------------------------

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            if not self.started or self.ended:
                raise LocalProtocolError("http.response.body before http.response.start "
                                         "or after the last body")
            body = message.get("body", b"")
            more = message.get("more_body", False)
            connection = self.connection
            core = connection.core
            if self.response_head is not None:
                status, headers = self.response_head
                self.response_head = None
                keep_alive = self.head.keep_alive and self.finish_request() \
                    and not core.input_closed
                out = core.response_head(status, headers, head_request=self.head.method == "HEAD",
                                         keep_alive=keep_alive, date=_date.now(),
                                         body=None if more else bytes(body),
                                         http10=self.head.http_version == "1.0")
                if more:
                    out += core.response_data(body)
            else:
                out = core.response_data(body)
            if not more:
                self.ended = True
                out += core.response_end()
            if out:
                await connection.write(out)
            return
        if kind == "http.response.start":
            if self.started:
                raise LocalProtocolError("http.response.start sent twice")
            self.started = True
            self.response_head = (int(message["status"]), list(message.get("headers", ())))
            await trio.lowlevel.checkpoint()
            return
        raise LocalProtocolError(f"unexpected ASGI message {kind!r}")


async def _answer_error(connection: _Connection, status: int, message: str) -> None:
    """A plain-text error answer that closes the connection."""
    body = f"{message}\n".encode()
    core = connection.core
    out = core.response_head(status, [(b"content-type", b"text/plain; charset=utf-8")],
                             head_request=False, keep_alive=False, date=_date.now(), body=body)
    await connection.write(out)


async def serve_connection(stream: trio.abc.Stream, app: App, config: ServerConfig) -> None:
    """Serve HTTP/1.1 requests on ``stream`` with ``app`` until either side ends it.

    Never raises for what the client or the app did (logged); closes ``stream``.
    """
    connection = _Connection(stream, config)
    try:
        with connection.timer:
            while True:
                try:
                    head = await connection.next_head()
                except RemoteProtocolError as exc:
                    await _answer_error(connection, exc.status_hint, str(exc))
                    return
                if head is None:
                    return
                if not await _run_cycle(connection, head, app):
                    return
        if connection.phase is _HEAD:  # the timer fired while the head came in
            connection.timer = trio.CancelScope(deadline=trio.current_time()
                                                + config.send_timeout_s)
            with connection.timer:
                await _answer_error(connection, 408, "the request head did not arrive within "
                                                     f"{config.head_timeout_s:g} s")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except Exception:  # an app or a bug of ours: this connection ends, the server goes on
        log.exception("http.connection_failed client=%s", connection.client)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1.0):
            await stream.aclose()


async def _run_cycle(connection: _Connection, head: RequestHead, app: App) -> bool:
    """Answer one request; True if the connection carries another."""
    try:
        path, raw_path, query = _target(head.target)
    except RemoteProtocolError as exc:
        await _answer_error(connection, exc.status_hint, str(exc))
        return False
    scope = {"type": "http", "asgi": _ASGI, "http_version": head.http_version,
             "method": head.method, "scheme": "http", "path": path, "raw_path": raw_path,
             "query_string": query, "root_path": "", "headers": head.headers,
             "client": connection.client, "server": connection.server}
    cycle = _Cycle(connection, head)
    try:
        await app(scope, cycle.receive, cycle.send)
    except Exception:
        log.exception("http.app_failed method=%s path=%s", head.method, path[:200])
        if not cycle.started or cycle.response_head is not None:
            await _answer_error(connection, 500, "Internal Server Error")
        return False
    failure = connection.core.failure
    if not cycle.started or cycle.response_head is not None:
        if failure is not None:
            await _answer_error(connection, failure.status_hint, str(failure))
        else:
            log.error("http.app_no_answer method=%s path=%s", head.method, path[:200])
            await _answer_error(connection, 500, "Internal Server Error")
        return False
    if not cycle.ended or connection.gone:
        return False
    return connection.core.keep_alive and cycle.finish_request()


async def serve_listener(listener: trio.SocketListener, app: App, config: ServerConfig,
                         *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                         ) -> None:
    """Accept connections on ``listener`` and serve each with ``app`` until cancelled."""
    slots = trio.Semaphore(config.max_connections)
    async with trio.open_nursery() as nursery:
        task_status.started()
        while True:
            await slots.acquire()
            try:
                stream = await listener.accept()
            except OSError as exc:
                slots.release()
                if exc.errno not in _ACCEPT_RETRY_ERRNOS:
                    raise
                log.warning("http.accept_failed errno=%s", errno.errorcode.get(exc.errno or 0))
                await trio.sleep(0.1)
                continue
            except BaseException:
                slots.release()
                raise
            nursery.start_soon(_serve_and_release, stream, app, config, slots)


async def _serve_and_release(stream: trio.SocketStream, app: App, config: ServerConfig,
                             slots: trio.Semaphore) -> None:
    try:
        await serve_connection(stream, app, config)
    finally:
        slots.release()
