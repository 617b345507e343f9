"""In-memory streams pass trio's generic half-closeable stream checks, with and without latency."""

import itertools

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from trio.testing import MockClock, check_half_closeable_stream

from p2p.net import MemoryInternet, memory_stream_pair
from tests.examples import examples


def makers(**options):
    async def stream_maker():
        return memory_stream_pair(**options)

    async def clogged_stream_maker():
        left, right = memory_stream_pair(**{**options, "capacity_bytes": 16})
        # Fill both directions so the next send_all blocks until the other reads.
        await left.send_all(b"\x00" * 16)
        await right.send_all(b"\x00" * 16)
        return left, right

    return stream_maker, clogged_stream_maker


async def test_a_memory_stream_pair_passes_the_half_closeable_stream_checks():
    await check_half_closeable_stream(*makers())


async def test_a_memory_stream_pair_with_latency_passes_them_on_the_autojump_clock(autojump_clock):
    await check_half_closeable_stream(*makers(latency_s=0.01, reverse_latency_s=0.03))


async def test_streams_between_two_memory_hosts_pass_the_checks(autojump_clock):
    internet = MemoryInternet(latency_s=0.002)
    server = internet.host("127.0.0.2")
    client = internet.host("127.0.0.3")
    listener = await server.listen_stream("127.0.0.2", 0)

    async def stream_maker():
        async with trio.open_nursery() as nursery:
            accepted = []

            async def accept():
                accepted.append(await listener.accept())

            nursery.start_soon(accept)
            dialed = await client.open_stream(listener.local_address)
        return dialed, accepted[0][0]

    await check_half_closeable_stream(stream_maker, None)


async def test_bytes_arrive_after_the_latency_of_their_direction(autojump_clock):
    left, right = memory_stream_pair(latency_s=0.05, reverse_latency_s=0.2)
    with trio.fail_after(5):
        start = trio.current_time()
        await left.send_all(b"ping")
        assert trio.current_time() == start  # a send does not wait for the wire
        assert await right.receive_some() == b"ping"
        assert trio.current_time() - start == pytest.approx(0.05)
        start = trio.current_time()
        await right.send_all(b"pong")
        await right.send_eof()
        assert await left.receive_some() == b"pong"
        assert trio.current_time() - start == pytest.approx(0.2)
        assert await left.receive_some() == b""


async def test_a_full_buffer_holds_the_sender_until_the_reader_takes_bytes(autojump_clock):
    left, right = memory_stream_pair(capacity_bytes=10)
    sent = trio.Event()

    async def send():
        await left.send_all(b"a" * 25)
        sent.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            await trio.testing.wait_all_tasks_blocked()
            assert not sent.is_set()
            got = b""
            while len(got) < 25:
                got += await right.receive_some(7)
        assert got == b"a" * 25 and sent.is_set()


async def test_abort_breaks_both_ends():
    left, right = memory_stream_pair()
    await left.send_all(b"unread")
    right.abort()
    with pytest.raises(trio.BrokenResourceError):
        await left.receive_some()
    with pytest.raises(trio.BrokenResourceError):
        await left.send_all(b"x")
    with pytest.raises(trio.ClosedResourceError):
        await right.receive_some()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        memory_stream_pair(latency_s=-1)
    with pytest.raises(ValueError):
        memory_stream_pair(capacity_bytes=0)


@settings(max_examples=examples(150), deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=300), max_size=20),
    read_sizes=st.lists(st.integers(1, 200), min_size=1, max_size=30),
    latency_s=st.floats(0, 2),
    capacity_bytes=st.integers(1, 500),
)
def test_bytes_arrive_whole_in_order_never_before_their_latency_then_eof(
    chunks, read_sizes, latency_s, capacity_bytes
):
    async def main():
        left, right = memory_stream_pair(latency_s=latency_s, capacity_bytes=capacity_bytes)
        #: (end offset, when its send_all started), one per send.
        sends = []

        async def sender():
            offset = 0
            for chunk in chunks:
                offset += len(chunk)
                sends.append((offset, trio.current_time()))
                await left.send_all(chunk)
            await left.send_eof()

        got = bytearray()
        with trio.fail_after(10_000):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sender)
                reads = itertools.cycle(read_sizes)
                while data := await right.receive_some(next(reads)):
                    assert len(data) > 0
                    now = trio.current_time()
                    # The newest byte read was sent by a send that started
                    # at least latency_s ago.
                    end = len(got) + len(data)
                    started = next(s for e, s in sends if e >= end)
                    assert now >= started + latency_s - 1e-9
                    got += data
        assert bytes(got) == b"".join(chunks)
        assert await right.receive_some() == b""  # and stays at end of stream

    trio.run(main, clock=MockClock(autojump_threshold=0))
