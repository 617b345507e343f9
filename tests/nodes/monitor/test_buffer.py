"""The sans-IO core of wrk-monitor: ring bounds, sequence numbers, filters, lag."""

from __future__ import annotations

import pytest

from contracts.monitor import APPLICATION, SYSTEM, make_record, record_size
from nodes.monitor._buffer import LogBuffer


def rec(i: int, *, job: str | None = "j-1", source: str = SYSTEM, text: str = "x"):
    return make_record(f"{text}{i}", service="wrk-ork", job_id=job, source=source, time_ns=i)


def test_sequence_numbers_rise_by_one_from_one():
    buf = LogBuffer()
    assert buf.append([]) == 0
    assert buf.append([rec(1), rec(2)]) == 2
    assert buf.append([rec(3)]) == 3
    assert [seq for seq, _ in buf.records()] == [1, 2, 3]
    assert buf.stats.received == 3


def test_ring_is_bounded_by_count_dropping_the_oldest():
    buf = LogBuffer(max_records=5)
    for i in range(12):
        buf.append([rec(i)])
    assert [seq for seq, _ in buf.records()] == [8, 9, 10, 11, 12]
    assert buf.stats.evicted == 7 and buf.stats.records == 5


def test_ring_is_bounded_by_bytes_but_keeps_the_newest_record():
    one = record_size(rec(0, text="y" * 1000))
    buf = LogBuffer(max_bytes=3 * one)
    buf.append([rec(i, text="y" * 1000) for i in range(10)])
    assert buf.stats.bytes <= 3 * one and buf.stats.records == 3
    huge = LogBuffer(max_bytes=10)
    huge.append([rec(0, text="z" * 5000)])
    assert huge.stats.records == 1  # never empty after an append


def test_follower_gets_the_snapshot_then_live_records_filtered():
    buf = LogBuffer()
    buf.append([rec(1), rec(2, job="j-2"), rec(3, source=APPLICATION), rec(4)])
    woken = []
    f = buf.follow(job_id="j-1", source=SYSTEM, since_ns=2, notify=lambda: woken.append(1))
    assert [r.time_ns for _, r in f.take(100)] == [4]
    buf.append([rec(5), rec(6, job="j-2"), rec(1)])  # time 1 is before since_ns
    assert woken == [1]
    assert [(s, r.time_ns) for s, r in f.take(100)] == [(5, 5)]
    buf.append([rec(7, job="j-2")])
    assert woken == [1]  # nothing for it, nobody woken
    assert buf.follow(snapshot=False).take(10) == []


def test_take_is_bounded_and_keeps_order():
    buf = LogBuffer()
    buf.append([rec(i) for i in range(10)])
    f = buf.follow()
    buf.append([rec(i) for i in range(10, 15)])
    got = f.take(4) + f.take(100)
    assert [s for s, _ in got] == list(range(1, 16))


def test_a_slow_follower_is_cut_off_without_slowing_the_rest():
    buf = LogBuffer(queue_records=10)
    slow = buf.follow()
    fast = buf.follow()
    for i in range(5):
        buf.append([rec(i * 3 + k) for k in range(3)])
        fast.take(100)
    assert slow.lagged and not fast.lagged
    assert buf.followers == 1 and buf.stats.followers_lagged == 1
    assert len(slow.take(100)) == 9  # what it held before the cut
    buf.append([rec(99)])
    assert slow.take(100) == []  # nothing more after the cut
    assert buf.stats.received == 16
    buf.unfollow(fast)
    buf.unfollow(fast)
    assert buf.followers == 0


def test_bounds_must_be_positive():
    with pytest.raises(ValueError):
        LogBuffer(max_records=0)
