"""``/metrics`` of what the proxies forward: their request counters and each job's health.

Read at scrape time from the :class:`~nodes.monitor.health.HealthBook` (plain
data, merged over the fresh senders, so a scrape never races a push):

| metric | labels | what |
| --- | --- | --- |
| ``cosmicac_proxy_requests_total`` | job_id, status | requests by HTTP status, all proxies |
| ``cosmicac_model_health`` | job_id, health | 1 for the job's model health now, else 0 |
| ``cosmicac_model_window_requests`` | job_id | requests in the window |
| ``cosmicac_model_window_errors`` | job_id | errors in the window |
| ``cosmicac_model_first_byte_p95_seconds`` | job_id | first-byte p95 over the window |
| ``cosmicac_model_request_p95_seconds`` | job_id | request p95 over the window |
| ``cosmicac_monitor_metrics_senders`` | | proxies reporting (fresh) |
| ``cosmicac_monitor_metrics_reports_total`` | | reports taken |

``cosmicac_proxy_requests_total`` sums each proxy's counter since it started:
it drops when a proxy goes stale or restarts, which ``rate()`` reads as a
reset. ``cosmicac_model_health`` is Prometheus' state-set idiom (one series
per value). A p95 is absent while no request of the window got a first byte.

Cardinality: one job has at most ``MAX_STATUS_CODES`` status series and three
health series; jobs are bounded by the senders' reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from contracts.monitor import ModelHealth

from .health import HealthBook

__all__ = ["health_registry"]


class _HealthCollector:
    def __init__(self, book: HealthBook, clock: Callable[[], float]) -> None:
        self._book = book
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        book = self._book
        now = self._clock()
        merged = book.merged(now)
        requests = CounterMetricFamily("cosmicac_proxy_requests",
                                       "Requests the proxies answered, by job and HTTP status",
                                       labels=["job_id", "status"])
        health = GaugeMetricFamily("cosmicac_model_health",
                                   "1 for the job's model health now (Healthy, Degraded, "
                                   "Unhealthy), 0 for the others", labels=["job_id", "health"])
        window_requests = GaugeMetricFamily("cosmicac_model_window_requests",
                                            "Requests in the proxies' sliding window",
                                            labels=["job_id"])
        window_errors = GaugeMetricFamily("cosmicac_model_window_errors",
                                          "Failed requests (5xx, broken streams) in the window",
                                          labels=["job_id"])
        first_byte = GaugeMetricFamily("cosmicac_model_first_byte_p95_seconds",
                                       "First-byte latency p95 over the window",
                                       labels=["job_id"])
        total = GaugeMetricFamily("cosmicac_model_request_p95_seconds",
                                  "Request latency p95 over the window", labels=["job_id"])
        for job_id in sorted(merged):
            judged = book.judge(merged[job_id])
            for status, n in sorted(merged[job_id].requests_total.items()):
                requests.add_metric([job_id, status], n)
            for state in ModelHealth:
                health.add_metric([job_id, state.value], float(judged.health is state))
            window_requests.add_metric([job_id], judged.requests)
            window_errors.add_metric([job_id], judged.errors)
            if judged.first_byte_p95_ms is not None:
                first_byte.add_metric([job_id], judged.first_byte_p95_ms / 1000)
            if judged.total_p95_ms is not None:
                total.add_metric([job_id], judged.total_p95_ms / 1000)
        yield from (requests, health, window_requests, window_errors, first_byte, total)
        yield GaugeMetricFamily("cosmicac_monitor_metrics_senders",
                                "Proxies whose metrics report is fresh",
                                value=book.senders(now))
        yield CounterMetricFamily("cosmicac_monitor_metrics_reports",
                                  "Metrics reports taken", value=book.accepted)


def health_registry(book: HealthBook, clock: Callable[[], float]) -> CollectorRegistry:
    """A registry whose every scrape shows ``book``'s merged figures at ``clock()``."""
    registry = CollectorRegistry()
    registry.register(_HealthCollector(book, clock))
    return registry
