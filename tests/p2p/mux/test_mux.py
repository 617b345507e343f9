"""The mux trio driver over in-memory streams (autojump clock) and real TCP."""


from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from p2p.errors import RemoteProtocolError
from p2p.mux import (
    ChannelBroken,
    ChannelClosed,
    ChannelRejected,
    ChannelStream,
    Mux,
    MuxConfig,
    MuxProtocolError,
    MuxUsageError,
)
from p2p.mux._frames import (
    Accept,
    Close,
    Credit,
    Data,
    FrameDecoder,
    MuxCredit,
    Open,
    encode_frame,
)
from tests.p2p.mux_pairs import WrappedStream, running_mux_pair, send_and_collect

SMALL = MuxConfig(initial_window_bytes=1024, max_message_bytes=512, max_send_buffer_bytes=4096)


# ---------------------------------------------------------------------------
# Driver


async def test_open_accept_and_messages_flow_both_ways(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(5):
        listener = right.listen("echo")
        async with trio.open_nursery() as nursery:
            accepted = []

            async def accept():
                accepted.append(await listener.accept())

            nursery.start_soon(accept)
            ch = await left.open_channel("echo", b"id")
        peer = accepted[0]
        assert (peer.protocol, peer.id) == ("echo", b"id")
        await ch.send(b"ping")
        assert await peer.receive() == b"ping"
        await peer.send(b"pong")
        assert await ch.receive() == b"pong"
        stats = ch.statistics()
        assert (stats.messages_sent, stats.bytes_sent, stats.bytes_received) == (1, 4, 4)


async def test_symmetric_open_yields_one_paired_channel_on_each_side(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(5):
        got = {}

        async def open_on(name, mux):
            got[name] = await mux.open_channel("sym", b"k")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_on, "l", left)
            nursery.start_soon(open_on, "r", right)
        await got["l"].send(b"a")
        await got["r"].send(b"b")
        assert await got["r"].receive() == b"a"
        assert await got["l"].receive() == b"b"
        assert left.statistics().channels == right.statistics().channels == 1


async def test_open_of_an_unknown_protocol_is_rejected_with_its_code(mux_pair, autojump_clock):
    left, _right = mux_pair
    with trio.fail_after(5):
        with pytest.raises(ChannelRejected) as info:
            await left.open_channel("nobody-listens")
        assert info.value.code == "UNKNOWN_PROTOCOL"
        # the name is free again
        with pytest.raises(ChannelRejected):
            await left.open_channel("nobody-listens")


async def test_duplicate_local_open_is_refused(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(5):
        right.listen("p")
        await left.open_channel("p", b"x")
        with pytest.raises(MuxUsageError) as info:
            await left.open_channel("p", b"x")
        assert info.value.code == "DUPLICATE_CHANNEL"


async def test_table_bound_rejects_remote_opens_with_too_many_channels(nursery, autojump_clock):
    config = MuxConfig(max_channels=2)
    async with running_mux_pair(nursery, config=config) as (left, right):
        with trio.fail_after(5):
            right.listen("p")
            await left.open_channel("p", b"1")
            await left.open_channel("p", b"2")
            with pytest.raises(MuxUsageError) as local:
                await left.open_channel("p", b"3")
            assert local.value.code == "TOO_MANY_CHANNELS"
        # the right side is full too: its opens are refused locally
        with pytest.raises(MuxUsageError):
            await right.open_channel("p", b"9")


async def test_a_slow_reader_holds_its_sender_at_the_window_while_other_channels_flow(
    nursery, autojump_clock
):
    async with running_mux_pair(nursery, config=SMALL) as (left, right):
        with trio.fail_after(10):
            listener = right.listen("p")
            slow_tx = await left.open_channel("p", b"slow")
            slow_rx = await listener.accept()
            fast_tx = await left.open_channel("p", b"fast")
            fast_rx = await listener.accept()
            sent = 0

            async def flood():
                nonlocal sent
                while True:
                    await slow_tx.send(b"s" * 100)
                    sent += 100

            async with trio.open_nursery() as inner:
                inner.start_soon(flood)
                await trio.testing.wait_all_tasks_blocked()
                # the fast channel still works, many times over its own window
                for i in range(50):
                    await fast_tx.send(b"f" * 200)
                    assert await fast_rx.receive() == b"f" * 200, i
                await trio.testing.wait_all_tasks_blocked()
                buffered = slow_rx.statistics().buffered_bytes
                assert buffered <= SMALL.initial_window_bytes
                assert sent <= SMALL.initial_window_bytes
                assert slow_tx.statistics().send_credit_bytes < 100 + 64
                # reading releases the sender
                before = sent
                for _ in range(20):
                    await slow_rx.receive()
                await trio.testing.wait_all_tasks_blocked()
                assert sent > before
                assert slow_rx.statistics().buffered_bytes <= SMALL.initial_window_bytes
                inner.cancel_scope.cancel()


async def _raw_peer(mux_config=SMALL):
    """A Mux on one end of a memory stream, the raw other end for the test."""
    mux_stream, raw = trio.testing.memory_stream_pair()
    return Mux(mux_stream, config=mux_config, name="under-test"), raw


async def _read_frames(raw, decoder, count):
    frames = []
    while len(frames) < count:
        frames.extend(decoder.feed(await raw.receive_some(65536)))
    return frames


async def test_a_peer_sending_beyond_its_credit_ends_the_mux_with_credit_exceeded(
    nursery, autojump_clock
):
    mux, raw = await _raw_peer()
    await nursery.start(mux.run)
    with trio.fail_after(5):
        listener = mux.listen("p")
        await raw.send_all(encode_frame(Open(7, "p", b"", 1 << 20)))
        decoder = FrameDecoder(1 << 20)
        budget, accept = await _read_frames(raw, decoder, 2)
        assert budget == MuxCredit(SMALL.receive_budget_bytes)  # always the first frame
        assert isinstance(accept, Accept) and accept.channel == 7
        ch = await listener.accept()
        ours = accept.remote_channel
        # exactly the window is fine (a message costs its length + 64)...
        await raw.send_all(encode_frame(Data(ours, b"x" * 448)) * 2)
        # ... one byte more is not
        await raw.send_all(encode_frame(Data(ours, b"y")))
        reason = await mux.wait_closed()
        assert isinstance(reason, MuxProtocolError) and isinstance(reason, RemoteProtocolError)
        assert reason.code == "CREDIT_EXCEEDED"
        assert await ch.receive() == b"x" * 448  # what arrived within credit is readable
        assert await ch.receive() == b"x" * 448
        with pytest.raises(ChannelBroken) as info:
            await ch.receive()
        assert info.value.code == "CREDIT_EXCEEDED"
        assert await raw.receive_some(100) == b""  # the mux closed the stream


async def test_a_message_for_an_unknown_channel_ends_the_mux(nursery, autojump_clock):
    mux, raw = await _raw_peer()
    await nursery.start(mux.run)
    with trio.fail_after(5):
        await raw.send_all(encode_frame(Data(3, b"who?")))
        reason = await mux.wait_closed()
        assert isinstance(reason, MuxProtocolError) and reason.code == "UNKNOWN_CHANNEL"


async def test_garbage_bytes_end_the_mux_with_a_remote_protocol_error(nursery, autojump_clock):
    mux, raw = await _raw_peer()
    await nursery.start(mux.run)
    with trio.fail_after(5):
        await raw.send_all(b"\x02\x7f\x00")
        reason = await mux.wait_closed()
        assert isinstance(reason, RemoteProtocolError)
        assert reason.code == "UNKNOWN_FRAME_TYPE"


async def test_credit_frames_are_batched_per_half_window(nursery, autojump_clock):
    mux, raw = await _raw_peer()
    await nursery.start(mux.run)
    with trio.fail_after(5):
        listener = mux.listen("p")
        await raw.send_all(encode_frame(Open(0, "p", b"", 1 << 20)))
        decoder = FrameDecoder(1 << 20)
        _budget, accept = await _read_frames(raw, decoder, 2)
        ch = await listener.accept()
        # 100-byte messages cost 164 bytes of credit: CREDIT goes back once
        # half the window less 64 (448 bytes) is consumed, i.e. every 3 messages.
        await raw.send_all(encode_frame(Data(accept.remote_channel, b"z" * 100)) * 6)
        for _ in range(5):
            await ch.receive()
        await trio.testing.wait_all_tasks_blocked()
        frames = await _read_frames(raw, decoder, 2)
        # channel credit after 3 messages; mux credit after 4 (half a window)
        assert frames == [Credit(0, 3 * 164), MuxCredit(4 * 164)]
        await ch.receive()
        assert await _read_frames(raw, decoder, 1) == [Credit(0, 3 * 164)]


async def test_stream_end_breaks_pending_receives_and_opens(nursery, autojump_clock):
    mux, raw = await _raw_peer()
    await nursery.start(mux.run)
    with trio.fail_after(5):
        listener = mux.listen("p")
        await raw.send_all(encode_frame(Open(0, "p", b"", 1 << 20)))
        ch = await listener.accept()
        errors = []

        async def receive():
            with pytest.raises(ChannelBroken) as info:
                await ch.receive()
            errors.append(info.value)

        async def open_():
            with pytest.raises(ChannelBroken) as info:
                await mux.open_channel("q")
            errors.append(info.value)

        async with trio.open_nursery() as inner:
            inner.start_soon(receive)
            inner.start_soon(open_)
            await trio.testing.wait_all_tasks_blocked()
            await raw.aclose()
        assert {e.code for e in errors} == {"STREAM_EOF"}
        assert isinstance(errors[0], trio.BrokenResourceError)
        with pytest.raises(ChannelBroken):
            await ch.send(b"late")


class _BreakingStream(WrappedStream):
    """Wraps a stream; receive_some raises BrokenResourceError once ``broken`` is set."""

    def __init__(self, inner):
        super().__init__(inner)
        self.broken = trio.Event()

    async def receive_some(self, max_bytes=None):
        result = []
        async with trio.open_nursery() as nursery:

            async def read():
                result.append(await self.inner.receive_some(max_bytes))
                nursery.cancel_scope.cancel()

            async def wait_broken():
                await self.broken.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(read)
            nursery.start_soon(wait_broken)
        if result:
            return result[0]
        raise trio.BrokenResourceError("link died")


async def test_a_broken_stream_breaks_pending_receives_with_stream_broken(
    nursery, autojump_clock
):
    a, b = trio.testing.memory_stream_pair()
    breaking = _BreakingStream(a)
    left, right = Mux(breaking), Mux(b)
    await nursery.start(left.run)
    await nursery.start(right.run)
    with trio.fail_after(5):
        right.listen("p")
        ch = await left.open_channel("p")
        async with trio.open_nursery() as inner:

            async def receive():
                with pytest.raises(ChannelBroken) as info:
                    await ch.receive()
                assert info.value.code == "STREAM_BROKEN"
                assert isinstance(info.value.__cause__, ChannelBroken)
                assert isinstance(info.value.__cause__.__cause__, trio.BrokenResourceError)

            inner.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            breaking.broken.set()
        reason = await right.wait_closed()
        assert reason.code in {"STREAM_EOF", "STREAM_BROKEN"}


async def test_end_of_a_direction_and_remote_close(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(5):
        listener = right.listen("p")
        ch = await left.open_channel("p")
        peer = await listener.accept()
        await ch.send(b"last")
        await ch.send_eof()
        await ch.send_eof()  # idempotent
        with pytest.raises(ChannelClosed):
            await ch.send(b"more")
        assert await peer.receive() == b"last"
        with pytest.raises(trio.EndOfChannel):
            await peer.receive()
        await peer.send(b"reply still flows")
        assert await ch.receive() == b"reply still flows"
        await peer.aclose()
        with pytest.raises(trio.EndOfChannel):
            await ch.receive()
        with pytest.raises(ChannelClosed):
            await peer.receive()
        await ch.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert left.statistics().channels == right.statistics().channels == 0


async def test_remote_close_breaks_a_sender_waiting_for_credit(nursery, autojump_clock):
    async with running_mux_pair(nursery, config=SMALL) as (left, right):
        with trio.fail_after(5):
            listener = right.listen("p")
            ch = await left.open_channel("p")
            peer = await listener.accept()
            sent = 0
            with pytest.raises(ChannelBroken) as info:
                for _ in range(100):
                    if sent == 2:  # the window is full now: the next send waits
                        nursery.start_soon(peer.aclose)
                    await ch.send(b"x" * 448)  # costs 512 bytes of credit
                    sent += 1
            assert sent == 2
            assert info.value.code == "REMOTE_CLOSED"


async def test_cancelled_open_is_closed_when_the_answer_arrives(nursery, autojump_clock):
    mux, raw = await _raw_peer()
    await nursery.start(mux.run)
    decoder = FrameDecoder(1 << 20)
    with trio.fail_after(5):
        with trio.CancelScope() as scope:
            nursery.start_soon(_cancel_after_open_is_sent, scope, raw, decoder)
            await mux.open_channel("p", b"k")
        assert scope.cancelled_caught
        assert mux.statistics().channels == 1  # still reserved until answered
        with pytest.raises(MuxUsageError):
            await mux.open_channel("p", b"k")
        await raw.send_all(encode_frame(Accept(0, 42, 1 << 20)))
        (close,) = await _read_frames(raw, decoder, 1)
        assert close == Close(42)
        await raw.send_all(encode_frame(Close(0)))
        await trio.testing.wait_all_tasks_blocked()
        assert mux.statistics().channels == 0
        assert mux.closed_reason is None


async def _cancel_after_open_is_sent(scope, raw, decoder):
    budget, open_frame = await _read_frames(raw, decoder, 2)
    assert budget == MuxCredit(SMALL.receive_budget_bytes)
    assert open_frame == Open(0, "p", b"k", SMALL.initial_window_bytes)
    scope.cancel()


async def test_closing_the_mux_closes_channels_and_the_peer_sees_it_broken(
    mux_pair, autojump_clock
):
    left, right = mux_pair
    with trio.fail_after(5):
        listener = right.listen("p")
        ch = await left.open_channel("p")
        peer = await listener.accept()
        await ch.send(b"flushed before close")
        async with trio.open_nursery() as inner:

            async def receive():
                with pytest.raises(ChannelClosed):
                    await ch.receive()

            inner.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            await left.aclose()
        assert isinstance(await left.wait_closed(), ChannelClosed)
        assert await peer.receive() == b"flushed before close"
        with pytest.raises(ChannelBroken):
            await peer.receive()
        with pytest.raises(ChannelClosed):
            await left.open_channel("p")


async def test_messages_flow_over_a_lockstep_stream_pair(nursery, autojump_clock):
    async with running_mux_pair(
        nursery, make_streams=trio.testing.lockstep_stream_pair, config=SMALL
    ) as (left, right):
        with trio.fail_after(30):
            listener = right.listen("p")
            chans = [await left.open_channel("p", bytes([i])) for i in range(3)]
            peers = [await listener.accept() for _ in range(3)]
            rng = random.Random(1)
            payloads = [[rng.randbytes(rng.randrange(0, 500)) for _ in range(30)]
                        for _ in chans]

            async def pump(tx, rx, msgs):
                assert await send_and_collect(tx, rx, msgs) == msgs

            async with trio.open_nursery() as inner:
                for i in range(3):
                    inner.start_soon(pump, chans[i], peers[i], payloads[i])
                    inner.start_soon(pump, peers[i], chans[i], payloads[i][::-1])


async def test_bulk_and_small_messages_over_real_tcp(nursery):
    with trio.fail_after(20):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        accepted = trio.Event()
        server_side = []

        async def handler(stream):
            mux = Mux(stream, name="tcp-server")
            server_side.append(mux)
            accepted.set()
            await mux.run()

        await nursery.start(trio.serve_listeners, handler, listeners)
        client = Mux(await trio.open_tcp_stream("127.0.0.1", port), name="tcp-client")
        await nursery.start(client.run)
        await accepted.wait()
        server = server_side[0]
        listener = server.listen("bulk")
        ch = await client.open_channel("bulk")
        peer = await listener.accept()
        block = bytes(range(256)) * 1024  # 256 KiB
        total = 0

        async def send():
            for _ in range(40):
                await ch.send(block)
            await ch.send_eof()

        nursery.start_soon(send)
        while True:
            try:
                msg = await peer.receive()
            except trio.EndOfChannel:
                break
            assert msg == block
            total += len(msg)
        assert total == 40 * len(block)
        await client.aclose()
        assert isinstance(await server.wait_closed(), ChannelBroken)


async def test_channel_stream_passes_trios_half_closeable_stream_checks(
    mux_pair, autojump_clock
):
    left, right = mux_pair
    listener = right.listen("stream")
    counter = iter(range(1_000_000))

    async def stream_maker():
        name = str(next(counter)).encode()
        async with trio.open_nursery() as inner:
            got = []

            async def accept():
                got.append(await listener.accept())

            inner.start_soon(accept)
            ch = await left.open_channel("stream", name)
        return ChannelStream(ch), got[0].as_stream()

    with trio.fail_after(60):
        await trio.testing.check_half_closeable_stream(stream_maker, None)


def test_config_refuses_a_window_smaller_than_two_messages():
    with pytest.raises(MuxUsageError) as info:
        MuxConfig(initial_window_bytes=1000, max_message_bytes=501)
    assert info.value.code == "BAD_CONFIG"
    with pytest.raises(MuxUsageError):
        MuxConfig(max_channels=0)


async def test_oversized_sends_are_refused_locally(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(5):
        right.listen("p")
        ch = await left.open_channel("p")
        with pytest.raises(MuxUsageError) as info:
            await ch.send(b"x" * (ch.max_message_bytes + 1))
        assert info.value.code == "MESSAGE_TOO_LARGE"


async def test_a_cancelled_mux_aclose_still_closes_it(mux_pair, autojump_clock):
    left, _right = mux_pair
    with trio.fail_after(5):
        with trio.CancelScope() as scope:
            scope.cancel()
            await left.aclose()
        reason = await left.wait_closed()
        assert isinstance(reason, ChannelClosed) and reason.code == "MUX_CLOSED"


async def test_send_nowait_would_block_without_credit_and_keeps_order(nursery, autojump_clock):
    async with running_mux_pair(nursery, config=SMALL) as (left, right):
        with trio.fail_after(5):
            listener = right.listen("p")
            ch = await left.open_channel("p")
            peer = await listener.accept()
            ch.send_nowait(b"a" * 448)  # each costs 448 + 64: two fill the window
            ch.send_nowait(b"b" * 448)
            with pytest.raises(trio.WouldBlock):
                ch.send_nowait(b"")
            assert await peer.receive() == b"a" * 448
            assert await peer.receive() == b"b" * 448
            await trio.testing.wait_all_tasks_blocked()
            ch.send_nowait(b"c")
            assert await peer.receive() == b"c"


async def test_a_secret_stream_error_from_below_breaks_the_mux_with_its_code(
    nursery, autojump_clock
):
    from p2p.errors import RemoteProtocolError as StreamError

    class FailingStream(trio.abc.Stream):
        async def send_all(self, data):
            await trio.lowlevel.checkpoint()

        async def wait_send_all_might_not_block(self):
            await trio.lowlevel.checkpoint()

        async def receive_some(self, max_bytes=None):
            await trio.lowlevel.checkpoint()
            raise StreamError("bad tag", code="DECRYPT_FAILED")

        async def aclose(self):
            await trio.lowlevel.checkpoint()

    mux = Mux(FailingStream())
    await nursery.start(mux.run)
    with trio.fail_after(5):
        reason = await mux.wait_closed()
        assert isinstance(reason, ChannelBroken) and reason.code == "DECRYPT_FAILED"


async def test_listening_before_run_catches_the_peers_first_open(nursery, autojump_clock):
    a, b = trio.testing.memory_stream_pair()
    left, right = Mux(a), Mux(b)
    listener = right.listen("early")
    await nursery.start(left.run)
    with trio.fail_after(5):
        async with trio.open_nursery() as inner:
            inner.start_soon(right.run)
            ch = await left.open_channel("early")
            peer = await listener.accept()
            await ch.send(b"first")
            assert await peer.receive() == b"first"
            await right.aclose()
        await left.aclose()
