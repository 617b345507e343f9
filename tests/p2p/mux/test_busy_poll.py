"""Busy polling after writes: the spinner runs for its window, then sleeps."""

import time

import trio
import trio.testing

from p2p.mux import Mux, MuxConfig
from p2p.mux._scheduling import BusyPoller


async def wait_until(condition, *, limit_s=5.0):
    """Poll ``condition`` on real time, bounded (the spinner works in real time)."""
    deadline = time.perf_counter() + limit_s
    while not condition():
        assert time.perf_counter() < deadline, "condition not reached in time"
        await trio.sleep(0.001)


async def test_the_spinner_polls_after_a_write_and_sleeps_after_its_window():
    poller = BusyPoller()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        await trio.testing.wait_all_tasks_blocked()
        assert not poller.spinning and poller.spins == 0  # idle: nothing spins

        poller.note_sent(0.02)
        await wait_until(lambda: poller.spins > 0)
        await wait_until(lambda: not poller.spinning)  # the window ran out
        spins = poller.spins
        await trio.sleep(0.05)
        assert poller.spins == spins  # asleep until the next write
        nursery.cancel_scope.cancel()


async def test_a_received_answer_stops_the_spinner_early():
    poller = BusyPoller()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poller.run)
        poller.note_sent(60.0)
        await wait_until(lambda: poller.spins > 0)
        poller.note_received()
        await wait_until(lambda: not poller.spinning)
        nursery.cancel_scope.cancel()


def test_busy_polling_is_off_by_default():
    assert MuxConfig().busy_poll_s == 0


async def test_a_mux_with_the_default_config_runs_no_spinner():
    left_stream, _right_stream = trio.testing.memory_stream_pair()
    left = Mux(left_stream)
    async with trio.open_nursery() as nursery:
        await nursery.start(left.run)
        assert left._poller is None
        nursery.cancel_scope.cancel()


async def test_a_mux_with_busy_polling_off_runs_no_spinner():
    left_stream, right_stream = trio.testing.memory_stream_pair()
    polling = MuxConfig(busy_poll_s=0.0005)
    left = Mux(left_stream, config=MuxConfig(busy_poll_s=0))
    right = Mux(right_stream, config=polling)
    async with trio.open_nursery() as nursery:
        await nursery.start(left.run)
        await nursery.start(right.run)
        listener = right.listen("p")
        channel = await left.open_channel("p")
        peer = await listener.accept()
        await channel.send(b"hello")
        assert await peer.receive() == b"hello"
        assert left._poller is None and right._poller is not None
        # Every mux of the run shares one poller (one spinner per process).
        third = Mux(trio.testing.memory_stream_pair()[0], config=polling)
        await nursery.start(third.run)
        assert third._poller is right._poller
        nursery.cancel_scope.cancel()


def test_a_negative_or_huge_busy_poll_window_is_refused():
    import pytest

    from p2p.mux import MuxUsageError

    for bad in (-0.001, 5.0):
        with pytest.raises(MuxUsageError) as info:
            MuxConfig(busy_poll_s=bad)
        assert info.value.code == "BAD_CONFIG"
