"""The trio driver over streams in memory: any split of any conversation is answered in
order; any bytes end in an answer or a close, never in an exception."""

from __future__ import annotations

import httptools
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.httpserver import ServerConfig, serve_connection

from .requests import Sent, conversations, splits


async def echo(scope, receive, send) -> None:
    """Answers ``METHOD TARGET\\n`` and the body it read."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"%s %s\n" % (
        scope["method"].encode(), target), "more_body": True})
    await send({"type": "http.response.body", "body": body})


class Responses:
    """Responses parsed as a client would (httptools' response parser)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[tuple[int, bytes]] = []
        self._body = b""

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.done.append((self.parser.get_status_code(), self._body))
        self._body = b""


async def converse(pieces: list[bytes], config: ServerConfig = ServerConfig()
                   ) -> tuple[Responses, bool]:
    """Send ``pieces`` to a served connection; the responses, and whether the server closed."""
    client, server = trio.testing.memory_stream_pair()
    responses = Responses()
    closed = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve_connection, server, echo, config)

        async def write() -> None:
            for piece in pieces:
                try:
                    await client.send_all(piece)
                except trio.BrokenResourceError:  # the server closed after bad bytes
                    return
                await trio.lowlevel.checkpoint()

        nursery.start_soon(write)
        while True:
            with trio.move_on_after(1) as scope:  # a mock clock jumps: never real time
                data = await client.receive_some()
            if scope.cancelled_caught:
                break
            if not data:
                closed = True
                break
            try:
                responses.parser.feed_data(data)
            except httptools.HttpParserError:
                break
        nursery.cancel_scope.cancel()
    return responses, closed


@settings(max_examples=150, deadline=None)
@given(data=st.data(), sent=conversations())
def test_every_request_is_answered_in_order_whatever_the_split(data: st.DataObject,
                                                               sent: list[Sent]) -> None:
    wire = b"".join(request.encode() for request in sent)
    pieces = data.draw(splits(wire))

    async def main() -> None:
        responses, closed = await converse(pieces)
        expected = [(200, b"%s %s\n%s" % (r.method.encode(), r.target, r.body)) for r in sent]
        assert responses.done == expected
        assert closed is sent[-1].close  # kept alive unless the last one said close

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=300, deadline=None)
@given(garbage=st.lists(st.binary(max_size=120), min_size=1, max_size=5),
       prefix=st.sampled_from([b"", b"GET / HTTP/1.1\r\n",
                               b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n"]))
def test_any_bytes_end_in_answers_or_a_close(garbage: list[bytes], prefix: bytes) -> None:
    async def main() -> None:
        responses, _ = await converse([prefix, *garbage],
                                      ServerConfig(max_head_bytes=200, max_headers=8))
        assert all(status in (200, 400, 408, 431) for status, _ in responses.done)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
