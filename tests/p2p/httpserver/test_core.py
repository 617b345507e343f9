"""The sans-IO connection: requests in any split make the same events; limits; framing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.httpserver import Body, EndOfRequest, RemoteProtocolError, RequestHead, ServerConnection

from .requests import Sent, conversations, splits


def _events(connection: ServerConnection) -> list:
    out = []
    while (event := connection.next_event()) is not None:
        out.append(event)
    return out


def _requests(events: list) -> list[tuple[RequestHead, bytes]]:
    """``(head, body)`` per request, checking the events' order on the way."""
    got: list[tuple[RequestHead, bytes]] = []
    head, body = None, b""
    for event in events:
        if isinstance(event, RequestHead):
            assert head is None, "a head inside a request"
            head, body = event, b""
        elif isinstance(event, Body):
            assert head is not None
            body += event.data
        else:
            assert isinstance(event, EndOfRequest) and head is not None
            got.append((head, body))
            head = None
    assert head is None, "a request left open"
    return got


def _check(sent: list[Sent], got: list[tuple[RequestHead, bytes]]) -> None:
    assert len(got) == len(sent)
    for request, (head, body) in zip(sent, got, strict=True):
        assert head.method == request.method
        assert head.target == request.target
        assert body == request.body
        names = [name for name, _ in head.headers]
        for name, value in request.headers:
            assert (name, value) in head.headers
        assert all(name == name.lower() for name in names)
        assert head.keep_alive is not request.close
        assert head.http_version == "1.1"


@settings(max_examples=300, deadline=None)
@given(data=st.data(), sent=conversations())
def test_requests_split_anywhere_make_the_same_events(data: st.DataObject,
                                                      sent: list[Sent]) -> None:
    wire = b"".join(request.encode() for request in sent)
    connection = ServerConnection()
    events = []
    for piece in data.draw(splits(wire)):
        connection.receive_data(piece)
        events += _events(connection)
    connection.receive_data(b"")  # the client closes after its last request: no error
    _check(sent, _requests(events))
    assert connection.buffered_bytes == 0


@settings(max_examples=500, deadline=None)
@given(garbage=st.lists(st.binary(max_size=200), max_size=6))
def test_any_bytes_give_events_or_a_protocol_error(garbage: list[bytes]) -> None:
    connection = ServerConnection(max_head_bytes=256, max_headers=8)
    try:
        for piece in [*garbage, b""]:
            connection.receive_data(piece)
            _events(connection)
    except RemoteProtocolError as exc:
        assert exc.status_hint in (400, 431)
        with pytest.raises(RemoteProtocolError):  # and it stays refused
            connection.receive_data(b"GET / HTTP/1.1\r\n\r\n")


@pytest.mark.parametrize("pieces", [1, 50])
def test_a_head_larger_than_the_limit_is_431(pieces: int) -> None:
    connection = ServerConnection(max_head_bytes=1024)
    wire = b"GET / HTTP/1.1\r\nx-big: " + b"a" * 4096
    step = max(1, len(wire) // pieces)
    with pytest.raises(RemoteProtocolError) as caught:
        for offset in range(0, len(wire), step):
            connection.receive_data(wire[offset:offset + step])
        # One read may hold the whole head's start: the next read counts.
        connection.receive_data(b"a" * 2048)
    assert caught.value.status_hint == 431


def test_too_many_header_fields_is_431() -> None:
    connection = ServerConnection(max_headers=4)
    wire = b"GET / HTTP/1.1\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(5)) + b"\r\n"
    with pytest.raises(RemoteProtocolError) as caught:
        connection.receive_data(wire)
    assert caught.value.status_hint == 431


def test_a_client_closing_mid_request_is_an_error() -> None:
    connection = ServerConnection()
    connection.receive_data(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(RemoteProtocolError):
        connection.receive_data(b"")


def test_an_upgrade_is_a_request_without_body_that_closes() -> None:
    connection = ServerConnection()
    connection.receive_data(b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
                            b"not HTTP/1.1 any more")
    head, end = _events(connection)
    assert isinstance(head, RequestHead) and not head.keep_alive
    assert isinstance(end, EndOfRequest)
    assert connection.input_closed


def test_expect_continue_is_reported() -> None:
    connection = ServerConnection()
    connection.receive_data(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n")
    (head,) = _events(connection)
    assert head.expect_continue


@pytest.mark.parametrize(("status", "head_request", "body", "framing"), [
    (200, False, b"hello", b"content-length: 5"),
    (200, False, None, b"transfer-encoding: chunked"),
    (200, True, b"hello", b"content-length: 5"),
    (204, False, b"", None),
    (304, False, None, None),
])
def test_answers_are_framed_by_what_is_known(status: int, head_request: bool,
                                            body: bytes | None, framing: bytes | None) -> None:
    connection = ServerConnection()
    out = connection.response_head(status, [(b"content-type", b"text/plain")],
                                   head_request=head_request, keep_alive=True,
                                   date=b"today", body=body)
    head, _, rest = out.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0].startswith(b"HTTP/1.1 %d " % status)
    if framing is None:
        assert not any(line.startswith((b"content-length", b"transfer-encoding"))
                       for line in lines)
    else:
        assert framing in lines
    assert rest == (body if body and not head_request and status == 200 else b"")
    if body is None and status == 200:
        assert connection.response_data(b"abc") == b"3\r\nabc\r\n"
        assert connection.response_end() == b"0\r\n\r\n"
    if head_request:
        assert connection.response_data(b"abc") == b""


def test_an_app_saying_close_closes() -> None:
    connection = ServerConnection()
    out = connection.response_head(200, [(b"Connection", b"close")], head_request=False,
                                   keep_alive=True, date=b"d", body=b"")
    assert b"connection: close" in out and not connection.keep_alive


def test_a_header_with_a_line_break_is_refused() -> None:
    from p2p.httpserver import LocalProtocolError

    connection = ServerConnection()
    with pytest.raises(LocalProtocolError):
        connection.response_head(200, [(b"x", b"a\r\nset-cookie: evil")], head_request=False,
                                 keep_alive=True, date=b"d", body=b"")


def test_a_streamed_answer_to_http_1_0_is_unframed_and_closes() -> None:
    connection = ServerConnection()
    connection.receive_data(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    (head, _) = _events(connection)
    assert head.keep_alive and head.http_version == "1.0"
    out = connection.response_head(200, [], head_request=False, keep_alive=True, date=b"d",
                                   body=None, http10=head.http_version == "1.0")
    assert b"transfer-encoding" not in out and b"connection: close" in out
    assert connection.response_data(b"abc") == b"abc" and connection.response_end() == b""
    assert not connection.keep_alive
