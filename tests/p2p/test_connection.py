"""Connections (secret stream + channels) over real TCP on 127.0.0.1."""

import pytest
import trio

from p2p.connection import dial_tcp, serve_tcp
from p2p.errors import HandshakeError

from .helpers import ALICE, BOB, MALLORY


async def echo(channel):
    async for message in channel:
        await channel.send(message)


async def explode(channel):
    await channel.receive()
    raise RuntimeError("handler bug")


async def test_a_channel_opened_at_once_after_connecting_is_served():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(serve_tcp, BOB, {"echo": echo})
            connection = await dial_tcp("127.0.0.1", port, ALICE, BOB.public_key)
            assert connection.remote_public_key == BOB.public_key
            await nursery.start(connection.run)
            channel = await connection.open_channel("echo")
            await channel.send(b"ping")
            assert await channel.receive() == b"ping"
            await connection.aclose()
            nursery.cancel_scope.cancel()


async def test_bad_handshakes_and_failing_handlers_do_not_stop_the_server():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(
                serve_tcp, BOB, {"echo": echo, "explode": explode}
            )
            with pytest.raises(HandshakeError) as info:
                await dial_tcp("127.0.0.1", port, ALICE, MALLORY.public_key)
            assert info.value.code == "KEY_MISMATCH"

            first = await dial_tcp("127.0.0.1", port, ALICE, BOB.public_key)
            await nursery.start(first.run)
            doomed = await first.open_channel("explode")
            await doomed.send(b"boom")
            with pytest.raises((trio.EndOfChannel, trio.BrokenResourceError)):
                await doomed.receive()
            # The same connection still serves its other channels.
            channel = await first.open_channel("echo")
            await channel.send(b"still here")
            assert await channel.receive() == b"still here"

            second = await dial_tcp("127.0.0.1", port, MALLORY, BOB.public_key)
            await nursery.start(second.run)
            channel = await second.open_channel("echo")
            await channel.send(b"hello")
            assert await channel.receive() == b"hello"
            await first.aclose()
            await second.aclose()
            nursery.cancel_scope.cancel()
