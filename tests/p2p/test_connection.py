"""Connections (secret stream + channels) over real TCP on 127.0.0.1."""

import pytest
import trio

from p2p.connection import dial_tcp
from p2p.errors import HandshakeError
from p2p.host import serve_tcp
from p2p.net import SocketNetwork

from .helpers import ALICE, BOB, MALLORY, ClosingResponder, wait_until


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


@pytest.mark.parametrize("closes", [1, 2])
async def test_a_handshake_closed_unread_is_dialled_again_on_a_new_socket(closes):
    """A daemon under a flood closes a handshake it has not read yet (the
    dialler looked silent for a moment): a new socket is worth it."""
    responder = ClosingResponder(BOB, closes=closes)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listener = await SocketNetwork().listen_stream("127.0.0.1", 0)
            await nursery.start(responder.serve, listener)
            connection = await dial_tcp("127.0.0.1", listener.local_address[1], ALICE,
                                        BOB.public_key)
            assert connection.remote_public_key == BOB.public_key
            await wait_until(lambda: responder.completed == 1)  # its side of the proof
            assert responder.accepted == closes + 1
            await connection.stream.aclose()
            nursery.cancel_scope.cancel()


async def test_dialling_again_after_closes_is_bounded_and_a_wrong_key_is_not_retried():
    responder = ClosingResponder(BOB, closes=3)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            listener = await SocketNetwork().listen_stream("127.0.0.1", 0)
            port = listener.local_address[1]
            await nursery.start(responder.serve, listener)
            with pytest.raises(HandshakeError) as closed:
                await dial_tcp("127.0.0.1", port, ALICE, BOB.public_key)
            assert closed.value.code == "CLOSED"
            assert responder.accepted == 3  # the first socket and two more
            with pytest.raises(HandshakeError) as wrong:
                await dial_tcp("127.0.0.1", port, ALICE, MALLORY.public_key)
            assert wrong.value.code == "KEY_MISMATCH"
            assert responder.accepted == 4  # the key is proved wrong once, not again
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


def freezable_stream_pair():
    """A memory stream pair whose link can be frozen: bytes stop, no FIN is seen."""
    import trio.testing

    frozen = trio.Event()

    def one_way():
        send, receive = trio.testing.memory_stream_one_way_pair()

        async def pump():
            if not frozen.is_set():
                trio.testing.memory_stream_pump(send, receive)

        send.send_all_hook = pump
        return send, receive

    left_send, right_receive = one_way()
    right_send, left_receive = one_way()
    left = trio.StapledStream(left_send, left_receive)
    right = trio.StapledStream(right_send, right_receive)
    return left, right, frozen


async def test_keepalives_hold_an_idle_connection_and_a_silent_peer_is_dropped(autojump_clock):
    from p2p.connection import Connection, ConnectionConfig
    from p2p.noise import SecretStreamConfig

    from .helpers import secret_stream_pair

    config = ConnectionConfig(
        stream=SecretStreamConfig(keepalive_interval_s=5, idle_timeout_s=12)
    )
    left_raw, right_raw, frozen = freezable_stream_pair()
    left_stream, right_stream = await secret_stream_pair(
        lambda: (left_raw, right_raw), config=config.stream
    )
    left, right = Connection(left_stream, config=config), Connection(right_stream, config=config)
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            await nursery.start(left.run)
            await nursery.start(right.run)
            await trio.sleep(100)  # quiet, but keep-alives flow both ways
            assert left.mux.closed_reason is None
            assert right.mux.closed_reason is None
            went_silent = trio.current_time()
            frozen.set()  # the link dies silently: no more bytes, no FIN
            reason = await left.mux.wait_closed()
            assert reason.code == "IDLE_TIMEOUT"
            assert trio.current_time() - went_silent <= 12 + 1
            nursery.cancel_scope.cancel()
