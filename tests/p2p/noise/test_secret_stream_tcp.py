"""The secret stream over real TCP sockets on 127.0.0.1 (real time, bounded)."""

import hashlib
import os

import pytest
import trio
import trio.testing

from p2p.errors import ConnectionBroken
from p2p.noise import SecretStream

from ..helpers import ALICE, BOB

MIB = 1024 * 1024


async def tcp_secret_pair(nursery, *, via=None):
    """Return (initiator, responder) over TCP; `via(port)` may return a proxy port."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    accepted = trio.Event()
    result = {}

    async def accept_one():
        raw = await listeners[0].accept()
        result["responder"] = await SecretStream.responder(raw, BOB)
        await listeners[0].aclose()
        accepted.set()

    nursery.start_soon(accept_one)
    dial_port = await via(port) if via else port
    raw = await trio.open_tcp_stream("127.0.0.1", dial_port)
    initiator = await SecretStream.initiator(raw, ALICE, BOB.public_key)
    await accepted.wait()
    return initiator, result["responder"]


async def pump(stream, total, seed):
    digest = hashlib.sha256()
    block = hashlib.sha256(seed).digest() * 2048  # 64 KiB
    sent = 0
    while sent < total:
        piece = block[: min(len(block), total - sent)]
        await stream.send_all(piece)
        digest.update(piece)
        sent += len(piece)
    await stream.send_eof()
    return digest.hexdigest()


async def drain(stream):
    digest = hashlib.sha256()
    count = 0
    while data := await stream.receive_some():
        digest.update(data)
        count += len(data)
    return digest.hexdigest(), count


async def test_64_mib_flows_each_way_at_once_over_tcp():
    results = {}
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            left, right = await tcp_secret_pair(nursery)

            async def run(name, coro):
                results[name] = await coro

            nursery.start_soon(run, "left_sent", pump(left, 64 * MIB, b"left"))
            nursery.start_soon(run, "right_sent", pump(right, 64 * MIB, b"right"))
            nursery.start_soon(run, "right_got", drain(right))
            nursery.start_soon(run, "left_got", drain(left))
        await left.aclose()
        await right.aclose()
    assert results["right_got"] == (results["left_sent"], 64 * MIB)
    assert results["left_got"] == (results["right_sent"], 64 * MIB)


async def tampering_proxy(nursery, target_port, *, flip_at):
    """Forward one connection to `target_port`, flipping the byte at offset
    `flip_at` of the client-to-server direction."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def forward(source, sink, flip):
        offset = 0
        try:
            while data := await source.receive_some(65536):
                if flip is not None and offset <= flip < offset + len(data):
                    data = bytearray(data)
                    data[flip - offset] ^= 0x20
                    data = bytes(data)
                offset += len(data)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the other direction finished first and closed this socket
        finally:
            await trio.aclose_forcefully(sink)

    async def serve():
        client = await listeners[0].accept()
        await listeners[0].aclose()
        server = await trio.open_tcp_stream("127.0.0.1", target_port)
        async with trio.open_nursery() as inner:
            inner.start_soon(forward, client, server, flip_at)
            inner.start_soon(forward, server, client, None)

    nursery.start_soon(serve)
    return listeners[0].socket.getsockname()[1]


async def test_a_tampered_byte_on_the_wire_ends_the_stream():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            # The initiator's handshake bytes come first (~200); flip well after them.
            left, right = await tcp_secret_pair(
                nursery, via=lambda port: tampering_proxy(nursery, port, flip_at=5000)
            )
            payload = os.urandom(20_000)
            nursery.start_soon(left.send_all, payload)
            received = bytearray()
            with pytest.raises(ConnectionBroken) as info:
                while True:
                    data = await right.receive_some()
                    assert data, "the stream ended without reporting the tampering"
                    received += data
            assert info.value.code == "DECRYPT_FAILED"
            # Nothing from the tampered frame onwards was delivered.
            assert len(received) < 5000
            assert payload.startswith(bytes(received))
            await left.aclose()
            nursery.cancel_scope.cancel()


async def test_send_nowait_keeps_what_the_kernel_refused_and_flush_writes_it_in_order():
    async with trio.open_nursery() as nursery:
        initiator, responder = await tcp_secret_pair(nursery)
        block = os.urandom(64 * 1024)
        sent = hashlib.sha256()
        count = 0
        # The peer does not read yet: the socket buffers fill and one write
        # is taken only in part; then send_nowait refuses until flushed.
        for _ in range(4096):
            if not initiator.send_nowait(block):
                break
            sent.update(block)
            count += len(block)
        else:
            pytest.fail("the socket never filled")
        assert initiator.unflushed > 0

        async def flush_and_end():
            await initiator.flush()
            assert initiator.unflushed == 0
            await initiator.send_all(b"tail")
            await initiator.send_eof()

        nursery.start_soon(flush_and_end)
        sent.update(b"tail")
        digest, received = await drain(responder)
        assert (digest, received) == (sent.hexdigest(), count + 4)
        await initiator.aclose()
        await responder.aclose()


async def test_send_nowait_declines_when_it_cannot_write_at_once():
    left, right = trio.testing.memory_stream_pair()
    # Not a socket: the caller must use send_all.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(SecretStream.responder, right, BOB)
        stream = await SecretStream.initiator(left, ALICE, BOB.public_key)
        assert stream.send_nowait(b"x") is False
        nursery.cancel_scope.cancel()


async def test_send_nowait_to_a_reset_connection_raises_connection_lost():
    import socket
    import struct

    async with trio.open_nursery() as nursery:
        initiator, responder = await tcp_secret_pair(nursery)
        # The peer's socket goes away with a reset (linger 0), not a FIN.
        raw = responder.transport_stream.socket
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await responder.transport_stream.aclose()
        with pytest.raises(ConnectionBroken) as info:
            for _ in range(1000):
                if not initiator.send_nowait(b"x" * 1024):
                    await initiator.flush()
                await trio.lowlevel.checkpoint()
        assert info.value.code == "CONNECTION_LOST"
        with pytest.raises(ConnectionBroken):
            await initiator.send_all(b"more")
        await initiator.aclose()
