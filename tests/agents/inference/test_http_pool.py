"""The agent's HTTP/1.1 pool against raw servers on real loopback sockets:
keep-alive reuse, a connection the server closed while idle, abandoned and
broken responses, and a server that speaks no HTTP at all."""

from __future__ import annotations

import functools
import socket
from contextlib import asynccontextmanager

import pytest
import trio

from agents.inference._forward import ModelClient
from agents.inference._http import HttpError, HttpPool
from contracts.inference import Usage
from p2p.rpc import RpcError

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def read_request(stream: trio.SocketStream, buffer: bytearray) -> bool:
    """Read one request (head plus its content-length body); False at EOF."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return False
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        data = await stream.receive_some(65536)
        if not data:
            return False
        rest += data
    del buffer[:]
    buffer += rest[length:]
    return True


@asynccontextmanager
async def raw_server(answer):
    """A TCP server calling ``answer(stream, index)`` per request; yields (port, stats)."""
    stats = {"connections": 0, "requests": 0}

    async def handle(stream: trio.SocketStream) -> None:
        stats["connections"] += 1
        buffer = bytearray()
        async with stream:
            while await read_request(stream, buffer):
                stats["requests"] += 1
                if await answer(stream, stats["requests"]) is False:
                    return

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0,
                                                          host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1], stats
        nursery.cancel_scope.cancel()


async def fetch(pool: HttpPool, body: bytes = b"{}") -> tuple[int, bytes]:
    async with pool.request("POST", "/v1/x", [("content-type", "application/json")],
                            body) as response:
        return response.status, await response.body(1 << 20)


async def test_connections_are_kept_alive_and_reused():
    async def answer(stream, index):
        await stream.send_all(OK)

    async with raw_server(answer) as (port, stats):
        pool = HttpPool("127.0.0.1", port)
        for _ in range(5):
            assert await fetch(pool) == (200, b"{}")
        assert stats == {"connections": 1, "requests": 5} and pool.opened == 1
        await pool.aclose()


async def test_an_idle_connection_the_server_closed_is_replaced_once():
    async def answer(stream, index):
        await stream.send_all(OK)
        return False  # close after every answer, as a server with no keep-alive

    async with raw_server(answer) as (port, stats):
        pool = HttpPool("127.0.0.1", port)
        for _ in range(3):
            assert await fetch(pool) == (200, b"{}")
        assert stats["connections"] == 3 and stats["requests"] == 3
        await pool.aclose()


async def test_chunked_bodies_stream_and_an_abandoned_response_closes_its_connection():
    async def answer(stream, index):
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                              b"transfer-encoding: chunked\r\n\r\n"
                              b"7\r\ndata: 1\r\n7\r\ndata: 2\r\n0\r\n\r\n")

    async with raw_server(answer) as (port, stats):
        pool = HttpPool("127.0.0.1", port)
        async with pool.request("POST", "/s", [], b"") as response:
            parts = [part async for part in response.iter_body()]
        assert b"".join(parts) == b"data: 1data: 2"
        async with pool.request("POST", "/s", [], b"") as response:
            pass  # not read: the connection's position is unknown, so it is closed
        assert await fetch(pool) == (200, b"data: 1data: 2")
        assert stats["connections"] == 2
        await pool.aclose()


@pytest.mark.parametrize("garbage", [
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
])
async def test_a_server_that_breaks_http_is_an_error_not_a_crash(garbage):
    async def answer(stream, index):
        await stream.send_all(garbage)
        return False

    async with raw_server(answer) as (port, _stats):
        pool = HttpPool("127.0.0.1", port)
        with pytest.raises(HttpError) as caught:
            await fetch(pool)
        assert caught.value.sent
        await pool.aclose()


async def test_nobody_listening_is_unavailable_and_nothing_was_sent():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ModelClient("127.0.0.1", port)
    with pytest.raises(RpcError) as caught:
        async for _frame in client.forward("/v1/completions", "application/json", b"{}"):
            pass
    assert caught.value.code == "UNAVAILABLE"
    await client.aclose()


async def test_a_silent_server_times_out(autojump_clock):
    async def answer(stream, index):
        await trio.sleep_forever()

    async with raw_server(answer) as (port, _stats):
        pool = HttpPool("127.0.0.1", port, read_timeout_s=30)
        with pytest.raises(HttpError, match="no answer for 30 s"):
            await fetch(pool)
        await pool.aclose()


def sse_answer(*events: bytes) -> bytes:
    body = b"".join(b"data: " + event + b"\n\n" for event in (*events, b"[DONE]"))
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"content-length: %d\r\n\r\n" % len(body)) + body


PIECES = (b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
          b'{"choices":[{"index":0,"delta":{"content":"a"}}]}',
          b'{"choices":[{"index":0,"delta":{"content":"b c"}}]}',
          b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}')
CHAT = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


async def test_a_stream_without_a_usage_chunk_is_billed_what_it_carried(caplog):
    """A server that ignores include_usage: the stream is not free."""
    async def answer(stream, index):
        await stream.send_all(sse_answer(*PIECES))

    async with raw_server(answer) as (port, _stats):
        client = ModelClient("127.0.0.1", port)
        frames = [frame async for frame in client.forward("/v1/chat/completions",
                                                          "application/json", CHAT)]
        await client.aclose()
    assert frames[-1].done and frames[-1].usage == Usage(completion_tokens=2, total_tokens=2)
    assert client.usage_missing == 1
    assert any(r.getMessage().startswith("inference.usage_missing") for r in caplog.records)


async def test_a_stream_nobody_asked_for_is_still_billed_by_its_usage_chunk():
    usage = b'{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}'

    async def answer(stream, index):
        await stream.send_all(sse_answer(*PIECES, usage))

    async with raw_server(answer) as (port, _stats):
        client = ModelClient("127.0.0.1", port)
        frames = [frame async for frame in client.forward(
            "/v1/chat/completions", "application/json", CHAT.replace(b"true", b"false"))]
        await client.aclose()
    assert frames[-1].usage == Usage(prompt_tokens=4, completion_tokens=2, total_tokens=6)
    assert b'"choices":[]' in b"".join(f.data for f in frames)  # not ours to strip
    assert client.usage_missing == 0
