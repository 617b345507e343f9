"""Model health: the proxies' windows merged per job and judged against thresholds (sans-IO).

Theory of operation
-------------------
Each proxy pushes its latest :class:`~contracts.monitor.MetricsReport`
every few seconds (``metrics.push``). :class:`HealthBook` keeps the newest
report of each sender with the time it came (wrk-monitor's clock: a sender's
clock is not trusted) and nothing older: reports are snapshots, not deltas.
A sender silent for ``stale_after_s`` no longer counts (its proxy stopped, or
cannot reach wrk-monitor; six missed reports at the default interval).

A job's figures are merged over the fresh senders that report it: requests
and errors are summed, latency histograms are summed bucket by bucket and the
percentiles read from the sum (exact, where a maximum of the senders' p95
would only bound it). Its model health (:func:`classify`):

- **Unhealthy**: error rate >= ``unhealthy_error_rate`` or first-byte p95 >=
  ``unhealthy_p95_ms``;
- **Degraded**: error rate >= ``degraded_error_rate`` or p95 >=
  ``degraded_p95_ms``;
- **Healthy**: neither; and also a job with fewer than ``min_requests``
  requests in the window, idle included: nothing shows that it answers
  poorly, and a rate over two requests is noise.
- no model health (None, "unknown") for a job that no fresh report names: no
  proxy routes it (not an inference job, not running, or no proxy reports).

Why first byte: it is what a sick or overloaded model server shows (queueing,
prefill), while a request's total time grows with the completion length the
client asked for. The total is reported beside it, not judged.

Percentiles from a histogram: linear within the bucket that holds the rank,
as Prometheus' ``histogram_quantile`` does; a rank in the last (+Inf) bucket
reads as the last finite bound (60 s: beyond any sane threshold anyway).

Bounds: ``max_senders`` senders (a new one past it replaces the stalest
stale one, else is refused: ``TooManySenders``); a report's jobs are bounded by
the contract (``MAX_REPORT_JOBS``). Known shortfall: a low-traffic job whose
few requests all fail stays Healthy until it has ``min_requests`` in a window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from contracts.monitor import (
    LATENCY_BOUNDS_MS,
    LATENCY_BUCKETS,
    JobHealth,
    JobWindow,
    MetricsReport,
    ModelHealth,
)

__all__ = ["HealthBook", "Merged", "Thresholds", "TooManySenders", "classify", "quantile_ms"]

@dataclass(frozen=True)
class Thresholds:
    """When a job's model is Degraded or Unhealthy (``MonitorSettings.health``)."""

    degraded_error_rate: float = 0.05
    unhealthy_error_rate: float = 0.25
    degraded_p95_ms: float = 5_000.0
    unhealthy_p95_ms: float = 20_000.0
    min_requests: int = 5
    stale_after_s: float = 30.0
    max_senders: int = 64

    def __post_init__(self) -> None:
        if not 0 < self.degraded_error_rate <= self.unhealthy_error_rate <= 1:
            raise ValueError("need 0 < degraded_error_rate <= unhealthy_error_rate <= 1")
        if not 0 < self.degraded_p95_ms <= self.unhealthy_p95_ms:
            raise ValueError("need 0 < degraded_p95_ms <= unhealthy_p95_ms")
        if self.min_requests < 1 or self.stale_after_s <= 0 or self.max_senders < 1:
            raise ValueError("min_requests, stale_after_s and max_senders must be positive")


class TooManySenders(Exception):
    """A new sender while ``max_senders`` fresh ones report (``TOO_MANY_SENDERS``)."""


def quantile_ms(histogram: tuple[int, ...] | list[int], q: float) -> float | None:
    """The ``q`` quantile (0-1) of a :data:`LATENCY_BOUNDS_MS` histogram, or None if empty."""
    count = sum(histogram)
    if count == 0:
        return None
    rank = q * count
    seen = 0
    for i, n in enumerate(histogram):
        if n and seen + n >= rank:
            if i >= len(LATENCY_BOUNDS_MS):
                return float(LATENCY_BOUNDS_MS[-1])
            low = 0.0 if i == 0 else float(LATENCY_BOUNDS_MS[i - 1])
            high = float(LATENCY_BOUNDS_MS[i])
            return low + (high - low) * (rank - seen) / n
        seen += n
    return float(LATENCY_BOUNDS_MS[-1])  # unreachable: the loop reaches count


@dataclass
class Merged:
    """One job's figures summed over the fresh senders that report it."""

    job_id: str
    requests: int = 0
    errors: int = 0
    first_byte_ms: list[int] = field(default_factory=lambda: [0] * LATENCY_BUCKETS)
    total_ms: list[int] = field(default_factory=lambda: [0] * LATENCY_BUCKETS)
    #: Requests since each sender started, by HTTP status, summed.
    requests_total: dict[str, int] = field(default_factory=dict)
    #: Fresh senders reporting the job.
    senders: int = 0
    #: The longest window among them (seconds).
    window_s: float = 0.0

    def add(self, window: JobWindow, window_s: float) -> None:
        self.requests += window.requests
        self.errors += window.errors
        for i, n in enumerate(window.first_byte_ms):
            self.first_byte_ms[i] += n
        for i, n in enumerate(window.total_ms):
            self.total_ms[i] += n
        for status, n in window.requests_total.items():
            self.requests_total[status] = self.requests_total.get(status, 0) + n
        self.senders += 1
        self.window_s = max(self.window_s, window_s)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


def classify(merged: Merged, thresholds: Thresholds) -> ModelHealth:
    """The model health of one job's merged figures (see the module doc)."""
    if merged.requests < thresholds.min_requests:
        return ModelHealth.HEALTHY
    rate = merged.error_rate
    p95 = quantile_ms(merged.first_byte_ms, 0.95)
    if rate >= thresholds.unhealthy_error_rate or (
            p95 is not None and p95 >= thresholds.unhealthy_p95_ms):
        return ModelHealth.UNHEALTHY
    if rate >= thresholds.degraded_error_rate or (
            p95 is not None and p95 >= thresholds.degraded_p95_ms):
        return ModelHealth.DEGRADED
    return ModelHealth.HEALTHY


class HealthBook:
    """The newest report of each sender; merged and judged on demand.

    Args:
        thresholds: the classification thresholds, staleness and sender bound.
    """

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.thresholds = thresholds or Thresholds()
        #: sender key -> (arrival time, report)
        self._reports: dict[bytes, tuple[float, MetricsReport]] = {}
        #: Reports taken, and the newest one's arrival (book clock).
        self.accepted = 0
        self.last_at: float | None = None

    def accept(self, sender: bytes, report: MetricsReport, now: float) -> None:
        """Keep ``report`` as ``sender``'s newest (replacing its previous one).

        Raises:
            TooManySenders: ``sender`` is new and ``max_senders`` fresh ones report.
        """
        reports = self._reports
        if sender not in reports and len(reports) >= self.thresholds.max_senders:
            self.expire(now)
            if len(reports) >= self.thresholds.max_senders:
                raise TooManySenders(f"wrk-monitor keeps at most "
                                     f"{self.thresholds.max_senders} metrics senders")
        reports[sender] = (now, report)
        self.accepted += 1
        self.last_at = now

    def expire(self, now: float) -> int:
        """Forget the senders silent for ``stale_after_s``; how many went."""
        cutoff = now - self.thresholds.stale_after_s
        stale = [key for key, (at, _) in self._reports.items() if at < cutoff]
        for key in stale:
            del self._reports[key]
        return len(stale)

    def senders(self, now: float) -> int:
        """Fresh senders."""
        cutoff = now - self.thresholds.stale_after_s
        return sum(at >= cutoff for at, _ in self._reports.values())

    def merged(self, now: float, job_ids: Iterable[str] | None = None) -> dict[str, Merged]:
        """Each job's figures over the fresh senders (only ``job_ids``' when given)."""
        wanted = None if job_ids is None else set(job_ids)
        cutoff = now - self.thresholds.stale_after_s
        out: dict[str, Merged] = {}
        for at, report in self._reports.values():
            if at < cutoff:
                continue
            for window in report.jobs:
                if wanted is not None and window.job_id not in wanted:
                    continue
                merged = out.get(window.job_id)
                if merged is None:
                    merged = out[window.job_id] = Merged(window.job_id)
                merged.add(window, report.window_s)
        return out

    def judge(self, merged: Merged) -> JobHealth:
        """``merged``'s model health and figures."""
        return JobHealth(
            job_id=merged.job_id, health=classify(merged, self.thresholds),
            requests=merged.requests, errors=merged.errors,
            error_rate=round(merged.error_rate, 6),
            first_byte_p50_ms=_round(quantile_ms(merged.first_byte_ms, 0.5)),
            first_byte_p95_ms=_round(quantile_ms(merged.first_byte_ms, 0.95)),
            total_p95_ms=_round(quantile_ms(merged.total_ms, 0.95)),
            window_s=merged.window_s, senders=merged.senders)

    def health(self, job_ids: Iterable[str], now: float) -> list[JobHealth]:
        """:class:`JobHealth` of each of ``job_ids`` in order (``health`` None if unknown)."""
        job_ids = list(job_ids)
        merged = self.merged(now, job_ids)
        return [self.judge(merged[j]) if j in merged else JobHealth(job_id=j, health=None)
                for j in job_ids]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
