"""Model health in wrk-monitor: thresholds table-tested, percentiles from histograms,
the newest report per sender with staleness and a sender bound; ``metrics.push`` from
proxies only (not a log pusher) and hostile reports refused; ``health.jobs`` and
``service.status`` for followers; the forwarded figures on ``/metrics`` as Prometheus'
own parser reads them."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict

from contracts.health import STATUS, StatusRequest
from contracts.monitor import (
    HEALTH_JOBS,
    LATENCY_BOUNDS_MS,
    LATENCY_BUCKETS,
    MAX_REPORT_JOBS,
    METRICS_PUSH,
    PUSH,
    HealthQuery,
    JobWindow,
    MetricsReport,
    MetricsResult,
    ModelHealth,
    PushBatch,
    encode_batch,
    make_record,
)
from nodes.monitor._buffer import LogBuffer
from nodes.monitor._health_metrics import health_registry
from nodes.monitor.health import (
    HealthBook,
    Merged,
    Thresholds,
    TooManySenders,
    classify,
    quantile_ms,
)
from nodes.monitor.service import MonitorService
from p2p.rpc import Method, RpcError

from .support import connect

PROXY = b"\x01" * 32
OTHER_PROXY = b"\x04" * 32
READER = b"\x03" * 32
STRANGER = b"\x02" * 32

H, D, U = ModelHealth.HEALTHY, ModelHealth.DEGRADED, ModelHealth.UNHEALTHY


def histogram(**at_ms: int) -> tuple[int, ...]:
    """Counts at the buckets whose upper bound is ``b<ms>`` (``inf`` for the last)."""
    counts = [0] * LATENCY_BUCKETS
    for name, n in at_ms.items():
        bound = name.removeprefix("b")
        counts[LATENCY_BUCKETS - 1 if bound == "inf" else LATENCY_BOUNDS_MS.index(int(bound))] = n
    return tuple(counts)


def window(job: str = "j", *, requests: int = 100, errors: int = 0,
           fb: tuple[int, ...] | None = None, statuses: dict | None = None) -> JobWindow:
    return JobWindow(job_id=job, requests=requests, errors=errors,
                     first_byte_ms=fb if fb is not None else histogram(b100=requests - errors),
                     total_ms=histogram(b1000=requests - errors),
                     requests_total=statuses or {"200": requests - errors, "502": errors})


def merged(**kw: Any) -> Merged:
    m = Merged("j")
    m.add(window(**kw), 60.0)
    return m


@pytest.mark.parametrize(("kw", "expected"), [
    ({"requests": 0}, H),                                   # idle: nothing answered poorly
    ({"requests": 4, "errors": 4}, H),                      # under min_requests: too few
    ({"requests": 100, "errors": 4}, H),
    ({"requests": 100, "errors": 5}, D),                    # 5%: degraded_error_rate
    ({"requests": 100, "errors": 24}, D),
    ({"requests": 100, "errors": 25}, U),                   # 25%: unhealthy_error_rate
    ({"requests": 20, "fb": histogram(b5000=20)}, H),       # p95 4.9 s: just under 5 s
    ({"requests": 20, "fb": histogram(b7500=20)}, D),       # p95 ~7.4 s
    ({"requests": 20, "fb": histogram(b30000=20)}, U),      # p95 ~29 s
    ({"requests": 20, "fb": histogram(binf=20)}, U),        # past a minute
    ({"requests": 20, "fb": histogram(b100=19, binf=1)}, H),  # one slow outlier of 20
    ({"requests": 20, "errors": 20, "fb": histogram()}, U),   # all failed: no latency at all
])
def test_health_follows_the_thresholds(kw, expected):
    assert classify(merged(**kw), Thresholds()) is expected


def test_thresholds_are_configurable_and_checked():
    strict = Thresholds(degraded_error_rate=0.01, unhealthy_error_rate=0.02, min_requests=1)
    assert classify(merged(requests=100, errors=1), strict) is D
    assert classify(merged(requests=1, errors=1), strict) is U
    for bad in ({"degraded_error_rate": 0.5, "unhealthy_error_rate": 0.1},
                {"degraded_p95_ms": 100, "unhealthy_p95_ms": 50}, {"min_requests": 0}):
        with pytest.raises(ValueError):
            Thresholds(**bad)


def test_percentiles_interpolate_within_the_bucket():
    assert quantile_ms(histogram(), 0.95) is None
    assert quantile_ms(histogram(b100=10), 0.5) == pytest.approx(75.0)  # (50, 100], half way
    assert quantile_ms(histogram(b10=10), 1.0) == 10.0
    assert quantile_ms(histogram(b10=95, b60000=5), 0.95) == 10.0
    assert quantile_ms(histogram(binf=1), 0.5) == float(LATENCY_BOUNDS_MS[-1])


def test_senders_are_summed_and_their_histograms_merged():
    book = HealthBook()
    book.accept(PROXY, MetricsReport(window_s=60, jobs=(window(requests=50, errors=1),)), 0.0)
    book.accept(OTHER_PROXY, MetricsReport(window_s=60, jobs=(
        window(requests=50, errors=4, fb=histogram(b30000=46)),)), 1.0)
    [health] = book.health(["j"], 1.0)
    assert (health.requests, health.errors, health.senders) == (100, 5, 2)
    # 5% errors alone is Degraded, but the slow proxy's answers are 46 of the 100:
    # the merged histogram's p95 is theirs (~29 s), not the fast proxy's.
    assert health.health is U
    assert health.first_byte_p95_ms is not None and 20_000 < health.first_byte_p95_ms <= 30_000
    assert book.health(["nobody"], 1.0)[0].health is None


def test_a_senders_newer_report_replaces_its_older_and_stale_senders_stop_counting():
    book = HealthBook(Thresholds(stale_after_s=30))
    book.accept(PROXY, MetricsReport(window_s=60, jobs=(window(requests=10, errors=10),)), 0.0)
    book.accept(PROXY, MetricsReport(window_s=60, jobs=(window(requests=10),)), 5.0)
    assert book.health(["j"], 5.0)[0].health is H
    assert book.senders(35.0) == 1 and book.health(["j"], 35.0)[0].health is H
    assert book.senders(35.1) == 0 and book.health(["j"], 35.1)[0].health is None


def test_new_senders_past_the_bound_are_refused_unless_a_stale_one_makes_room():
    book = HealthBook(Thresholds(max_senders=1, stale_after_s=30))
    empty = MetricsReport(window_s=60)
    book.accept(PROXY, empty, 0.0)
    with pytest.raises(TooManySenders):
        book.accept(OTHER_PROXY, empty, 10.0)
    book.accept(PROXY, empty, 10.0)  # a known sender always may
    book.accept(OTHER_PROXY, empty, 41.0)  # PROXY went stale: its slot is taken
    assert book.senders(41.0) == 1


class LooseReport(BaseModel):
    """What a hostile sender may put on the wire: anything."""

    model_config = ConfigDict(extra="allow")
    window_s: Any = 60
    jobs: Any = ()


LOOSE_PUSH = Method("metrics.push", params=LooseReport, result=MetricsResult)
GOOD_JOB = window().model_dump()


@pytest.mark.parametrize("hostile", [
    {"jobs": [GOOD_JOB] * (MAX_REPORT_JOBS + 1)},
    {"jobs": [GOOD_JOB, GOOD_JOB]},                                   # one job twice
    {"jobs": [{**GOOD_JOB, "errors": 101}]},                          # more errors than requests
    {"jobs": [{**GOOD_JOB, "first_byte_ms": [1] * (LATENCY_BUCKETS + 1)}]},
    {"jobs": [{**GOOD_JOB, "first_byte_ms": [200] + [0] * (LATENCY_BUCKETS - 1)}]},
    {"jobs": [{**GOOD_JOB, "requests_total": {"<script>": 1}}]},
    {"jobs": [{**GOOD_JOB, "requests_total": {str(s): 1 for s in range(200, 220)}}]},
    {"jobs": [{**GOOD_JOB, "requests": -1}]},
    {"jobs": [{**GOOD_JOB, "job_id": "x" * 65}]},
    {"jobs": [{**GOOD_JOB, "extra": 1}]},
    {"window_s": 0},
    {"window_s": float("inf")},
    {"jobs": "not a list"},
])
async def test_hostile_reports_are_refused_and_change_nothing(nursery, autojump_clock, hostile):
    service = MonitorService(LogBuffer(), proxies=[PROXY], clock=trio.current_time)
    async with connect(nursery, service, PROXY) as proxy:
        with trio.fail_after(10):
            with pytest.raises(RpcError) as refused:
                await proxy.call(LOOSE_PUSH, LooseReport(**hostile))
            assert refused.value.code == "INVALID_PARAMS"
            assert service.health.accepted == 0 and service.last_report_at is None
            ok = await proxy.call(METRICS_PUSH, MetricsReport(window_s=60, jobs=(window(),)))
            assert ok.accepted == 1


async def test_only_proxies_report_metrics_and_only_followers_read_health(nursery,
                                                                          autojump_clock):
    service = MonitorService(LogBuffer(), pushers=[PROXY, READER], proxies=[PROXY],
                             followers=[READER],
                             allow_any_pusher=True, clock=trio.current_time,
                             wall_clock=lambda: 1_700_000_000.0, started_at=1_699_999_000.0)
    report = MetricsReport(window_s=60, jobs=(window(requests=100, errors=30),))
    async with (connect(nursery, service, PROXY) as proxy,
                connect(nursery, service, READER) as reader,
                connect(nursery, service, STRANGER) as stranger):
        with trio.fail_after(10):
            # allow_any_pusher opens logs to agents, never metrics: an agent could
            # otherwise paint any job Unhealthy.
            for client in (stranger, reader):
                with pytest.raises(RpcError) as refused:
                    await client.call(METRICS_PUSH, report)
                assert refused.value.code == "FORBIDDEN"
            await stranger.call(PUSH, PushBatch(records=encode_batch(
                [make_record("hello", service="agent-inference")])))
            assert (await proxy.call(METRICS_PUSH, report)).accepted == 1

            for client in (proxy, stranger):
                for method, params in ((HEALTH_JOBS, HealthQuery(job_ids=("j",))),
                                       (STATUS, StatusRequest())):
                    with pytest.raises(RpcError) as refused:
                        await client.call(method, params)
                    assert refused.value.code == "FORBIDDEN"
            answer = await reader.call(HEALTH_JOBS, HealthQuery(job_ids=("j", "unknown")))
            assert [(j.job_id, j.health) for j in answer.jobs] == [("j", U), ("unknown", None)]
            assert answer.jobs[0].error_rate == 0.3 and answer.jobs[0].senders == 1

            status = await reader.call(STATUS, StatusRequest())
            assert status.service == "wrk-monitor" and status.queue_depth == 0
            assert status.last_report_at == 1_700_000_000.0
            assert status.started_at == 1_699_999_000.0
            assert status.details["metrics_senders"] == 1
            assert status.details["buffered_records"] == 1


async def test_a_sender_past_the_bound_gets_too_many_senders(nursery, autojump_clock):
    service = MonitorService(LogBuffer(), proxies=[PROXY, OTHER_PROXY],
                             health=HealthBook(Thresholds(max_senders=1)),
                             clock=trio.current_time)
    async with (connect(nursery, service, PROXY) as first,
                connect(nursery, service, OTHER_PROXY) as second):
        with trio.fail_after(10):
            await first.call(METRICS_PUSH, MetricsReport(window_s=60))
            with pytest.raises(RpcError) as refused:
                await second.call(METRICS_PUSH, MetricsReport(window_s=60))
            assert refused.value.code == "TOO_MANY_SENDERS" and service.refused_reports == 1


def test_status_reports_lokis_backlog_as_the_queue_depth():
    class Loki:
        def statistics(self):
            return type("S", (), {"buffered": 42, "dropped": 3, "failed": 1})()

    service = MonitorService(LogBuffer(), loki=Loki())
    status = service.status()
    assert status.queue_depth == 42 and status.last_report_at is None
    assert status.details["loki_dropped"] == 3


def test_forwarded_metrics_parse_as_prometheus_text():
    book = HealthBook()
    book.accept(PROXY, MetricsReport(window_s=60, jobs=(
        window("j-1", requests=100, errors=30),
        window("j-2", requests=10, statuses={"200": 7, "404": 3}))), 0.0)
    book.accept(OTHER_PROXY, MetricsReport(window_s=60, jobs=(
        window("j-1", requests=20, statuses={"200": 20}),)), 0.0)
    text = generate_latest(health_registry(book, lambda: 1.0)).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("cosmicac_proxy_requests_total", job_id="j-1", status="200") == 70 + 20
    assert value("cosmicac_proxy_requests_total", job_id="j-1", status="502") == 30
    assert value("cosmicac_proxy_requests_total", job_id="j-2", status="404") == 3
    assert value("cosmicac_model_health", job_id="j-1", health="Unhealthy") == 1
    assert value("cosmicac_model_health", job_id="j-1", health="Healthy") == 0
    assert value("cosmicac_model_health", job_id="j-2", health="Healthy") == 1
    assert value("cosmicac_model_window_requests", job_id="j-1") == 120
    assert value("cosmicac_model_window_errors", job_id="j-1") == 30
    assert 0.05 < value("cosmicac_model_first_byte_p95_seconds", job_id="j-1") <= 0.1
    assert 0.5 < value("cosmicac_model_request_p95_seconds", job_id="j-1") <= 1.0
    assert value("cosmicac_monitor_metrics_senders") == 2
    assert value("cosmicac_monitor_metrics_reports_total") == 2
