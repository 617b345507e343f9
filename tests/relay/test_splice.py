"""The forwarder on its own, over TCP on 127.0.0.1."""

import os
import socket
import struct

import pytest
import trio

from relay import SpliceEnd, splice

MIB = 1024 * 1024


async def tcp_pair(listener: trio.SocketListener) -> tuple[trio.SocketStream, trio.SocketStream]:
    """(client end, server end) of one loopback TCP connection."""
    client = await trio.open_tcp_stream(*listener.socket.getsockname()[:2])
    served = await listener.accept()
    return client, served


@pytest.fixture
async def two_connections():
    """Two connections: the relay splices their server ends; tests drive the client ends."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    async with listener:
        (left, relay_left), (right, relay_right) = [await tcp_pair(listener) for _ in range(2)]
        yield left, right, relay_left, relay_right
        for stream in (left, right, relay_left, relay_right):
            await stream.aclose()


async def test_a_mebibyte_each_way_with_half_close_counts_every_byte(two_connections):
    left, right, relay_left, relay_right = two_connections
    to_right, to_left = os.urandom(MIB), os.urandom(MIB)
    counted = []
    result = {}

    async def send(stream, data):
        await stream.send_all(data)
        await stream.send_eof()

    async def receive(name, stream):
        chunks = []
        while chunk := await stream.receive_some():
            chunks.append(chunk)
        result[name] = b"".join(chunks)

    async def forward():
        result["end"] = await splice(
            relay_left, relay_right, idle_timeout_s=30, max_read=lambda: 256 * 1024,
            on_bytes=counted.append,
        )

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(forward)
            nursery.start_soon(send, left, to_right)
            nursery.start_soon(send, right, to_left)
            nursery.start_soon(receive, "right", right)
            nursery.start_soon(receive, "left", left)
    assert result["right"] == to_right and result["left"] == to_left
    assert result["end"] is SpliceEnd.CLOSED
    assert sum(counted) == 2 * MIB
    assert max(counted) <= 256 * 1024  # one bounded chunk at a time


async def test_a_reset_socket_ends_both_directions_as_broken(two_connections):
    left, right, relay_left, relay_right = two_connections
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            result = {}

            async def forward():
                result["end"] = await splice(
                    relay_left, relay_right, idle_timeout_s=30, max_read=lambda: 65536,
                    on_bytes=lambda size: None,
                )

            nursery.start_soon(forward)
            await left.send_all(b"hello")
            assert await right.receive_some() == b"hello"
            # An abortive close (RST) from the left peer.
            left.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            await left.aclose()
            await right.send_all(b"x" * 100_000)  # the relay's write towards left fails
        assert result["end"] is SpliceEnd.BROKEN
    await relay_right.aclose()  # as the server does once the splice returns
    with trio.fail_after(5):
        try:
            assert await right.receive_some() == b""
        except trio.BrokenResourceError:
            pass


async def test_a_silent_pair_ends_at_the_idle_timeout_on_real_sockets(two_connections):
    _, _, relay_left, relay_right = two_connections
    with trio.fail_after(10):
        started = trio.current_time()
        end = await splice(relay_left, relay_right, idle_timeout_s=0.2,
                           max_read=lambda: 65536, on_bytes=lambda size: None)
    assert end is SpliceEnd.IDLE
    assert trio.current_time() - started >= 0.2


async def test_an_observer_sees_every_chunk_with_its_direction(two_connections):
    left, right, relay_left, relay_right = two_connections
    seen = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: splice(
                relay_left, relay_right, idle_timeout_s=30, max_read=lambda: 65536,
                on_bytes=lambda size: None, observer=lambda d, chunk: seen.append((d, chunk)),
            ))
            await left.send_all(b"ping")
            assert await right.receive_some() == b"ping"
            await right.send_all(b"pong")
            assert await left.receive_some() == b"pong"
            nursery.cancel_scope.cancel()
    assert seen == [(0, b"ping"), (1, b"pong")]
