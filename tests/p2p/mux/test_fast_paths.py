"""Tests of the mux driver's fast paths: sender-written frames and push delivery."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from p2p.mux import ChannelBroken, ChannelClosed, Mux, MuxConfig
from p2p.mux._frames import Data, FrameDecoder
from tests.p2p.mux_pairs import WrappedStream, running_mux_pair

SMALL = MuxConfig(initial_window_bytes=1024, max_message_bytes=512, max_send_buffer_bytes=4096)


class _RecordingStream(WrappedStream):
    """Wraps a stream; records every ``send_all`` (its bytes and the calling task)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        super().__init__(inner)
        self.writes: list[tuple[bytes, trio.lowlevel.Task]] = []

    async def send_all(self, data):
        self.writes.append((bytes(data), trio.lowlevel.current_task()))
        await self.inner.send_all(data)



class _StuckStream(WrappedStream):
    """Wraps a stream; once ``stuck`` is set, ``send_all`` writes half and blocks
    until ``unstick`` is set, then writes the rest."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        super().__init__(inner)
        self.stuck = False
        self.blocked = trio.Event()
        self.unstick = trio.Event()

    async def send_all(self, data):
        if not self.stuck:
            await self.inner.send_all(data)
            return
        await self.inner.send_all(bytes(data[: len(data) // 2]))
        self.blocked.set()
        await self.unstick.wait()
        await self.inner.send_all(bytes(data[len(data) // 2 :]))



async def _paired_channel(left, right, protocol="p"):
    """Open ``protocol`` from left, accept it on right, let everything settle."""
    listener = right.listen(protocol)
    ch = await left.open_channel(protocol)
    peer = await listener.accept()
    await trio.testing.wait_all_tasks_blocked()
    return ch, peer


async def _pair_with(nursery, wrap, config=None):
    a, b = trio.testing.memory_stream_pair()
    wrapped = wrap(a)
    left, right = Mux(wrapped, config=config, name="left"), Mux(b, config=config, name="right")
    await nursery.start(left.run)
    await nursery.start(right.run)
    return wrapped, left, right


def _data_frames(writes) -> list[tuple[int, bytes]]:
    decoder = FrameDecoder(1 << 20)
    frames = []
    for data, _task in writes:
        frames.extend(decoder.feed(data))
    return [(f.channel, f.payload) for f in frames if isinstance(f, Data)]


async def test_a_lone_send_is_written_by_the_sending_task(nursery, autojump_clock):
    rec, left, right = await _pair_with(nursery, _RecordingStream)
    with trio.fail_after(5):
        ch, peer = await _paired_channel(left, right)
        before = len(rec.writes)
        await ch.send(b"hello")
        assert len(rec.writes) == before + 1
        assert rec.writes[-1][1] is trio.lowlevel.current_task()
        assert await peer.receive() == b"hello"


async def test_sends_from_many_tasks_in_one_pass_share_few_writes(nursery, autojump_clock):
    rec, left, right = await _pair_with(nursery, _RecordingStream)
    with trio.fail_after(5):
        ch, peer = await _paired_channel(left, right)
        before = len(rec.writes)
        async with trio.open_nursery() as senders:
            for i in range(20):
                senders.start_soon(ch.send, bytes([i]))
        got = sorted([await peer.receive() for _ in range(20)])
        assert got == [bytes([i]) for i in range(20)]
        # At most one lone fast-path write, its flush of what queued meanwhile,
        # and one batch by the writer task: never one write per message.
        assert len(rec.writes) - before <= 3


async def test_more_hint_leaves_the_frame_to_the_writer_task(nursery, autojump_clock):
    rec, left, right = await _pair_with(nursery, _RecordingStream)
    with trio.fail_after(5):
        ch, peer = await _paired_channel(left, right)
        await ch.send(b"batched", more=True)
        assert await peer.receive() == b"batched"
        assert rec.writes[-1][1] is not trio.lowlevel.current_task()


async def test_fast_path_writes_keep_the_queue_order_across_channels(nursery, autojump_clock):
    rec, left, right = await _pair_with(nursery, _RecordingStream, config=SMALL)
    queued: list[tuple[int, bytes]] = []
    send_message = left._core.send_message

    def recording_send_message(st, payload):
        send_message(st, payload)
        queued.append((st.remote, payload))

    left._core.send_message = recording_send_message  # type: ignore[method-assign]
    with trio.fail_after(60):
        listener = right.listen("p")
        chans = [await left.open_channel("p", bytes([i])) for i in range(4)]
        peers = [await listener.accept() for _ in range(4)]
        rng = random.Random(7)

        async def sender(i, ch):
            for j in range(40):
                await ch.send(bytes([i, j]) * rng.randrange(1, 100), more=rng.random() < 0.3)
                if rng.random() < 0.5:
                    await trio.lowlevel.checkpoint()

        async def receiver(i, peer):
            for j in range(40):
                msg = await peer.receive()
                assert msg[:2] == bytes([i, j])

        async with trio.open_nursery() as inner:
            for i in range(4):
                inner.start_soon(sender, i, chans[i])
                # Two tasks per channel: sends from several tasks keep their order.
                inner.start_soon(receiver, i, peers[i])
        assert len(queued) == 160
        # Every DATA frame reached the wire in exactly the order it was queued.
        assert _data_frames(rec.writes) == queued
        senders = {task for _data, task in rec.writes}
        assert len(senders) > 1  # both the writer task and senders wrote


async def _cancel_sender_while_its_write_is_blocked(stuck, ch):
    """Send on ``ch`` with the stream stuck and cancel the sender mid-write."""
    stuck.stuck = True
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as inner:

            async def cancel_when_blocked():
                await stuck.blocked.wait()
                scope.cancel()
                if stuck.release_after_cancel:
                    stuck.stuck = False
                    stuck.unstick.set()

            inner.start_soon(cancel_when_blocked)
            await trio.testing.wait_all_tasks_blocked()  # nothing else runnable
            await ch.send(b"x" * 100)
    return scope


async def test_cancelling_a_sender_does_not_cut_its_fast_path_write(nursery, autojump_clock):
    stuck, left, right = await _pair_with(nursery, _StuckStream)
    with trio.fail_after(5):
        ch, peer = await _paired_channel(left, right)
        stuck.release_after_cancel = True
        scope = await _cancel_sender_while_its_write_is_blocked(stuck, ch)
        assert scope.cancel_called
        # The write finished whole: the mux lives and the message arrived.
        assert left.closed_reason is None
        assert await peer.receive() == b"x" * 100
        await ch.send(b"after")
        assert await peer.receive() == b"after"


async def test_a_fast_path_write_blocked_too_long_ends_the_mux(nursery, autojump_clock):
    stuck, left, right = await _pair_with(nursery, _StuckStream)
    with trio.fail_after(60):
        ch, peer = await _paired_channel(left, right)
        stuck.release_after_cancel = False
        with pytest.RaisesGroup(
            pytest.RaisesExc(ChannelBroken, check=lambda exc: exc.code == "SEND_STALLED")
        ):
            await _cancel_sender_while_its_write_is_blocked(stuck, ch)
        reason = await left.wait_closed()
        assert isinstance(reason, ChannelBroken) and reason.code == "SEND_STALLED"
        with pytest.raises(ChannelBroken):
            await ch.send(b"after")
        # The peer sees the stream end rather than hanging.
        with pytest.raises(ChannelBroken):
            await peer.receive()


# ---------------------------------------------------------------------------
# Push delivery


async def test_pushed_messages_arrive_in_order_and_end_reaches_receive(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(10):
        listener = right.listen("p")
        ch = await left.open_channel("p")
        peer = await listener.accept()
        got: list[bytes] = []
        peer.set_message_handler(got.append)
        messages = [bytes([i % 256]) * 300 for i in range(200)]
        for m in messages:
            await ch.send(m)
        await ch.send_eof()
        with pytest.raises(trio.EndOfChannel):
            await peer.receive()  # with a handler, receive() only reports the end
        assert got == messages
        assert peer.statistics().buffered_bytes == 0


async def test_pushed_channel_with_a_small_window_never_stalls(nursery, autojump_clock):
    async with running_mux_pair(nursery, config=SMALL) as (left, right):
        with trio.fail_after(10):
            listener = right.listen("p")
            ch = await left.open_channel("p")
            peer = await listener.accept()
            got: list[bytes] = []
            peer.set_message_handler(got.append)
            for i in range(100):
                await ch.send(bytes([i]) * 400)  # 40 KB through a 1 KiB window
            await ch.send_eof()
            with pytest.raises(trio.EndOfChannel):
                await peer.receive()
            assert got == [bytes([i]) * 400 for i in range(100)]
            # Credit went back as the handler took messages.
            assert ch.statistics().send_credit_bytes > 0


async def test_buffered_messages_are_pushed_when_the_handler_is_set(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(5):
        listener = right.listen("p")
        ch = await left.open_channel("p")
        for i in range(5):
            await ch.send(bytes([i]))
        peer = await listener.accept()
        await trio.testing.wait_all_tasks_blocked()
        got: list[bytes] = []
        peer.set_message_handler(got.append)
        assert got == [bytes([i]) for i in range(5)]
        # Back to pull delivery.
        peer.set_message_handler(None)
        await ch.send(b"pulled")
        assert await peer.receive() == b"pulled"
        assert got == [bytes([i]) for i in range(5)]


async def test_a_burst_is_pushed_across_several_passes_in_order(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(5):
        listener = right.listen("p")
        ch = await left.open_channel("p")
        peer = await listener.accept()
        got: list[bytes] = []
        peer.set_message_handler(got.append)
        for i in range(100):
            ch.send_nowait(i.to_bytes(2, "big"))  # one write: one read on the peer
        await ch.send_eof()
        with pytest.raises(trio.EndOfChannel):
            await peer.receive()
        assert got == [i.to_bytes(2, "big") for i in range(100)]


async def test_a_failing_handler_closes_its_channel_only(mux_pair, autojump_clock):
    left, right = mux_pair
    with trio.fail_after(5):
        listener = right.listen("p")
        bad = await left.open_channel("p", b"bad")
        good = await left.open_channel("p", b"good")
        bad_peer = await listener.accept()
        good_peer = await listener.accept()

        def explode(msg: bytes) -> None:
            raise ValueError("handler bug")

        bad_peer.set_message_handler(explode)
        await bad.send(b"boom")
        with pytest.raises(ChannelClosed):
            await bad_peer.receive()
        with pytest.raises(ChannelBroken):
            while True:
                await bad.send(b"more")  # fails once the peer's CLOSE arrives
        await good.send(b"still up")
        assert await good_peer.receive() == b"still up"
        assert left.closed_reason is None and right.closed_reason is None


async def test_mux_end_is_reported_to_a_pushed_channels_receive(nursery, autojump_clock):
    async with running_mux_pair(nursery) as (left, right):
        with trio.fail_after(5):
            listener = right.listen("p")
            await left.open_channel("p")
            peer = await listener.accept()
            peer.set_message_handler(lambda msg: None)
            async with trio.open_nursery() as inner:

                async def wait_end():
                    with pytest.raises(ChannelBroken):
                        await peer.receive()

                inner.start_soon(wait_end)
                await trio.testing.wait_all_tasks_blocked()
                await left.aclose()
