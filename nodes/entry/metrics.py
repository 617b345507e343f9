"""The entry point's Prometheus metrics, in a registry of its own (the daemon kit serves it).

| metric | labels | what |
| --- | --- | --- |
| ``entry_requests_total`` | service, code | answered requests by HTTP status (``0``: client gone) |
| ``entry_first_byte_seconds`` | service | request start to the upstream's status line |
| ``entry_request_seconds`` | service | request start to the last byte sent |
| ``entry_upstream_errors_total`` | service, code | failures by code (``UPSTREAM_…``) |
| ``entry_requests_in_flight`` | service | requests being answered now |
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["EntryMetrics"]

#: Seconds: an API call takes milliseconds, a model's answer up to minutes.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0, 300.0)


class EntryMetrics:
    """Counters and histograms updated on the request path (labels: a handful of services)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("entry_requests", "Requests answered, by service and HTTP status",
                                ["service", "code"], registry=self.registry)
        self.first_byte = Histogram("entry_first_byte_seconds",
                                    "Time from the request to the upstream's status line",
                                    ["service"], buckets=_BUCKETS, registry=self.registry)
        self.latency = Histogram("entry_request_seconds",
                                 "Time from the request to its last byte sent",
                                 ["service"], buckets=_BUCKETS, registry=self.registry)
        self.upstream_errors = Counter("entry_upstream_errors",
                                       "Upstream failures, by service and stable code",
                                       ["service", "code"], registry=self.registry)
        self.in_flight = Gauge("entry_requests_in_flight", "Requests being answered",
                               ["service"], registry=self.registry)
