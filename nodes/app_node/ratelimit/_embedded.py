"""The in-process limiter: :class:`GcraTable` driven by trio's clock.

Used when no ``REDIS_URL`` is set (one app-node, or tests), and by
:class:`RedisLimiter` as its fallback while Redis is unreachable. Limits are
per process: N app-nodes behind a balancer would allow N times the rate,
which is why a shared Redis is preferred when there is more than one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import trio

from ._core import Decision, GcraTable, Rate

__all__ = ["EmbeddedLimiter", "Limiter", "LimiterStatistics"]


@dataclass(frozen=True)
class LimiterStatistics:
    """Counters of a limiter since it was built (for the daemon's metrics snapshot)."""

    allowed: int
    denied: int
    #: Keys currently tracked in process (the fallback's, for a Redis limiter).
    keys: int
    #: Keys forgotten at the ``max_keys`` bound.
    evictions: int
    #: Redis calls that failed (0 for the embedded limiter).
    backend_errors: int = 0
    #: Decisions taken by the in-process fallback because Redis was unreachable.
    fallback_decisions: int = 0


class Limiter(Protocol):
    """What the middleware needs: one decision per request, by key and rate."""

    async def check(self, key: str, rate: Rate) -> Decision: ...

    def statistics(self) -> LimiterStatistics: ...


class EmbeddedLimiter:
    """GCRA per key in memory, at most ``max_keys`` keys (LRU eviction)."""

    def __init__(self, max_keys: int = 100_000) -> None:
        self._table = GcraTable(max_keys)
        self._allowed = 0
        self._denied = 0

    def check_nowait(self, key: str, rate: Rate) -> Decision:
        """Decide at trio's current time; never blocks."""
        decision = self._table.check(key, rate, trio.current_time())
        if decision.allowed:
            self._allowed += 1
        else:
            self._denied += 1
        return decision

    async def check(self, key: str, rate: Rate) -> Decision:
        """Decide one request of ``key`` (a checkpoint, so it can be cancelled)."""
        await trio.lowlevel.checkpoint()
        return self.check_nowait(key, rate)

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(allowed=self._allowed, denied=self._denied,
                                 keys=len(self._table), evictions=self._table.evictions)
