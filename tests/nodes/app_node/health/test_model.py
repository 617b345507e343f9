"""The health history's core: rows from answers and failures, a service's state now,
the overall status, and a window's uptime and buckets (no trio, no store)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.health import service_status
from nodes.app_node.health import (
    MAX_ROWS,
    RETENTION_S,
    HealthRow,
    Overall,
    ServiceState,
    answered,
    clamp_window,
    newest_by_service,
    not_answered,
    ordered_services,
    overall,
    service_state,
    summarise,
)
from nodes.app_node.health._model import MAX_ERROR_CHARS


def row(at: float, up: bool = True, service: str = "wrk-ork") -> HealthRow:
    if up:
        return answered(service_status("wrk-ork", started_at=1.0, queue_depth=2),
                        service=service, at=at, latency_ms=3.0)
    return not_answered(service, at=at, latency_ms=5000.0, error="no answer within 5 s")


def test_an_answer_keeps_what_the_service_said_under_our_name() -> None:
    status = service_status("ork", started_at=10.0, queue_depth=7, last_report_at=99.0,
                            details={"racks": 2})
    r = answered(status, service="wrk-ork", at=100.0, latency_ms=12.5)
    assert (r.service, r.reachable, r.up, r.queue_depth, r.last_report_at, r.latency_ms,
            r.details, r.error) == ("wrk-ork", True, True, 7, 99.0, 12.5, {"racks": 2}, None)
    assert r.version == status.version


def test_a_failure_is_a_row_with_its_reason_cut_to_one_bounded_line() -> None:
    r = not_answered("wrk-monitor", at=5.0, latency_ms=None, error="x\n" * 500)
    assert not r.reachable and not r.up and r.version is None and r.queue_depth is None
    assert "\n" not in r.error and len(r.error) == MAX_ERROR_CHARS
    refused = not_answered("wrk-ork", at=5.0, latency_ms=1.0, error="FORBIDDEN: no",
                           reachable=True)
    assert refused.reachable and not refused.up


def test_service_state_follows_the_newest_row_and_its_age() -> None:
    assert service_state(None, 100.0, 15.0) is ServiceState.UNKNOWN
    assert service_state(row(90.0), 100.0, 15.0) is ServiceState.UP
    assert service_state(row(90.0, up=False), 100.0, 15.0) is ServiceState.DOWN
    refused = not_answered("x", at=90.0, latency_ms=1.0, error="E", reachable=True)
    assert service_state(refused, 100.0, 15.0) is ServiceState.ERROR
    assert service_state(row(50.0), 100.0, 15.0) is ServiceState.STALE  # > 3 intervals


def test_overall_is_ok_only_when_every_service_is_up() -> None:
    S = ServiceState
    assert overall([]) is Overall.UNKNOWN
    assert overall([S.UNKNOWN, S.UNKNOWN]) is Overall.UNKNOWN
    assert overall([S.UP, S.UP]) is Overall.OK
    for bad in (S.DOWN, S.ERROR, S.STALE, S.UNKNOWN):
        assert overall([S.UP, bad]) is Overall.DEGRADED


def test_summarise_counts_uptime_and_fills_buckets_oldest_first() -> None:
    rows = [row(0.0), row(10.0, up=False), row(25.0), row(59.0), row(60.0, up=False),
            row(61.0)]  # the last is outside
    s = summarise(rows, 0.0, 60.0, buckets=6)
    assert (s.probes, s.up, s.down) == (5, 3, 2)
    assert s.uptime == pytest.approx(0.6)
    # 10 s slices; the window's end belongs to the last one.
    assert s.buckets == [1.0, 0.0, 1.0, None, None, 0.5]


def test_summarise_of_nothing_has_no_uptime() -> None:
    s = summarise([], 0.0, 3600.0)
    assert s.probes == 0 and s.uptime is None and s.buckets == [None] * 12
    with pytest.raises(ValueError):
        summarise([], 5.0, 5.0)


@given(st.lists(st.tuples(st.floats(0, 3600), st.booleans()), max_size=200),
       st.integers(1, 60))
def test_summarise_buckets_add_up_to_the_window(points, buckets) -> None:
    rows = [row(at, up) for at, up in points]
    s = summarise(rows, 0.0, 3600.0, buckets=buckets)
    assert len(s.buckets) == buckets and s.probes == len(points)
    assert s.up == sum(up for _, up in points)
    assert all(b is None or 0.0 <= b <= 1.0 for b in s.buckets)


def test_a_window_defaults_to_an_hour_and_never_reaches_past_retention() -> None:
    assert clamp_window(100_000.0, None) == (96_400.0, 100_000.0)
    assert clamp_window(100_000.0, 99_000.0) == (99_000.0, 100_000.0)
    assert clamp_window(200_000.0, 0.0) == (200_000.0 - RETENTION_S, 200_000.0)
    assert MAX_ROWS >= 4 * 3600 / 15  # an hour of five services fits one answer


def test_newest_by_service_and_the_order_services_are_shown() -> None:
    rows = [row(1.0), row(3.0, service="database"), row(2.0), row(0.5, service="database")]
    newest = newest_by_service(rows)
    assert newest["wrk-ork"].at == 2.0 and newest["database"].at == 3.0
    assert ordered_services(["wrk-ork", "app-node"], {"old": 1, "wrk-ork": 1}) == \
        ["wrk-ork", "app-node", "old"]
