"""The mux-wide receive budget: what one peer can make us buffer, over all channels."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.mux import ChannelBroken, Mux, MuxConfig, MuxCore, MuxProtocolError, MuxUsageError
from p2p.mux._frames import (
    MESSAGE_OVERHEAD_BYTES,
    Data,
    FrameDecoder,
    MuxCredit,
    Open,
    encode_frame,
)
from tests.examples import examples
from tests.p2p.mux_pairs import running_mux_pair, send_and_collect

OVERHEAD = MESSAGE_OVERHEAD_BYTES
#: 1 KiB windows; a budget of four windows.
BUDGETED = MuxConfig(
    initial_window_bytes=1024,
    max_message_bytes=512,
    max_send_buffer_bytes=4096,
    receive_budget_bytes=4096,
)
#: The smallest budget a 1 KiB window allows: two windows.
TIGHT = MuxConfig(
    initial_window_bytes=1024,
    max_message_bytes=512,
    max_send_buffer_bytes=4096,
    receive_budget_bytes=2048,
)
#: Messages of this size cost 512 bytes of credit: two fill a 1 KiB window.
HALF = 512 - OVERHEAD


def transfer(src: MuxCore, dst: MuxCore) -> list:
    return dst.receive_data(src.data_to_send())


def _core_pair(config: MuxConfig, n: int):
    a, b = MuxCore(config), MuxCore(config)
    b.listen("p")
    txs = [a.open("p", i.to_bytes(2, "big")) for i in range(n)]
    transfer(a, b)
    transfer(b, a)
    rxs = [b.accept_nowait("p") for _ in range(n)]
    return a, b, txs, rxs


# ---------------------------------------------------------------------------
# Config


def test_config_needs_a_budget_of_two_windows():
    MuxConfig(initial_window_bytes=1024, max_message_bytes=512, receive_budget_bytes=2048)
    with pytest.raises(MuxUsageError) as info:
        MuxConfig(initial_window_bytes=1024, max_message_bytes=512, receive_budget_bytes=2047)
    assert info.value.code == "BAD_CONFIG"
    with pytest.raises(MuxUsageError):  # a window must hold a few message overheads
        MuxConfig(initial_window_bytes=128, max_message_bytes=64)
    with pytest.raises(MuxUsageError):
        MuxConfig(initial_window_bytes=4 << 20, max_message_bytes=512 << 10)  # budget left at 4 MiB
    with pytest.raises(MuxUsageError):
        MuxConfig(receive_budget_bytes=0)
    assert MuxConfig().receive_budget_bytes >= 2 * MuxConfig().initial_window_bytes


# ---------------------------------------------------------------------------
# Core


def test_core_announces_its_budget_first_and_sends_nothing_before_the_peers():
    core = MuxCore(TIGHT)
    first = FrameDecoder(1 << 16).feed(core.data_to_send())
    assert first == [MuxCredit(TIGHT.receive_budget_bytes)]
    assert core.send_budget == 0
    a, b, (tx,), (rx,) = _core_pair(TIGHT, 1)
    assert a.send_budget == b.send_budget == TIGHT.receive_budget_bytes
    a.send_message(tx, b"x" * 100)
    assert a.send_budget == TIGHT.receive_budget_bytes - 100 - OVERHEAD
    assert tx.send_credit == 1024 - 100 - OVERHEAD  # the same cost as channel credit
    transfer(a, b)
    assert b.buffered_bytes == 100 + OVERHEAD == b.buffered_bytes_peak == rx.inbox_bytes
    assert b.receive_message(rx) == b"x" * 100
    assert b.buffered_bytes == 0 and b.buffered_bytes_peak == 100 + OVERHEAD


def test_core_channels_share_the_budget_though_each_has_credit_left():
    a, _b, txs, _rxs = _core_pair(TIGHT, 4)
    budget = TIGHT.receive_budget_bytes
    per_message = 512 + OVERHEAD
    sent = 0
    for tx in txs:  # 4 windows of 1 KiB, but 2 KiB of budget
        while a.can_send(tx, 512):
            a.send_message(tx, b"m" * 512)
            sent += 1
    assert sent == budget // per_message == 3
    assert txs[-1].send_credit == 1024  # channel credit was not the limit
    with pytest.raises(MuxUsageError) as info:
        a.send_message(txs[-1], b"m" * 512)
    assert info.value.code == "NO_CREDIT"


def test_core_budget_returns_in_batches_as_the_application_consumes():
    a, b, (tx,), (rx,) = _core_pair(TIGHT, 1)
    batch = TIGHT.receive_budget_bytes >> 3
    a.send_message(tx, b"1" * 100)
    a.send_message(tx, b"2" * 100)
    transfer(a, b)
    before = a.send_budget
    b.receive_message(rx)  # 164 < batch: nothing sent yet
    transfer(b, a)
    assert a.send_budget == before
    b.receive_message(rx)  # 328 >= batch (but below the channel's half window)
    assert FrameDecoder(1 << 16).feed(b.data_to_send()) == [MuxCredit(2 * (100 + OVERHEAD))]
    assert batch <= 2 * (100 + OVERHEAD) < 512 - OVERHEAD


def test_core_closing_or_discarding_gives_the_budget_back():
    a, b, (tx1, tx2), (rx1, _rx2) = _core_pair(TIGHT, 2)
    cost = 300 + OVERHEAD
    a.send_message(tx1, b"a" * 300)
    a.send_message(tx2, b"b" * 300)
    transfer(a, b)
    assert b.buffered_bytes == 2 * cost
    b.close(rx1)  # its inbox is dropped
    assert b.buffered_bytes == cost
    a.send_message(tx1, b"c" * 300)  # reaches a closed channel: discarded
    transfer(a, b)
    assert b.buffered_bytes == cost
    transfer(b, a)  # CLOSE, and the budget of the two dropped messages
    assert a.send_budget == TIGHT.receive_budget_bytes - cost


def test_core_a_peer_beyond_the_budget_is_a_protocol_error():
    _a, b, _txs, _rxs = _core_pair(TIGHT, 4)
    wire = b"".join(encode_frame(Data(rx_local, b"z" * 400)) for rx_local in (0, 1, 2, 3) * 2)
    # 8 messages of 400 bytes fit the four channels' windows but not the budget
    with pytest.raises(MuxProtocolError) as info:
        b.receive_data(wire)
    assert info.value.code == "BUDGET_EXCEEDED"
    assert b.buffered_bytes <= TIGHT.receive_budget_bytes


@settings(max_examples=examples(60), deadline=None)
@given(
    n=st.integers(4, 24),
    seed=st.integers(0, 2**32),
    unread=st.integers(0, 3),
    sizes=st.sampled_from([(0, 40), (0, 512), (256, 512)]),
)
def test_core_every_channel_read_finishes_whatever_the_budget(n, seed, unread, sizes):
    """Random senders and readers on channels whose windows add up to up to 12
    budgets; ``unread`` channels are never read while their peers keep writing,
    and the budget is the documented (unread + 2) windows (2 at least). Buffered
    bytes never exceed the budget and every channel that is read gets all its
    messages in order."""
    rng = random.Random(seed)
    config = MuxConfig(
        initial_window_bytes=1024,
        max_message_bytes=512,
        receive_budget_bytes=1024 * max(2, unread + 2),
    )
    a, b, txs, rxs = _core_pair(config, n)
    budget = config.receive_budget_bytes
    lo, hi = sizes
    todo = [[rng.randbytes(rng.randint(lo, hi)) for _ in range(rng.randint(1, 30))] for _ in txs]
    for i in range(unread):  # never read; their peers keep writing, tiny messages too
        todo[i] = [rng.randbytes(rng.choice((0, 1, 30, 300))) for _ in range(200)]
    expected = [list(msgs) for msgs in todo]
    got: list[list[bytes]] = [[] for _ in rxs]
    readers = range(unread, n)
    for _step in range(5000):
        for i in rng.sample(range(n), n):
            while todo[i] and a.can_send(txs[i], len(todo[i][0])):
                a.send_message(txs[i], todo[i].pop(0))
        transfer(a, b)
        assert b.buffered_bytes <= budget
        for i in readers:
            for _ in range(rng.randint(0, 3)):
                msg = b.receive_message(rxs[i])
                if msg is not None:
                    got[i].append(msg)
        transfer(b, a)
        if all(not todo[i] and not rxs[i].inbox for i in readers):
            break
    else:
        pytest.fail("channels stopped making progress")
    assert b.buffered_bytes_peak <= budget
    for i in readers:
        assert got[i] == expected[i]
    for _ in range(4):  # the readers are done: the unread channels fill their windows
        for i in range(unread):
            while todo[i] and a.can_send(txs[i], len(todo[i][0])):
                a.send_message(txs[i], todo[i].pop(0))
        transfer(a, b)
        transfer(b, a)
    for i in range(unread):
        assert rxs[i].inbox_bytes > 1024 - (300 + OVERHEAD)  # it holds (nearly) its window
    assert b.buffered_bytes <= budget
    assert b.failed is None and a.failed is None


# ---------------------------------------------------------------------------
# Driver


async def _open_many(left: Mux, right: Mux, n: int):
    listener = right.listen("p")
    txs, rxs = [], []
    async with trio.open_nursery() as nursery:

        async def accept_all():
            for _ in range(n):
                rxs.append(await listener.accept())

        nursery.start_soon(accept_all)
        for i in range(n):
            txs.append(await left.open_channel("p", i.to_bytes(2, "big")))
    rxs.sort(key=lambda ch: ch.id)
    return txs, rxs


async def test_many_channels_written_but_not_read_stay_within_the_budget(nursery, autojump_clock):
    # 5 x 500 B per channel overfill its 1 KiB window; more messages only
    # repeat the same blocked sends.
    n, count, size = 100, 5, 500
    async with running_mux_pair(nursery, config=BUDGETED) as (left, right):
        with trio.fail_after(60):
            txs, rxs = await _open_many(left, right, n)
            sent = [0] * n

            async def flood(i):
                for k in range(count):
                    await txs[i].send(bytes([k]) * size)
                    sent[i] += 1

            async def read_all(i):
                for k in range(count):
                    assert await rxs[i].receive() == bytes([k]) * size

            async with trio.open_nursery() as inner:
                for i in range(n):
                    inner.start_soon(flood, i)
                await trio.testing.wait_all_tasks_blocked()
                # 100 windows of 1 KiB would hold 100 KiB; the budget holds 4 KiB.
                stats = right.statistics()
                assert stats.receive_budget_bytes == BUDGETED.receive_budget_bytes
                assert stats.buffered_bytes <= BUDGETED.receive_budget_bytes
                assert stats.buffered_bytes_peak <= BUDGETED.receive_budget_bytes
                held = sum(rx.statistics().buffered_bytes for rx in rxs)
                assert stats.buffered_bytes == held == sum(sent) * (size + OVERHEAD)
                assert stats.buffered_bytes + size + OVERHEAD > BUDGETED.receive_budget_bytes
                assert left.statistics().budget_waits > 0
                assert left.statistics().send_budget_bytes < size + OVERHEAD
                # once the application reads, every channel finishes
                for i in range(n):
                    inner.start_soon(read_all, i)
            assert sent == [count] * n
            assert right.statistics().buffered_bytes == 0
            assert right.statistics().buffered_bytes_peak <= BUDGETED.receive_budget_bytes


async def test_a_channel_nobody_reads_does_not_block_the_others(nursery, autojump_clock):
    async with running_mux_pair(nursery, config=TIGHT) as (left, right):
        with trio.fail_after(60):
            txs, rxs = await _open_many(left, right, 9)
            stuck_tx, _stuck_rx = txs[0], rxs[0]

            async def flood():  # empty messages: the costliest to hold per byte
                while True:
                    await stuck_tx.send(b"")

            async def transfer_(tx, rx, seed):
                rng = random.Random(seed)
                msgs = [rng.randbytes(rng.randint(0, 512)) for _ in range(60)]
                assert await send_and_collect(tx, rx, msgs) == msgs

            async with trio.open_nursery() as inner:
                inner.start_soon(flood)
                await trio.testing.wait_all_tasks_blocked()
                assert rxs[0].statistics().buffered_bytes == 1024  # a full window: 16 messages
                async with trio.open_nursery() as others:
                    for i in range(1, 9):  # each moves ~19 KiB through a 2 KiB budget
                        others.start_soon(transfer_, txs[i], rxs[i], i)
                assert right.statistics().buffered_bytes_peak <= TIGHT.receive_budget_bytes
                inner.cancel_scope.cancel()


async def test_many_channels_all_progress_with_a_budget_far_below_their_windows(
    nursery, autojump_clock
):
    n = 40  # 40 windows of 1 KiB over a 2 KiB budget, both directions at once
    async with running_mux_pair(nursery, config=TIGHT) as (left, right):
        with trio.fail_after(120):
            txs, rxs = await _open_many(left, right, n)
            done = []

            async def pump(tx, rx, seed):
                rng = random.Random(seed)
                msgs = [rng.randbytes(rng.choice((0, 1, 100, 512))) for _ in range(30)]

                async def send():
                    for m in msgs:
                        await tx.send(m)
                    await tx.send_eof()

                async with trio.open_nursery() as both:
                    both.start_soon(send)
                    got = []
                    while True:
                        if rng.random() < 0.3:
                            await trio.sleep(rng.random() / 100)  # slow, uneven readers
                        try:
                            got.append(await rx.receive())
                        except trio.EndOfChannel:
                            break
                assert got == msgs
                done.append(seed)

            async with trio.open_nursery() as inner:
                for i in range(n):
                    inner.start_soon(pump, txs[i], rxs[i], i)
                    inner.start_soon(pump, rxs[i], txs[i], 1000 + i)
            assert len(done) == 2 * n
            for mux in (left, right):
                stats = mux.statistics()
                assert stats.buffered_bytes == 0
                assert stats.buffered_bytes_peak <= TIGHT.receive_budget_bytes


async def test_a_sender_waiting_for_budget_is_woken_by_a_remote_close(nursery, autojump_clock):
    async with running_mux_pair(nursery, config=TIGHT) as (left, right):
        with trio.fail_after(10):
            txs, rxs = await _open_many(left, right, 3)
            for tx in txs[:2]:  # fill the budget through two channels
                await tx.send(b"f" * HALF)
                await tx.send(b"f" * HALF)
            await trio.testing.wait_all_tasks_blocked()
            assert left.statistics().send_budget_bytes == 0
            assert txs[2].statistics().send_credit_bytes == 1024  # its own credit is untouched
            with pytest.raises(trio.WouldBlock):
                txs[2].send_nowait(b"w")
            errors = []

            async def send():
                with pytest.raises(ChannelBroken) as info:
                    await txs[2].send(b"w")
                errors.append(info.value)

            async with trio.open_nursery() as inner:
                inner.start_soon(send)
                await trio.testing.wait_all_tasks_blocked()
                assert left.statistics().budget_waits == 1
                await rxs[2].aclose()
            assert errors[0].code == "REMOTE_CLOSED"


async def test_closing_a_channel_with_unread_messages_frees_its_budget(nursery, autojump_clock):
    async with running_mux_pair(nursery, config=TIGHT) as (left, right):
        with trio.fail_after(10):
            txs, rxs = await _open_many(left, right, 3)
            await txs[0].send(b"a" * HALF)
            await txs[0].send(b"a" * HALF)
            await txs[2].send(b"c" * HALF)
            await trio.testing.wait_all_tasks_blocked()
            assert right.statistics().buffered_bytes == 3 * 512
            blocked = trio.Event()

            async def send_more():
                await txs[1].send(b"b" * HALF)
                await txs[1].send(b"b" * HALF)  # waits for the budget
                blocked.set()

            nursery.start_soon(send_more)
            await trio.testing.wait_all_tasks_blocked()
            assert not blocked.is_set()
            await rxs[0].aclose()
            await blocked.wait()
            assert await rxs[1].receive() == b"b" * HALF


async def test_a_raw_peer_that_ignores_the_budget_ends_the_mux(nursery, autojump_clock):
    mux_stream, raw = trio.testing.memory_stream_pair()
    mux = Mux(mux_stream, config=TIGHT, name="under-test")
    await nursery.start(mux.run)
    with trio.fail_after(5):
        mux.listen("p")
        decoder = FrameDecoder(1 << 16)
        await raw.send_all(b"".join(encode_frame(Open(i, "p", b"%d" % i, 1024)) for i in range(4)))
        frames = []
        while len(frames) < 5:
            frames.extend(decoder.feed(await raw.receive_some(65536)))
        assert frames[0] == MuxCredit(TIGHT.receive_budget_bytes)
        ours = [f.remote_channel for f in frames[1:]]
        # every message is within its channel's credit; together they exceed the budget
        await raw.send_all(b"".join(encode_frame(Data(c, b"x" * 400)) for c in ours * 2))
        reason = await mux.wait_closed()
        assert isinstance(reason, MuxProtocolError) and reason.code == "BUDGET_EXCEEDED"
        assert mux.statistics().buffered_bytes_peak <= TIGHT.receive_budget_bytes
