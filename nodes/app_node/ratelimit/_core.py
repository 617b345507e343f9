"""The rate-limit core: GCRA per key, sans-IO (no clock, no socket).

GCRA (the Generic Cell Rate Algorithm, as in ATM and redis-cell) keeps one
number per key, the *theoretical arrival time* (TAT): when the key's bucket
would be empty again if no more requests came. A request at ``now`` is
allowed iff ``TAT + T - burst·T <= now`` (``T`` = 1/rate, the emission
interval); allowing it moves the TAT forward by ``T``. That gives exactly
``burst`` requests back to back and then one every ``T`` seconds, with a
single float of state per key and an exact ``retry_after`` when denied. The
same arithmetic runs in Redis's Lua script (:mod:`._redis`), so both limiters
answer alike. Times are whole microseconds: exact in Python's ints and in
Lua's doubles (below 2**53 µs, some 285 years of Unix time), so no rounding
error ever refuses a request that is on time, or lets one through early.

:class:`GcraTable` holds the TATs of at most ``max_keys`` keys, evicting the
least recently used one at the bound: an evicted key starts afresh with a full
burst, which errs towards allowing (a forgotten client gets its burst again),
never towards refusing a client it never saw.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Decision", "GcraTable", "Rate", "gcra", "to_us"]

_US_PER_S = 1_000_000


class Rate(BaseModel):
    """A sustained rate and the burst allowed on top of an idle key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Requests per second allowed in the long run.
    per_second: float = Field(gt=0, le=1e6)
    #: Requests allowed back to back by a key that was idle long enough.
    burst: int = Field(ge=1, le=1_000_000)

    @property
    def interval_us(self) -> int:
        """GCRA's emission interval ``T`` in whole microseconds (at least 1)."""
        return max(1, round(_US_PER_S / self.per_second))


@dataclass(frozen=True)
class Decision:
    """The answer for one request."""

    allowed: bool
    #: Seconds until a request of this key would be allowed (0 when allowed).
    retry_after_s: float
    #: Requests still allowed right now, back to back, after this one.
    remaining: int

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` in whole seconds, rounded up (never 0 for a refusal)."""
        return str(max(1, math.ceil(self.retry_after_s)))


def gcra(tat_us: int | None, rate: Rate, now_us: int) -> tuple[Decision, int | None]:
    """One GCRA step in microseconds: the decision and the key's new TAT.

    ``tat_us`` is ``None`` for a key never seen (or expired); the new TAT is
    ``None`` when refused: a refusal leaves the TAT alone, so it costs a client
    nothing more.
    """
    interval = rate.interval_us
    base = now_us if tat_us is None or tat_us < now_us else tat_us
    new_tat = base + interval
    allow_at = new_tat - rate.burst * interval
    if now_us < allow_at:
        return Decision(allowed=False, retry_after_s=(allow_at - now_us) / _US_PER_S,
                        remaining=0), None
    remaining = min(rate.burst - 1, (now_us - allow_at) // interval)
    return Decision(allowed=True, retry_after_s=0.0, remaining=remaining), new_tat


def to_us(seconds: float) -> int:
    """Seconds (trio's clock, any origin) to whole microseconds."""
    return round(seconds * _US_PER_S)


class GcraTable:
    """The TATs of a bounded set of keys, least recently used evicted first."""

    def __init__(self, max_keys: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, got {max_keys}")
        self.max_keys = max_keys
        self._tats: OrderedDict[str, int] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._tats)

    def check(self, key: str, rate: Rate, now: float) -> Decision:
        """Decide one request of ``key`` at ``now`` (seconds, any monotonic origin)."""
        now_us = to_us(now)
        tat = self._tats.get(key)
        if tat is not None and tat <= now_us:
            # Idle long enough to have a full burst again: the entry says nothing.
            tat = None
        decision, new_tat = gcra(tat, rate, now_us)
        if new_tat is not None:
            self._tats[key] = new_tat
        if key in self._tats:
            self._tats.move_to_end(key)
        while len(self._tats) > self.max_keys:
            # At the bound the oldest key forgets its history (a fresh burst).
            self._tats.popitem(last=False)
            self.evictions += 1
        return decision
