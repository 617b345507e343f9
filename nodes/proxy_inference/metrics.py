"""proxy-inference's Prometheus metrics, in a registry of its own (the daemon kit serves it).

Counters and histograms are updated on the request path (a labelled
``inc``/``observe`` costs a few microseconds); gauges that describe state
(replicas, usage waiting) are read from the live objects at scrape time,
through :mod:`nodes.kit.metrics`' snapshot collector, so a scrape never races.

| metric | labels | what |
| --- | --- | --- |
| ``proxy_requests_total`` | model, code | answered requests by HTTP status |
| ``proxy_request_seconds`` | model | request start to the last byte sent |
| ``proxy_first_byte_seconds`` | model | request start to the first frame of the agent |
| ``proxy_tokens_total`` | model, kind | ``prompt``, ``completion``, ``total``; ``audio_ms`` |
| ``proxy_errors_total`` | code | errors answered or met mid-stream, by stable code |
| ``proxy_usage_missing_total`` | model | 2xx answers without (whole) usage: billed as counted |
| ``proxy_bodies_refused_total`` | code | request bodies refused, by code (413, 503, 429, 408) |
| ``proxy_bodies_held_bytes`` | | bytes of request bodies held now |
| ``proxy_bodies_reading`` | | request bodies being received now |
| ``proxy_upstream_retries_total`` | model | tries again on another replica |
| ``proxy_replicas`` | model | healthy replicas (connected, not in back-off) |
| ``proxy_usage_pending_ops`` | | usage operations not yet written |
| ``proxy_usage_written_ops_total`` | | usage operations appended |
| ``proxy_usage_dropped_total`` | | requests whose usage was dropped (book full) |
| ``proxy_keys_cached`` | | API key answers in memory |

With ``telemetry.monitor`` set, also:

| metric | labels | what |
| --- | --- | --- |
| ``proxy_health_reports_sent_total`` | | health reports wrk-monitor took (reporter.py) |
| ``proxy_health_reports_failed_total`` | | health reports not taken (down, refused) |
| ``proxy_health_jobs`` | | jobs in the health window (health.py) |
| ``proxy_health_dropped_total`` | | requests left out of the window (past its job bound) |
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram

from contracts.inference import Usage
from nodes.kit.metrics import Family, Snapshot, snapshot_registry

__all__ = ["ModelMetrics", "ProxyMetrics"]

#: Models whose label children are cached.
MAX_MODELS = 4096

#: Seconds; the proxy's own share is a millisecond or two, a model's answer
#: up to minutes.
_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0, 300.0)


class ProxyMetrics:
    """The request-path metrics, plus a snapshot of state read at scrape time."""

    def __init__(self, snapshot: Callable[[], Snapshot] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("proxy_requests", "Requests answered, by model and HTTP status",
                                ["model", "code"], registry=self.registry)
        self.latency = Histogram("proxy_request_seconds",
                                 "Time from the request to its last byte, by model",
                                 ["model"], buckets=_BUCKETS, registry=self.registry)
        self.first_byte = Histogram("proxy_first_byte_seconds",
                                    "Time from the request to the agent's first frame",
                                    ["model"], buckets=_BUCKETS, registry=self.registry)
        self.tokens = Counter("proxy_tokens", "Tokens (and audio milliseconds) the responses "
                                              "reported, by model and kind",
                              ["model", "kind"], registry=self.registry)
        self.errors = Counter("proxy_errors", "Errors by stable code", ["code"],
                              registry=self.registry)
        self.usage_missing = Counter("proxy_usage_missing",
                                     "Successful answers whose usage was missing or partial "
                                     "(billed as counted), by model", ["model"],
                                     registry=self.registry)
        self.retries = Counter("proxy_upstream_retries",
                               "Requests tried again on another replica", ["model"],
                               registry=self.registry)
        self._snapshot = snapshot
        self._models: dict[str, ModelMetrics] = {}
        self.state_registry = snapshot_registry(self._read)

    def set_snapshot(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def _read(self) -> Snapshot:
        return self._snapshot() if self._snapshot is not None else Snapshot()

    def of(self, model: str) -> ModelMetrics:
        """The children of one model's labels (made once: ``labels()`` costs microseconds).

        ``model`` is a served name the routing table knows, or ``-``; at most
        ``MAX_MODELS`` are kept (beyond it they are made again each time).
        """
        found = self._models.get(model)
        if found is None:
            found = ModelMetrics(self, model)
            if len(self._models) < MAX_MODELS:
                self._models[model] = found
        return found


class ModelMetrics:
    """One model's metric children."""

    def __init__(self, parent: ProxyMetrics, model: str) -> None:
        self._parent = parent
        self.model = model
        self.latency = parent.latency.labels(model)
        self.first_byte = parent.first_byte.labels(model)
        self._ok = parent.requests.labels(model, "200")
        self._tokens = {kind: parent.tokens.labels(model, kind)
                        for kind in ("prompt", "completion", "total", "audio_ms")}

    def count(self, status: int, usage: Usage | None) -> None:
        """One request answered with ``status``, and what it used."""
        if status == 200:
            self._ok.inc()
        else:
            self._parent.requests.labels(self.model, str(status)).inc()
        if usage is None:
            return
        tokens = self._tokens
        if usage.prompt_tokens:
            tokens["prompt"].inc(usage.prompt_tokens)
        if usage.completion_tokens:
            tokens["completion"].inc(usage.completion_tokens)
        if usage.total_tokens:
            tokens["total"].inc(usage.total_tokens)
        if usage.audio_ms:
            tokens["audio_ms"].inc(usage.audio_ms)


def state_snapshot(*, replicas: dict[str, float], pending_ops: int, written_ops: int,
                   dropped: int, keys_cached: int, bodies_held: int = 0, bodies_reading: int = 0,
                   bodies_refused: dict[str, int] | None = None) -> Snapshot:
    """The state gauges, as the daemon's snapshot function builds them."""
    return Snapshot({
        "proxy_replicas": Family("Healthy replicas (connected, not in back-off) by model",
                                 replicas, "model"),
        "proxy_usage_pending_ops": Family("Usage operations not yet written", pending_ops),
        "proxy_usage_written_ops": Family("Usage operations appended to the database",
                                          written_ops, counter=True),
        "proxy_usage_dropped": Family("Requests whose usage was dropped (book full)",
                                      dropped, counter=True),
        "proxy_keys_cached": Family("API key answers held in memory", keys_cached),
        "proxy_bodies_held_bytes": Family("Bytes of request bodies held now", bodies_held),
        "proxy_bodies_reading": Family("Request bodies being received now", bodies_reading),
        "proxy_bodies_refused": Family("Request bodies refused, by stable code",
                                       dict(bodies_refused or {}), "code", counter=True),
    })


__all__ += ["state_snapshot"]
