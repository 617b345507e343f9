"""The sans-IO side of a served HTTP/1.1 connection: bytes in, events out; answers to bytes.

:class:`ServerConnection` feeds what the client sent to ``httptools``' request
parser (llhttp, in C) and turns its callbacks into events, in order:

- :class:`RequestHead` (method, target, lower-cased header names, whether the
  client keeps the connection alive, whether it waits for ``100 Continue``),
- :class:`Body` (any number, in arrival order; chunked bodies already
  de-chunked),
- :class:`EndOfRequest`.

Several requests in one read (pipelining) give their events one after the
other; the driver answers them in order. A head larger than
``max_head_bytes`` (counted from the read it began in; at most one read more
is held before it is noticed) or with more than ``max_headers`` fields is
refused with 431, anything llhttp refuses with 400, both as
:class:`RemoteProtocolError`, after which the connection is not used again.
An upgrade request (``Upgrade:`` with ``Connection: upgrade``, or ``CONNECT``)
is taken as a request without a body whose answer closes the connection: the
protocol is never switched.

The answer's side (:meth:`ServerConnection.response_head`, :meth:`~ServerConnection.response_data`,
:meth:`~ServerConnection.response_end`) returns the bytes to send: the whole
answer with a ``content-length`` when its body is known at once, else
``transfer-encoding: chunked`` (no body at all for ``HEAD``, 1xx, 204, 304).
The clock is the driver's: it passes the ``date`` header's value.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from http import HTTPStatus

import httptools

from ._errors import LocalProtocolError, RemoteProtocolError

__all__ = ["Body", "EndOfRequest", "Event", "RequestHead", "ServerConnection"]

#: Largest request head (request line and headers) taken, in bytes.
MAX_HEAD_BYTES = 64 << 10
#: Most header fields in one request head.
MAX_HEADERS = 128


@dataclass(slots=True)
class RequestHead:
    """A request's line and headers."""

    method: str
    target: bytes
    #: ``(name, value)``, names lower-cased, in the order sent.
    headers: list[tuple[bytes, bytes]]
    http_version: str
    #: The client keeps the connection for another request after this one.
    keep_alive: bool
    #: The client waits for ``100 Continue`` before sending its body.
    expect_continue: bool


@dataclass(slots=True)
class Body:
    """A piece of the request body."""

    data: bytes


class EndOfRequest:
    """The request's body is complete."""

    __slots__ = ()


END_OF_REQUEST = EndOfRequest()
Event = RequestHead | Body | EndOfRequest

_NO_BODY_STATUSES = frozenset({204, 304})
_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = ""
        line = f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")
        if len(_STATUS_LINES) < 256:  # bounded: statuses are 100..599 anyway
            _STATUS_LINES[status] = line
    return line


class ServerConnection:
    """One client connection's HTTP/1.1 state (see the module doc).

    Args:
        max_head_bytes: a larger request head is refused (431).
        max_headers: more header fields are refused (431).
    """

    def __init__(self, *, max_head_bytes: int = MAX_HEAD_BYTES,
                 max_headers: int = MAX_HEADERS) -> None:
        self.max_head_bytes = max_head_bytes
        self.max_headers = max_headers
        self._parser = httptools.HttpRequestParser(self)
        self._events: deque[Event] = deque()
        #: Body bytes parsed and not yet taken (the driver stops reading past a bound).
        self.buffered_bytes = 0
        self._in_message = False
        self._in_head = False
        self._began_in_feed = False
        self._head_bytes = 0
        self._url = b""
        #: Bytes of the head's line and fields seen so far (exact, unlike ``_head_bytes``).
        self._head_size = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._failed: RemoteProtocolError | None = None
        #: No more requests are read: an upgrade, an error, or the client's EOF.
        self.input_closed = False
        # The answer being given.
        self._chunked = False
        self._no_body = False
        self._head_request = False
        self.keep_alive = True

    # -- parser callbacks (httptools calls them from feed_data) ---------------------------

    def on_message_begin(self) -> None:
        self._in_message = True
        self._in_head = True
        self._began_in_feed = True
        self._url = b""
        self._headers = []
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self._headers) >= self.max_headers:
            raise RemoteProtocolError(f"more than {self.max_headers} header fields",
                                      status_hint=431, code="head_too_large")
        self._headers.append((name.lower(), value))
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self.max_head_bytes:
            raise RemoteProtocolError(f"the request head exceeds {self.max_head_bytes} bytes",
                                      status_hint=431, code="head_too_large")

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        expect = False
        for name, value in self._headers:
            if name == b"expect" and value.lower() == b"100-continue":
                expect = True
        self._events.append(RequestHead(
            method=parser.get_method().decode("ascii"), target=self._url,
            headers=self._headers, http_version=parser.get_http_version(),
            keep_alive=parser.should_keep_alive(), expect_continue=expect))

    def on_body(self, body: bytes) -> None:
        self.buffered_bytes += len(body)
        self._events.append(Body(body))

    def on_message_complete(self) -> None:
        self._in_message = False
        self._events.append(END_OF_REQUEST)

    # -- input ----------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Feed bytes the client sent (``b""``: it closed its side).

        Raises:
            RemoteProtocolError: the bytes break HTTP/1.1 or a limit; the
                connection takes nothing more (every later call raises it again).
        """
        if self._failed is not None:
            raise self._failed
        if self.input_closed:
            return  # after an upgrade request: what follows is not HTTP/1.1 to us
        if not data:
            self.input_closed = True
            if self._in_message:
                self._fail(RemoteProtocolError("the client closed mid-request"))
            return
        self._began_in_feed = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade()
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, RemoteProtocolError):
                self._fail(cause)
            self._fail(RemoteProtocolError(f"bad request: {exc}"))
        except httptools.HttpParserError as exc:
            self._fail(RemoteProtocolError(f"bad request: {exc}"))
        if self._in_head:
            # A head's first read holds at most one read of it; every later read counts.
            self._head_bytes = 0 if self._began_in_feed else self._head_bytes + len(data)
            if self._head_bytes > self.max_head_bytes:
                self._fail(RemoteProtocolError(
                    f"the request head exceeds {self.max_head_bytes} bytes",
                    status_hint=431, code="head_too_large"))

    def _upgrade(self) -> None:
        """An upgrade request: its head is parsed and parsing stopped after it."""
        self.input_closed = True
        heads = [event for event in self._events if type(event) is RequestHead]
        if not heads:
            self._fail(RemoteProtocolError("bad upgrade request"))
        head = heads[-1]
        for name, _ in head.headers:
            if name in (b"content-length", b"transfer-encoding"):
                self._fail(RemoteProtocolError("an upgrade request with a body"))
        head.keep_alive = False
        if self._in_message:  # llhttp may stop before the message's end
            self._in_message = False
            self._events.append(END_OF_REQUEST)

    def _fail(self, error: RemoteProtocolError) -> None:
        self._failed = error
        self.input_closed = True
        raise error

    def next_event(self) -> Event | None:
        """The next event, or None until more bytes are fed."""
        if not self._events:
            return None
        event = self._events.popleft()
        if type(event) is Body:
            self.buffered_bytes -= len(event.data)
        return event

    @property
    def has_events(self) -> bool:
        """Events are parsed and not yet taken."""
        return bool(self._events)

    def next_is_end(self) -> bool:
        """The next event is the :class:`EndOfRequest` (so a body piece is the last)."""
        return bool(self._events) and type(self._events[0]) is EndOfRequest

    @property
    def failure(self) -> RemoteProtocolError | None:
        """Why the input was refused, once it was."""
        return self._failed

    # -- output ---------------------------------------------------------------------------

    def response_head(self, status: int, headers: list[tuple[bytes, bytes]], *,
                      head_request: bool, keep_alive: bool, date: bytes,
                      body: bytes | None, http10: bool = False) -> bytes:
        """The answer's status line and headers (and ``body`` if it is the whole body).

        ``http10``: the request was HTTP/1.0 (no chunks: a body of unknown length
        ends with the connection). ``keep_alive``: the connection may carry another
        request (the driver's decision: the client's wish, and the request read to
        its end). A ``connection: close`` among ``headers`` closes it too;
        :attr:`keep_alive` says what was decided.

        Raises:
            LocalProtocolError: a header name or value holds CR or LF.
        """
        self._head_request = head_request
        self._no_body = head_request or status < 200 or status in _NO_BODY_STATUSES
        parts = [_status_line(status)]
        length_given = False
        for name, value in headers:
            if b"\n" in value or b"\r" in value or b"\n" in name or b"\r" in name:
                raise LocalProtocolError(f"a header holds CR or LF: {name!r}")
            lowered = name.lower()
            if lowered == b"content-length":
                length_given = True
            elif lowered == b"connection":
                if b"close" in value.lower():
                    keep_alive = False
                continue  # ours to say, below
            elif lowered == b"transfer-encoding":
                continue  # ours to decide
            parts += (name, b": ", value, b"\r\n")
        parts += (b"date: ", date, b"\r\n")
        self._chunked = False
        if not self._no_body or head_request:
            if body is not None and not length_given:
                parts += (b"content-length: ", str(len(body)).encode(), b"\r\n")
            elif body is None and not length_given:
                if head_request:
                    pass  # no length known, none sent
                elif http10:
                    keep_alive = False  # HTTP/1.0 has no chunks: the body ends with the close
                else:
                    self._chunked = True
                    parts.append(b"transfer-encoding: chunked\r\n")
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        self.keep_alive = keep_alive
        parts.append(b"\r\n")
        if body and not self._no_body:
            parts.append(body)
        return b"".join(parts)

    def response_data(self, data: bytes) -> bytes:
        """A piece of the answer's body, framed."""
        if self._no_body or not data:
            return b""
        if self._chunked:
            return b"%x\r\n%b\r\n" % (len(data), data)
        return data

    def response_end(self) -> bytes:
        """The end of the answer's body."""
        if self._chunked and not self._no_body:
            return b"0\r\n\r\n"
        return b""
