"""A per-agent budget for the log records the worker takes through ``agent.logs``.

Why: the worker forwards its agents' records with its own
:class:`~runtime.log_shipper.LogShipper`, a bounded queue that drops the
oldest record when full. Without a budget one chatty agent (a model server
printing thousands of lines a second, a crash loop dumping tracebacks) fills
that queue and pushes out everyone else's records: the other agents' and the
worker's own System lines (the jobs' steps), which matter most. So each agent
(one per VMI) gets a token bucket; what it sends beyond the bucket is dropped
at the worker, counted by job, and said in one warning line per agent at most
every ``warn_interval_s``. The worker's own records never pass here (they go
from its ``logging`` handler straight to the shipper).

The agent is not refused: its call is answered with ``accepted`` = the records
kept. Refusing would end nothing (the agent's shipper drops a refused batch or
re-sends a failed one, and the model server keeps printing); answering lets its
session and its next batches go on.

Which records of a cut batch are kept: **the first ones** (the oldest). The
bucket is spent in arrival order, so over a flood the worker keeps the head of
the burst and then a trickle at ``rate``; within one batch the kept records are
a prefix, so ``accepted`` means "the first N". The head is kept on purpose: in
a crash loop the first lines of a burst (the exception, the first error) tell
the cause and the rest repeats it; for steady chatty output the newest lines
are not lost for long, since the bucket refills and the next batches (newer
still) are taken at ``rate``. The warning line says so.

Sans-IO: every call takes ``now`` (the caller's ``trio.current_time()``);
nothing here sleeps, logs or reads a clock. Times going backwards refill
nothing (never a negative or extra refill).

Bounds: one bucket per VMI the worker expects (:meth:`LogLimiter.forget` when
the VMI is forgotten, :class:`~.agents.AgentTable` does it), and at most
``max_agents`` whatever the caller does (the least recently used goes first);
per-job drop counts are kept for jobs with a bucket plus up to ``max_jobs`` in
all, the counts of jobs without a bucket left going first.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

__all__ = [
    "DEFAULT_LOG_BURST",
    "DEFAULT_LOG_LIMIT",
    "DEFAULT_LOG_RATE_PER_S",
    "Admission",
    "LogLimit",
    "LogLimiter",
    "TokenBucket",
]

#: Records a second an agent may send on average. A model server at work logs
#: a line per request or two (vLLM's "Received request", an access line) plus
#: periodic stats: 200/s covers a replica answering ~100 requests a second, far
#: more than one replica's useful story. Ten agents at the limit are 2,000/s,
#: 50 s of the worker's 100,000-record shipper queue while wrk-monitor is away.
DEFAULT_LOG_RATE_PER_S = 200.0
#: Records an agent may send at once after a quiet spell: a start-up (weights
#: loading, CUDA and NCCL banners) or a traceback of a few hundred lines, and
#: one whole ``agent.logs`` batch (``MAX_BATCH_RECORDS`` = 1,000; the agent sends
#: 500 at a time) is taken whole.
DEFAULT_LOG_BURST = 1_000
#: At most one warning line per limited agent in this long (the metric counts all).
DEFAULT_WARN_INTERVAL_S = 60.0
#: Buckets held at most, whatever the caller forgets (a worker expects far fewer VMIs).
DEFAULT_MAX_AGENTS = 4_096
#: Jobs whose drop counts are held at most (a scrape label each).
DEFAULT_MAX_JOBS = 1_024


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` a second; a record costs one.

    Over any run of :meth:`take` calls with nondecreasing ``now`` starting at
    the creation time ``t0``, it grants at most ``burst + rate * (now - t0)``
    records in all (up to float rounding).
    """

    __slots__ = ("_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if not (rate > 0 and math.isfinite(rate)) or burst < 1:
            raise ValueError(f"rate must be positive and finite and burst at least 1, "
                             f"not rate={rate!r} burst={burst!r}")
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._last = now

    def tokens(self, now: float) -> float:
        """Tokens available at ``now`` (refills, takes nothing)."""
        self._refill(now)
        return self._tokens

    def take(self, n: int, now: float) -> int:
        """Take up to ``n`` tokens at ``now``; returns how many were granted (0…n)."""
        if n <= 0:
            return 0
        self._refill(now)
        granted = min(n, math.floor(self._tokens))
        self._tokens -= granted
        return granted

    def _refill(self, now: float) -> None:
        if now > self._last:
            self._tokens = min(float(self.burst),
                               self._tokens + (now - self._last) * self.rate)
            self._last = now


@dataclass(frozen=True)
class LogLimit:
    """How many records an agent may send: ``rate`` a second, ``burst`` at once."""

    rate: float = DEFAULT_LOG_RATE_PER_S
    burst: int = DEFAULT_LOG_BURST
    warn_interval_s: float = DEFAULT_WARN_INTERVAL_S

    def __post_init__(self) -> None:
        TokenBucket(self.rate, self.burst, 0.0)  # the same checks
        if not self.warn_interval_s >= 0:
            raise ValueError("warn_interval_s must be non-negative")


#: The budget of every agent unless the worker's settings say otherwise.
DEFAULT_LOG_LIMIT = LogLimit()


@dataclass(frozen=True)
class Admission:
    """What to do with one batch of ``kept + dropped`` records."""

    #: Keep the batch's first ``kept`` records.
    kept: int
    #: Drop the ``dropped`` records after them.
    dropped: int
    #: A warning line to log now (at most one per agent per ``warn_interval_s``),
    #: or None.
    warning: str | None = None


class _Agent:
    __slots__ = ("bucket", "job_id", "unwarned", "warned_at")

    def __init__(self, bucket: TokenBucket, job_id: str) -> None:
        self.bucket = bucket
        self.job_id = job_id
        #: Records dropped since the last warning line.
        self.unwarned = 0
        self.warned_at: float | None = None


class LogLimiter:
    """One :class:`TokenBucket` per agent (keyed by VMI name), drop counts per job.

    Args:
        limit: the rate and burst of every agent.
        max_agents: buckets held at most (least recently used dropped beyond).
        max_jobs: jobs whose drop counts are held at most.
    """

    def __init__(self, limit: LogLimit | None = None, *, max_agents: int = DEFAULT_MAX_AGENTS,
                 max_jobs: int = DEFAULT_MAX_JOBS) -> None:
        if max_agents < 1 or max_jobs < 1:
            raise ValueError("max_agents and max_jobs must be at least 1")
        self.limit = limit or DEFAULT_LOG_LIMIT
        self.max_agents = max_agents
        self.max_jobs = max_jobs
        self._agents: dict[str, _Agent] = {}
        #: Buckets per job (a job's count is kept first while it has one).
        self._live_jobs: Counter[str] = Counter()
        self._dropped_by_job: dict[str, int] = {}
        #: Records dropped in all (never decreases).
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._agents)

    @property
    def dropped_by_job(self) -> dict[str, int]:
        """Records dropped per job (a copy: safe to read from a scrape)."""
        return dict(self._dropped_by_job)

    def admit(self, vmi: str, job_id: str, count: int, now: float) -> Admission:
        """Spend ``vmi``'s budget on a batch of ``count`` records at ``now``."""
        agent = self._agents.pop(vmi, None)
        if agent is None:
            if len(self._agents) >= self.max_agents:
                self.forget(next(iter(self._agents)))
            agent = _Agent(TokenBucket(self.limit.rate, self.limit.burst, now), job_id)
            self._live_jobs[job_id] += 1
        self._agents[vmi] = agent  # the most recently used last
        kept = agent.bucket.take(count, now)
        dropped = count - kept
        if not dropped:
            return Admission(kept, 0)
        self.dropped += dropped
        self._count(agent.job_id, dropped)
        agent.unwarned += dropped
        if agent.warned_at is not None and now - agent.warned_at < self.limit.warn_interval_s:
            return Admission(kept, dropped)
        since = ("" if agent.warned_at is None
                 else f" in the last {now - agent.warned_at:.0f} s")
        warning = (f"{agent.unwarned} log records dropped over the worker's limit of "
                   f"{self.limit.rate:g}/s (burst {self.limit.burst}){since}; of each batch "
                   f"over budget the first records were kept, the newest dropped")
        agent.warned_at, agent.unwarned = now, 0
        return Admission(kept, dropped, warning)

    def forget(self, vmi: str) -> None:
        """Drop ``vmi``'s bucket (its VMI is gone for good). Unknown: no-op."""
        agent = self._agents.pop(vmi, None)
        if agent is None:
            return
        self._live_jobs[agent.job_id] -= 1
        if self._live_jobs[agent.job_id] <= 0:
            del self._live_jobs[agent.job_id]

    def _count(self, job_id: str, dropped: int) -> None:
        counts = self._dropped_by_job
        counts[job_id] = counts.get(job_id, 0) + dropped
        if len(counts) <= self.max_jobs:
            return
        # Over the bound: the oldest job without a bucket goes first (its count
        # is final and most likely scraped by now), else the oldest other job.
        others = [job for job in counts if job != job_id]  # never the job just counted
        victim = next((job for job in others if job not in self._live_jobs), others[0])
        del counts[victim]
