"""serve_asgi: one way to serve HTTP; a busy port is a clear error and leaks no socket."""

from __future__ import annotations

import gc
import socket

import pytest
import trio

from p2p.http import serve_asgi


class BusyPort(OSError):
    def __init__(self, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, f"{host}:{port} {cause.strerror}")


async def hello(scope, receive, send) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hi"})


@pytest.mark.filterwarnings("error::ResourceWarning")
async def test_a_busy_port_raises_the_callers_error_and_closes_its_socket():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for _ in range(3):
            with pytest.raises(BusyPort, match=f"127.0.0.1:{port}"):
                await serve_asgi(hello, host="127.0.0.1", port=port, bind_error=BusyPort)
        gc.collect()  # an unclosed socket would warn here, and the filter makes it fail


async def test_it_serves_and_reports_where():
    heard = []
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(lambda task_status: serve_asgi(
            hello, host="127.0.0.1", port=0, bind_error=BusyPort, on_listening=heard.append,
            task_status=task_status))
        assert heard == [(host, port)]
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        reply = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some():
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200") and b"hi" in reply
        nursery.cancel_scope.cancel()
