"""QuicPath: one QUIC stream between two UDP sockets on 127.0.0.1, as a trio stream."""

import os
import socket

import pytest
import trio

from p2p.punch._quic import QuicPath


def _udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


async def _pair(nursery: trio.Nursery) -> tuple[QuicPath, QuicPath]:
    a, b = _udp(), _udp()
    server = QuicPath(b, a.getsockname(), is_client=False)
    client = QuicPath(a, b.getsockname(), is_client=True)
    nursery.start_soon(server.run)
    await nursery.start(client.run)
    return client, server


async def _drain(stream: trio.abc.Stream, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = await stream.receive_some(65536)
        assert chunk
        got += chunk
    return bytes(got)


async def test_bytes_cross_both_ways_whole_and_in_order_then_eof():
    # Each more than aioquic's 1 MiB flow-control windows (so both ends must
    # grant more credit mid-transfer), and of different sizes.
    up, down = os.urandom(3 << 19), os.urandom(5 << 18)
    results = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            client, server = await _pair(nursery)

            async def side(name, stream, data, size):
                async with trio.open_nursery() as inner:
                    inner.start_soon(stream.send_all, data)
                    results[name] = await _drain(stream, size)

            async with trio.open_nursery() as both:
                both.start_soon(side, "server", server, down, len(up))
                both.start_soon(side, "client", client, up, len(down))
            await client.send_eof()
            assert await server.receive_some() == b""
            await client.aclose()
            await server.aclose()
            nursery.cancel_scope.cancel()
    assert results["server"] == up and results["client"] == down


async def test_datagrams_from_another_address_are_ignored():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            client, server = await _pair(nursery)
            stranger = _udp()
            stranger.sendto(os.urandom(1200), server._std.getsockname())
            await client.send_all(b"hello")
            assert await server.receive_some() == b"hello"
            stranger.close()
            await client.aclose()
            await server.aclose()
            nursery.cancel_scope.cancel()


async def test_a_silent_peer_fails_the_handshake_in_bounded_time(autojump_clock):
    a, b = _udp(), _udp()
    client = QuicPath(a, b.getsockname(), is_client=True)
    with pytest.raises(OSError, match="no QUIC handshake"):
        await client.run(handshake_timeout_s=3)
    b.close()
    await client.aclose()


@pytest.mark.parametrize("driver", ["running", "cancelled"])
async def test_a_close_right_after_sending_still_delivers_everything(driver):
    """The sender closes as soon as its last bytes are queued (a beam that finished
    first): what the peer has not acknowledged yet is still delivered, whether the
    path's driver still runs or was cancelled with its nursery first."""
    # Twice aioquic's 1 MiB flow-control windows: send_all waits on the peer's
    # window updates, and the close still finds bytes unacknowledged.
    data = os.urandom(2 << 20)
    with trio.fail_after(60):
        async with trio.open_nursery() as outer:
            a, b = _udp(), _udp()
            server = QuicPath(b, a.getsockname(), is_client=False)
            client = QuicPath(a, b.getsockname(), is_client=True)
            outer.start_soon(server.run)
            received = trio.Event()
            got = bytearray()

            async def drain() -> None:
                while chunk := await server.receive_some(65536):
                    got.extend(chunk)
                received.set()

            outer.start_soon(drain)
            async with trio.open_nursery() as inner:
                await inner.start(client.run)
                await client.send_all(data)
                await client.send_eof()
                assert client._lingering()  # queued, not all acknowledged yet
                if driver == "running":
                    await client.aclose()  # its run() feeds the acknowledgements
                inner.cancel_scope.cancel()
            await client.aclose()  # "cancelled": it feeds them itself; else a no-op
            await received.wait()
            await server.aclose()
            outer.cancel_scope.cancel()
    assert bytes(got) == data
