"""The lean server on real sockets: keep-alive, streaming, backpressure and limits."""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from p2p.http import ServerBindError, bound_socket, serve_asgi
from p2p.httpserver import ServerConfig, serve_listener

from .test_driver import Responses, echo


def parsed(data: bytes) -> list[tuple[int, bytes]]:
    """The responses in ``data``: ``(status, body)``."""
    responses = Responses()
    responses.parser.feed_data(data)
    return responses.done


@asynccontextmanager
async def served(app: Any, config: ServerConfig | None = None) -> AsyncIterator[int]:
    """``app`` on 127.0.0.1 (the port yielded); ``config`` for tight limits."""
    async with trio.open_nursery() as nursery:
        if config is None:
            _, port = await nursery.start(functools.partial(
                serve_asgi, app, host="127.0.0.1", port=0, bind_error=ServerBindError,
                lean=True))
        else:
            sock = bound_socket("127.0.0.1", 0)
            sock.listen(16)
            port = sock.getsockname()[1]
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            await nursery.start(serve_listener, listener, app, config)
        yield port
        nursery.cancel_scope.cancel()


async def raw(port: int, data: bytes) -> bytes:
    """Send ``data``, read until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = b""
        while chunk := await stream.receive_some():
            out += chunk
        return out


async def in_thread(fn: Callable[[], Any]) -> Any:
    return await trio.to_thread.run_sync(fn)


async def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    async with served(echo) as port:
        def two_on_one_connection() -> list[str]:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
                return [client.post(f"/{n}", content=b"x" * n).text for n in (1, 2)]

        assert await in_thread(two_on_one_connection) == ["POST /1\nx", "POST /2\nxx"]
        pipelined = b"".join(
            b"POST /%d HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\n%d" % (n, n)
            for n in range(3)) + b"GET /last HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        assert parsed(await raw(port, pipelined)) == [
            (200, b"POST /0\n0"), (200, b"POST /1\n1"), (200, b"POST /2\n2"),
            (200, b"GET /last\n")]


async def test_a_chunked_request_body_reaches_the_app() -> None:
    async with served(echo) as port:
        out = await raw(port, b"POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n"
                              b"Connection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert parsed(out) == [(200, b"POST /c\nabcde")]


async def test_a_streamed_answer_arrives_in_chunks_as_it_is_sent() -> None:
    second = trio.Event()

    async def sse(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await second.wait()
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with served(sse) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            got = b""
            while b"data: 1\n\n" not in got:  # the first event before the second exists
                got += await stream.receive_some()
            assert b"transfer-encoding: chunked" in got and b"data: 2" not in got
            second.set()
            while not got.endswith(b"0\r\n\r\n"):
                got += await stream.receive_some()
            assert b"data: 2\n\n" in got


async def test_a_client_that_does_not_read_holds_the_app_back() -> None:
    """Backpressure: the app's send waits for the client; memory does not grow."""
    sent = 0
    piece = b"x" * (1 << 20)

    async def firehose(scope, receive, send) -> None:
        nonlocal sent
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(1024):  # 1 GiB if nothing held it back
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            sent += 1
        await send({"type": "http.response.body", "body": b""})

    async with served(firehose) as port:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        try:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            await trio.testing.wait_all_tasks_blocked(cushion=0.2)
            # What the kernel's buffers hold, at most: far below what the app wanted to send.
            assert sent < 64
        finally:
            sock.close()


async def test_bad_requests_are_400_and_the_server_goes_on() -> None:
    async with served(echo) as port:
        out = await raw(port, b"GARBAGE\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 400 ") and b"connection: close" in out
        out = await raw(port, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200 ")


async def test_a_head_too_large_is_431() -> None:
    async with served(echo, ServerConfig(max_head_bytes=1024)) as port:
        out = await raw(port, b"GET / HTTP/1.1\r\nx-big: " + b"a" * 8192 + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431 ")


async def test_a_head_that_does_not_arrive_in_time_is_408() -> None:
    async with served(echo, ServerConfig(head_timeout_s=0.2)) as port:
        out = await raw(port, b"GET / HTTP/1.1\r\nHost: t\r\n")  # never finished
    assert out.startswith(b"HTTP/1.1 408 ")


async def test_an_idle_connection_is_closed_quietly() -> None:
    async with served(echo, ServerConfig(keep_alive_s=0.2)) as port:
        assert await raw(port, b"") == b""


async def test_connections_past_the_limit_wait_for_room() -> None:
    async with served(echo, ServerConfig(max_connections=1)) as port:
        first = await trio.open_tcp_stream("127.0.0.1", port)
        await first.send_all(b"GET /1 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert b"GET /1" in await first.receive_some()
        second = socket.create_connection(("127.0.0.1", port))
        second.setblocking(False)
        try:
            second.sendall(b"GET /2 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            await trio.testing.wait_all_tasks_blocked(cushion=0.2)
            with pytest.raises(BlockingIOError):  # not served while the first is open
                second.recv(1024)
            await first.aclose()
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(second))
            got = b""
            while chunk := await stream.receive_some():
                got += chunk
            assert b"GET /2" in got
        finally:
            second.close()


async def test_an_app_that_raises_gets_500_and_the_server_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    async def broken(scope, receive, send) -> None:
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        await echo(scope, receive, send)

    async with served(broken) as port:
        out = await raw(port, b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 500 ")
        out = await raw(port, b"GET /ok HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200 ")
    assert "http.app_failed" in caplog.text


async def test_expect_100_continue_is_answered_when_the_body_is_read() -> None:
    async with served(echo) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"POST /e HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                                  b"Content-Length: 2\r\nConnection: close\r\n\r\n")
            got = await stream.receive_some()
            assert got == b"HTTP/1.1 100 Continue\r\n\r\n"
            await stream.send_all(b"ok")
            while chunk := await stream.receive_some():
                got += chunk
    assert parsed(got.removeprefix(b"HTTP/1.1 100 Continue\r\n\r\n")) == [(200, b"POST /e\nok")]


async def test_a_client_leaving_a_stream_is_told_to_the_app() -> None:
    gone = trio.Event()

    async def waits(scope, receive, send) -> None:
        assert (await receive())["type"] == "http.request"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"
        gone.set()

    async with served(waits) as port:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        await stream.receive_some()
        await stream.aclose()
        await gone.wait()


async def test_a_client_that_stops_reading_is_let_go_after_the_send_timeout() -> None:
    ended = trio.Event()

    async def firehose(scope, receive, send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            while True:
                await send({"type": "http.response.body", "body": b"x" * (1 << 20),
                            "more_body": True})
        finally:
            ended.set()

    async with served(firehose, ServerConfig(send_timeout_s=0.3)) as port:
        sock = socket.create_connection(("127.0.0.1", port))
        try:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            await ended.wait()  # the app was stopped: the connection no longer holds it
        finally:
            sock.close()
