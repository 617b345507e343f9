"""The proxy's per-job sliding window, with time as a number the test moves: buckets slide
out after the window, latency lands in the right bucket, statuses stay bounded, reports
name routed idle jobs and forget stale ones; against a brute-force count (hypothesis);
and the reporter pushes the latest snapshot over an in-memory RPC channel, never queueing."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.monitor import (
    LATENCY_BOUNDS_MS,
    LATENCY_BUCKETS,
    MAX_STATUS_CODES,
    MetricsReport,
)
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.health import HealthBook
from nodes.monitor.service import MonitorService
from nodes.proxy_inference.health import HealthWindow
from nodes.proxy_inference.reporter import HealthReporter
from tests.examples import examples
from tests.nodes.monitor.support import connect

PROXY = b"\x07" * 32


def test_requests_slide_out_of_the_window_bucket_by_bucket():
    window = HealthWindow(window_s=60, bucket_s=5)
    window.record("j", 200, 100.0, error=False, first_byte_s=0.2, total_s=1.0)
    window.record("j", 502, 104.9, error=True)
    window.record("j", 200, 131.0, error=False, first_byte_s=0.04)
    seen = window.window("j", 131.0)
    assert (seen.requests, seen.errors) == (3, 1)
    # At 160 the window holds epochs 21..32: 100 s (epoch 20) has gone, 131 s not.
    later = window.window("j", 160.0)
    assert (later.requests, later.errors) == (1, 0)
    assert window.window("j", 200.0).requests == 0
    # Counters since start are not windowed.
    assert later.requests_total == {"200": 2, "502": 1}


def test_latency_lands_in_the_bucket_of_its_upper_bound():
    window = HealthWindow()
    for seconds in (0.010, 0.011, 0.5, 61.0):
        window.record("j", 200, 1.0, error=False, first_byte_s=seconds, total_s=seconds)
    figures = window.window("j", 1.0)
    counts = dict(enumerate(figures.first_byte_ms))
    assert counts[0] == 1  # 10 ms is within the first bound (inclusive)
    assert counts[1] == 1  # 11 ms: (10, 25]
    assert counts[LATENCY_BOUNDS_MS.index(500)] == 1
    assert counts[LATENCY_BUCKETS - 1] == 1  # past the last bound: +Inf
    assert figures.total_ms == figures.first_byte_ms


def test_a_slot_reused_after_a_gap_starts_from_zero():
    window = HealthWindow(window_s=10, bucket_s=5)
    window.record("j", 200, 0.0, error=True)
    window.record("j", 200, 10.0, error=False)  # same slot (epoch 2 % 2 == 0), new epoch
    figures = window.window("j", 10.0)
    assert (figures.requests, figures.errors) == (1, 0)


def test_many_statuses_are_lumped_by_class_within_the_bound():
    window = HealthWindow()
    for status in range(500, 540):
        window.record("j", status, 1.0, error=True)
    window.record("j", 999, 1.0, error=True)  # not an HTTP status: counted as 5xx
    statuses = window.window("j", 1.0).requests_total
    assert len(statuses) <= MAX_STATUS_CODES
    assert sum(statuses.values()) == 41 and statuses["5xx"] >= 30


def test_jobs_past_the_bound_are_dropped_and_counted():
    window = HealthWindow(max_jobs=2)
    for job in ("a", "b", "c"):
        window.record(job, 200, 1.0, error=False)
    assert window.statistics().jobs == 2 and window.statistics().dropped == 1


def test_a_report_names_busy_and_routed_jobs_and_forgets_the_rest():
    window = HealthWindow(window_s=10, bucket_s=5)
    window.record("old", 200, 0.0, error=False)
    window.record("busy", 200, 100.0, error=False)
    report = window.report(100.0, routed=["idle"])
    assert [j.job_id for j in report.jobs] == ["busy", "idle"]
    assert report.jobs[1].requests == 0 and report.window_s == 10
    assert window.statistics().jobs == 1  # "old" is neither busy nor routed: forgotten
    MetricsReport.model_validate(report.model_dump())  # within the contract


def test_a_window_that_is_not_whole_buckets_is_refused():
    for kw in ({"window_s": 7, "bucket_s": 5}, {"window_s": 0}, {"max_jobs": 0}):
        with pytest.raises(ValueError):
            HealthWindow(**kw)


events = st.lists(st.tuples(st.sampled_from(["a", "b"]),
                            st.floats(min_value=0, max_value=300, allow_nan=False),
                            st.sampled_from([200, 400, 502, 503]),
                            st.one_of(st.none(), st.floats(min_value=0, max_value=90))),
                  max_size=60)


@settings(max_examples=examples(150), deadline=None)
@given(events=events, now_extra=st.floats(min_value=0, max_value=120),
       proxies=st.integers(min_value=1, max_value=3), seed=st.randoms(use_true_random=False))
def test_windows_of_many_proxies_merge_to_the_window_of_all_their_requests(
        events, now_extra, proxies, seed):
    """Split requests at random over proxies; wrk-monitor's merge of their reports
    equals one window that saw them all, and that equals a brute-force count."""
    events = sorted(events, key=lambda e: e[1])
    now = (events[-1][1] if events else 0.0) + now_extra
    whole = HealthWindow(window_s=60, bucket_s=5)
    parts = [HealthWindow(window_s=60, bucket_s=5) for _ in range(proxies)]
    for job, at, status, first_byte in events:
        for window in (whole, seed.choice(parts)):
            window.record(job, status, at, error=status >= 500, first_byte_s=first_byte)
    book = HealthBook()
    for i, window in enumerate(parts):
        book.accept(bytes([i]) * 32, window.report(now), now=0.0)
    merged = book.merged(0.0)
    oldest = int(now // 5) - 11
    for job in ("a", "b"):
        mine = [e for e in events if e[0] == job and int(e[1] // 5) >= oldest]
        one = whole.window(job, now)
        assert one.requests == len(mine)
        assert one.errors == sum(e[2] >= 500 for e in mine)
        assert sum(one.first_byte_ms) == sum(e[3] is not None for e in mine)
        if job in merged:
            m = merged[job]
            assert (m.requests, m.errors) == (one.requests, one.errors)
            assert tuple(m.first_byte_ms) == one.first_byte_ms
            # Counters since start: a proxy that forgot an idle job dropped its part.
            total = sum(m.requests_total.values())
            assert m.requests <= total <= sum(e[0] == job for e in events)
        else:
            assert one.requests == 0


async def test_the_reporter_pushes_the_latest_snapshot_every_interval(nursery, autojump_clock):
    window = HealthWindow()
    service = MonitorService(LogBuffer(), proxies=[PROXY], clock=trio.current_time)
    reporter = HealthReporter(window, routed=lambda: ["idle"], interval_s=5,
                              clock=trio.current_time)
    async with connect(nursery, service, PROXY) as client:
        with trio.fail_after(60):
            nursery.start_soon(reporter.report, client)
            await trio.sleep(1)
            assert reporter.sent == 1 and reporter.connected
            window.record("j", 200, trio.current_time(), error=False, first_byte_s=0.1)
            await trio.sleep(5)
            assert reporter.sent == 2
            merged = service.health.merged(trio.current_time())
            assert merged["j"].requests == 1 and merged["idle"].requests == 0


async def test_a_refused_reporter_keeps_its_pace_and_queues_nothing(nursery, autojump_clock):
    window = HealthWindow()
    service = MonitorService(LogBuffer(), pushers=[], clock=trio.current_time)
    reporter = HealthReporter(window, interval_s=5, clock=trio.current_time)
    async with connect(nursery, service, PROXY) as client:
        with trio.fail_after(60):
            nursery.start_soon(reporter.report, client)
            await trio.sleep(21)
            # One try per interval (at 0, 5, 10, 15, 20), each refused, nothing held back.
            assert (reporter.sent, reporter.failed) == (0, 5) and not reporter.connected
            assert service.health.senders(trio.current_time()) == 0
