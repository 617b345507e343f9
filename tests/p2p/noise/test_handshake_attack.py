"""Regression (critical): one unauthenticated packet killed a node.

``b"\\x20\\x00\\x00\\x00" + bytes(32)`` is a handshake frame holding a Noise
message 1 whose ephemeral key is 32 zero bytes. The responder's X25519 raised
``ValueError`` outside the handshake's error mapping; ``serve_tcp`` catches only
``HandshakeError``, so the server (``cosmicac up``, ``beam --listen``, ``db
serve``) exited with a traceback. Here the attack runs over real TCP on
127.0.0.1, and a proper client must still get served afterwards.
"""

from __future__ import annotations

from functools import partial

import pytest
import trio

from p2p.connection import dial_tcp
from p2p.errors import HandshakeError
from p2p.host import serve_tcp
from p2p.noise._wire import FrameType, pack_header

from ..helpers import ALICE, BOB

ATTACK = b"\x20\x00\x00\x00" + bytes(32)
#: The attack and its neighbours: other low-order keys, and a frame header alone.
ATTACKS = [
    ATTACK,
    pack_header(32, FrameType.HANDSHAKE) + b"\x01" + bytes(31),
    pack_header(32, FrameType.HANDSHAKE) + bytes.fromhex("ec" + "ff" * 30 + "7f"),
    pack_header(32, FrameType.HANDSHAKE) + bytes(31) + b"\x80",
    ATTACK + b"trailing junk after the frame",
]


async def echo(channel):
    async for message in channel:
        await channel.send(message)


async def send_raw_and_wait_for_close(port: int, data: bytes) -> None:
    """Send ``data`` from a plain TCP socket, then read until the server hangs up."""
    raw = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await raw.send_all(data)
        for _ in range(100):  # bounded: the server answers with a close, not data
            try:
                if not await raw.receive_some(4096):
                    return
            except trio.BrokenResourceError:
                return  # a reset is a close too
        raise AssertionError("the server kept talking to an attacker")
    finally:
        await raw.aclose()


async def round_trip(port: int, message: bytes) -> bytes:
    connection = await dial_tcp("127.0.0.1", port, ALICE, BOB.public_key)
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        channel = await connection.open_channel("echo")
        await channel.send(message)
        reply = await channel.receive()
        await connection.aclose()
        nursery.cancel_scope.cancel()
    return reply


async def test_a_zero_ephemeral_key_does_not_stop_serve_tcp():
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(serve_tcp, BOB, {"echo": echo})
            await send_raw_and_wait_for_close(port, ATTACK)
            assert await round_trip(port, b"still serving") == b"still serving"
            nursery.cancel_scope.cancel()


async def test_low_order_keys_and_trailing_junk_do_not_stop_serve_tcp():
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(serve_tcp, BOB, {"echo": echo})
            for attack in ATTACKS:
                await send_raw_and_wait_for_close(port, attack)
            # Several at once, interleaved with an honest client.
            async with trio.open_nursery() as attackers:
                for attack in ATTACKS:
                    attackers.start_soon(send_raw_and_wait_for_close, port, attack)
                assert await round_trip(port, b"amid attacks") == b"amid attacks"
            assert await round_trip(port, b"after attacks") == b"after attacks"
            nursery.cancel_scope.cancel()


async def test_a_dialer_answered_with_a_zero_key_gets_a_handshake_error():
    # The initiator's side of the same attack: a "server" that answers message 1
    # with a message 2 whose ephemeral key is zero.
    async def hostile_server(stream: trio.SocketStream) -> None:
        await stream.receive_some(4096)
        await stream.send_all(pack_header(200, FrameType.HANDSHAKE) + bytes(200))
        await stream.receive_some(4096)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, hostile_server, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            with pytest.raises(HandshakeError) as info:
                await dial_tcp("127.0.0.1", port, ALICE, BOB.public_key)
            assert info.value.code == "BAD_MESSAGE"
            nursery.cancel_scope.cancel()


async def test_the_zero_key_packet_through_a_relay_fails_only_that_relayed_handshake(nursery):
    # "A relayed target dies the same way through any relay": the attacker pairs
    # with the target, attaches as the dialer and sends the packet through.
    from p2p.relay import Role, accept_via_relay, attach, dial_via_relay, request_pair
    from tests.relay.helpers import control, reserve, start_relay

    from ..helpers import MALLORY

    _, address = await start_relay(nursery)
    with trio.fail_after(30):
        incoming = await reserve(nursery, await control(nursery, address, BOB))
        ticket = await request_pair(await control(nursery, address, MALLORY), BOB.public_key)
        failure = {}

        async def target() -> None:
            item = await incoming.receive()
            try:
                await accept_via_relay(address, item, BOB)
            except HandshakeError as exc:
                failure["error"] = exc

        async with trio.open_nursery() as inner:
            inner.start_soon(target)
            raw = await attach(address, ticket.token, role=Role.INITIATOR)
            await raw.send_all(ATTACK)
        await raw.aclose()
        assert failure["error"].code == "BAD_MESSAGE"

        # The same reservation still brings an honest dialer through.
        accepted = {}

        async def accept() -> None:
            accepted["connection"] = await accept_via_relay(address, await incoming.receive(), BOB)

        dialer_control = await control(nursery, address, ALICE)
        async with trio.open_nursery() as inner:
            inner.start_soon(accept)
            dialed = await dial_via_relay(dialer_control, address, ALICE, BOB.public_key)
        assert accepted["connection"].remote_public_key == ALICE.public_key
        await dialed.aclose()
        await accepted["connection"].aclose()
