"""Each job's records numbered from 1 with no gap, and ``logs.tail`` resuming after a
cursor: nothing missing, nothing twice, across a cut-off follower, a forgotten
counter and a restarted wrk-monitor."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.monitor import (
    PUSH,
    TAIL,
    Observability,
    PushBatch,
    Tail,
    TailBatch,
    decode_batch,
    encode_batch,
    format_cursor,
    make_record,
    parse_cursor,
)
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from p2p.rpc import RpcConfig, RpcError
from tests.examples import examples
from tests.p2p.helpers import wait_until

from .loki_server import start_loki
from .support import DAEMON, READER, connect, make_service, recs


def rec(job: str | None, i: int):
    return make_record(f"line {i}", service="wrk-ork", job_id=job, time_ns=i)


@settings(max_examples=examples(100), deadline=None)
@given(jobs=st.lists(st.sampled_from(["a", "b", "c", None]), max_size=200),
       ring=st.integers(1, 50), counters=st.integers(1, 3), cut=st.integers(0, 200))
def test_a_numbered_readers_snapshot_never_repeats_or_reorders_a_number(
        jobs, ring, counters, cut):
    """Whatever the ring and counter bounds forgot, a job's numbered snapshot is one
    stream's numbers, ascending; after a cursor of that stream, only later ones."""
    buf = LogBuffer(max_records=ring, max_job_counters=counters, epoch="e")
    given_numbers: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        buf.append([rec(job, i)])
    for job in ("a", "b", "c"):
        follower = buf.follow(job_id=job, numbered=True)
        numbers = [n for _, _, n in follower.take_numbered(10_000)]
        assert numbers == sorted(set(numbers)), numbers
        assert all(n >= 1 for n in numbers)
        given_numbers[job] = numbers
        stream = buf.job_stream(job)
        if numbers:
            assert stream is not None
            after = numbers[min(cut, len(numbers) - 1)]
            resumed = buf.follow(job_id=job, numbered=True, after=(stream, after))
            assert [n for _, _, n in resumed.take_numbered(10_000)] == \
                [n for n in numbers if n > after]
            other = buf.follow(job_id=job, numbered=True, after=("other.1", after))
            assert [n for _, _, n in other.take_numbered(10_000)] == numbers


def test_numbers_rise_by_one_per_job_from_one_and_the_stream_names_the_buffer():
    buf = LogBuffer(epoch="beef")
    buf.append([rec("a", 0), rec("b", 1), rec(None, 2), rec("a", 3)])
    buf.append([rec("a", 4)])
    follower = buf.follow(job_id="a", numbered=True)
    assert [(seq, n) for seq, _, n in follower.take_numbered(10)] == [(1, 1), (4, 2), (5, 3)]
    assert buf.job_stream("a") == "beef.1" and buf.job_stream("b") == "beef.2"
    assert buf.job_stream("never") is None
    with pytest.raises(ValueError, match="job_id"):
        buf.follow(numbered=True)


def test_a_forgotten_counter_begins_a_new_stream_and_hides_the_old_numbers():
    buf = LogBuffer(max_job_counters=1, epoch="e")
    buf.append([rec("a", 0), rec("a", 1)])
    old = buf.job_stream("a")
    buf.append([rec("b", 2)])  # "a"'s counter forgotten
    assert buf.job_stream("a") is None
    assert buf.follow(job_id="a", numbered=True).take_numbered(10) == []
    buf.append([rec("a", 3)])
    assert buf.job_stream("a") not in (None, old)
    assert [n for _, _, n in buf.follow(job_id="a", numbered=True).take_numbered(10)] == [1]


@pytest.mark.parametrize("cursor", ["", "e:1", "e.1", "E.1:1", "e.1:-1", "e.1:1:2",
                                    "e.1: 1", "g.1:1", "e." + "1" * 20 + ":1"])
def test_a_malformed_cursor_is_refused(cursor):
    with pytest.raises(ValueError, match="cursor"):
        parse_cursor(cursor)
    with pytest.raises(ValueError):
        Tail(job_id="j-1", after=cursor)


def test_a_tail_batch_with_numbers_out_of_order_is_refused():
    records = encode_batch([rec("a", 0), rec("a", 1)])
    TailBatch(records=records, stream="e.1", seqs=[1, 2])
    for seqs in ([2, 2], [3, 1], [0, 1]):
        with pytest.raises(ValueError, match="ascending"):
            TailBatch(records=records, stream="e.1", seqs=seqs)


async def _tail(reader, params: Tail, until: int) -> list[tuple[str, int, int]]:
    """(stream, number, time_ns) of each record until ``until`` records."""
    got: list[tuple[str, int, int]] = []
    async with reader.stream(TAIL, params) as items:
        async for item in items:
            records = decode_batch(item.records)
            assert len(records) == len(item.seqs)
            got += [(item.stream, n, r.time_ns) for n, r in zip(item.seqs, records,
                                                                 strict=True)]
            if len(got) >= until:
                return got
    return got


async def test_tail_gives_the_buffer_then_live_and_resumes_after_a_cursor(
        nursery, autojump_clock):
    service = make_service()
    async with (connect(nursery, service, DAEMON) as pusher,
                connect(nursery, service, READER) as reader):
        with trio.fail_after(10):
            await pusher.call(PUSH, PushBatch(records=encode_batch(
                recs(0, 5) + recs(100, 3, job="j-2"))))

            async def later() -> None:
                await trio.sleep(1)
                await pusher.call(PUSH, PushBatch(records=encode_batch(recs(5, 3))))

            nursery.start_soon(later)
            first = await _tail(reader, Tail(job_id="j-1"), 8)
            assert [n for _, n, _ in first] == list(range(1, 9))
            assert [t for _, _, t in first] == list(range(8))
            stream = first[0][0]
            assert {s for s, _, _ in first} == {stream}
            await pusher.call(PUSH, PushBatch(records=encode_batch(recs(8, 2))))
            resumed = await _tail(reader, Tail(job_id="j-1",
                                               after=format_cursor(stream, 6)), 4)
            assert [n for _, n, _ in resumed] == [7, 8, 9, 10]


async def test_a_cut_off_tail_resumes_from_its_cursor_with_nothing_lost(
        nursery, autojump_clock):
    service = make_service(queue_records=20)
    window = RpcConfig(stream_window_items=2)
    async with (connect(nursery, service, DAEMON) as pusher,
                connect(nursery, service, READER, config=window) as reader):
        with trio.fail_after(30):
            got: list[tuple[str, int, int]] = []
            with pytest.raises(RpcError) as caught:
                async with reader.stream(TAIL, Tail(job_id="j-1")) as items:
                    await pusher.call(PUSH, PushBatch(records=encode_batch(recs(0, 5))))
                    async for item in items:
                        got += [(item.stream, n, 0) for n in item.seqs]
                        if len(got) == 5:  # stop reading while 300 more come
                            for i in range(30):
                                await pusher.call(PUSH, PushBatch(records=encode_batch(
                                    recs(5 + i * 10, 10))))
            assert caught.value.code == "LAGGED"
            stream, last = got[-1][0], got[-1][1]
            rest = await _tail(reader, Tail(job_id="j-1",
                                            after=format_cursor(stream, last)), 305 - last)
            numbers = [n for _, n, _ in got] + [n for _, n, _ in rest]
            assert numbers == list(range(1, 306))  # contiguous: nothing missing or twice


async def test_a_restarted_monitors_tail_is_a_new_stream_from_its_first_record(
        nursery, autojump_clock):
    before = make_service()
    after = make_service()  # another epoch, an empty ring
    assert before.buffer.epoch != after.buffer.epoch
    async with (connect(nursery, before, DAEMON) as pusher,
                connect(nursery, before, READER) as reader):
        with trio.fail_after(10):
            await pusher.call(PUSH, PushBatch(records=encode_batch(recs(0, 3))))
            old = await _tail(reader, Tail(job_id="j-1"), 3)
    async with (connect(nursery, after, DAEMON) as pusher,
                connect(nursery, after, READER) as reader):
        with trio.fail_after(10):
            await pusher.call(PUSH, PushBatch(records=encode_batch(recs(3, 2))))
            new = await _tail(reader, Tail(job_id="j-1",
                                           after=format_cursor(old[-1][0], 3)), 2)
            assert [n for _, n, _ in new] == [1, 2] and new[0][0] != old[0][0]
            assert [t for _, _, t in new] == [3, 4]


# -- history from Loki: numbered by the cursors kept beside each line ----------------


@asynccontextmanager
async def _with_loki(nursery, loki, **buffer):
    """A monitor service whose records also go to ``loki`` (as the daemon wires it)."""
    from nodes.monitor.observability import ObservabilityHolder

    from .test_observability import FAST

    holder = ObservabilityHolder(Observability(loki_url=loki.url), origin="settings",
                                 pusher_options=FAST)
    await nursery.start(holder.run)
    service = MonitorService(LogBuffer(**buffer), pushers=[DAEMON], followers=[READER],
                             observability=holder, on_records=holder.offer)
    async with (connect(nursery, service, DAEMON) as pusher,
                connect(nursery, service, READER) as reader):
        yield service, pusher, reader


async def _push(pusher, records) -> None:
    await pusher.call(PUSH, PushBatch(records=encode_batch(records)))


async def test_records_gone_from_the_ring_come_back_from_loki_in_number_order(nursery):
    loki = await start_loki(nursery)
    with trio.fail_after(30):
        async with _with_loki(nursery, loki, max_records=5) as (service, pusher, reader):
            for start in range(0, 20, 4):
                await _push(pusher, recs(start, 4) + recs(100 + start, 1, job="j-2"))
            await wait_until(lambda: len(loki.entries()) == 25, limit_s=10)
            stream = service.buffer.job_stream("j-1")
            assert {m.get("cursor", "").rsplit(":", 1)[0] for m in loki.metadata()
                    if m} >= {stream}
            got = await _tail(reader, Tail(job_id="j-1"), 20)
            assert [n for _, n, _ in got] == list(range(1, 21))  # 16 from Loki, 4 held
            assert [t for _, _, t in got] == list(range(20))
            resumed = await _tail(reader, Tail(job_id="j-1",
                                               after=format_cursor(stream, 9)), 11)
            assert [n for _, n, _ in resumed] == list(range(10, 21))


async def test_a_restarted_monitor_gives_the_earlier_ones_history_first(nursery):
    loki = await start_loki(nursery)
    with trio.fail_after(30):
        async with _with_loki(nursery, loki) as (before, pusher, _):
            await _push(pusher, recs(0, 3))
            await wait_until(lambda: len(loki.entries()) == 3, limit_s=10)
            old = before.buffer.job_stream("j-1")
        async with _with_loki(nursery, loki) as (after, pusher, reader):
            await _push(pusher, recs(3, 2))
            new = after.buffer.job_stream("j-1")
            got = await _tail(reader, Tail(job_id="j-1"), 5)
            assert [(s, n) for s, n, _ in got] == [(old, 1), (old, 2), (old, 3),
                                                   (new, 1), (new, 2)]
            resumed = await _tail(reader, Tail(job_id="j-1", after=format_cursor(old, 2)), 3)
            assert [(s, n) for s, n, _ in resumed] == [(old, 3), (new, 1), (new, 2)]
            caught_up = await _tail_until_quiet(reader, Tail(
                job_id="j-1", after=format_cursor(new, 2)))
            assert caught_up == []  # nothing again: not Loki's, not the ring's


async def _tail_until_quiet(reader, params: Tail) -> list:
    """What a tail sends within a second (real time): nothing, when caught up."""
    got: list = []
    with trio.move_on_after(1):
        async with reader.stream(TAIL, params) as items:
            async for item in items:
                got += list(item.seqs)
    return got
