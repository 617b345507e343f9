"""Failure throttles with exponential backoff: logins, reset emails, token guesses (sans-IO).

GCRA (:mod:`._core`) limits how *often* a key may ask; a throttle limits how
often a key may *fail*: a password guessed wrong, a reset email sent, a token
that was not an invitation. Each key keeps its failures; past
``free_failures`` every further one makes the key wait twice as long as the
last (``base_s``, ``2·base_s``, … up to ``max_s``); a key that has not failed
for ``forget_s`` starts afresh, and a success (:meth:`Throttle.succeeded`)
clears it at once. A refused attempt is not a failure (it was never tried),
so waiting costs an attacker nothing more but gains him nothing either.

Keys, and why no one can lock a real user out from elsewhere
------------------------------------------------------------
:class:`Throttle` keeps two tables:

- per ``(account, source)``: the guesser's own address backs off; the real
  user's address has its own, untouched allowance.
- per ``account`` (optional ceiling): many addresses guessing one account
  (a botnet) back off together. Addresses that succeeded for the account
  before (*known sources*, remembered ``known_source_s``, 30 days) are not held
  by the ceiling, so the real user keeps logging in from home while strangers
  fill it. A real user on a new address during such an attack waits at most
  the ceiling's ``max_s`` (60 s for logins) between tries.

Tables are bounded (``max_keys``, least recently used forgotten first: a
forgotten key starts afresh, erring towards allowing). This is the in-process
core; :mod:`._throttles` drives it, or the same arithmetic in Redis when app-node
has a ``redis_url`` (shared by every app-node, falling back to this core while
Redis is down).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Backoff", "BackoffTable", "Throttle", "ThrottlePolicy", "throttle_keys"]


class Backoff(BaseModel):
    """How one key backs off after failures."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Failures allowed before any wait.
    free_failures: int = Field(default=5, ge=0, le=1_000_000)
    #: The wait after the first failure beyond the free ones (seconds); each
    #: further failure doubles it.
    base_s: float = Field(default=1.0, gt=0, le=86400)
    #: The longest wait (seconds).
    max_s: float = Field(default=900.0, gt=0, le=86400 * 30)
    #: Failures are forgotten this long after the last one (seconds).
    forget_s: float = Field(default=3600.0, gt=0, le=86400 * 30)


@dataclass
class _Entry:
    failures: int
    last_failure: float
    blocked_until: float


class BackoffTable:
    """Failures per key, at most ``max_keys`` keys (least recently used forgotten)."""

    def __init__(self, max_keys: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, got {max_keys}")
        self.max_keys = max_keys
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, key: str, policy: Backoff, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and now - entry.last_failure >= policy.forget_s:
            del self._entries[key]
            return None
        return entry

    def wait_s(self, key: str, policy: Backoff, now: float) -> float:
        """Seconds ``key`` must still wait before its next attempt (0: it may try now)."""
        entry = self._live(key, policy, now)
        return max(0.0, entry.blocked_until - now) if entry is not None else 0.0

    def failed(self, key: str, policy: Backoff, now: float) -> float:
        """Count a failure of ``key`` at ``now``; returns the wait it now has."""
        entry = self._live(key, policy, now)
        if entry is None:
            entry = self._entries[key] = _Entry(0, now, now)
        entry.failures += 1
        entry.last_failure = now
        beyond = entry.failures - policy.free_failures
        if beyond > 0:
            # 2**beyond overflows a float past ~1000: cap the exponent first.
            wait = min(policy.max_s, policy.base_s * 2.0 ** min(beyond - 1, 64))
            entry.blocked_until = max(entry.blocked_until, now + wait)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)
            self.evictions += 1
        return max(0.0, entry.blocked_until - now)

    def reset(self, key: str) -> None:
        """Forget ``key``'s failures (a success)."""
        self._entries.pop(key, None)


class ThrottlePolicy(BaseModel):
    """One throttle: per (account, source), and optionally a ceiling per account."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    per_source: Backoff = Backoff()
    #: None: no ceiling per account (e.g. token guesses, which name no account).
    per_account: Backoff | None = Backoff(free_failures=50, base_s=1.0, max_s=60.0)
    #: How long a source that succeeded for an account stays exempt from its ceiling.
    known_source_s: float = Field(default=30 * 86400.0, ge=0, le=365 * 86400.0)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def throttle_keys(account: str, source: str) -> tuple[str, str]:
    """``(account key, pair key)``: ``a:<digest>`` and ``s:<digest>:<source>``.

    Accounts (emails, normalised) are kept only as digests: no table, in process
    or in Redis, holds an address book.
    """
    account_key = _digest(account.strip().lower())
    return f"a:{account_key}", f"s:{account_key}:{source}"


class Throttle:
    """Failures of ``(account, source)`` pairs with a per-account ceiling; see the module.

    Args:
        policy: the backoffs.
        clock: seconds, monotonic (tests pass a fake).
        max_keys: bound of each table.
    """

    def __init__(self, policy: ThrottlePolicy, clock: Callable[[], float], *,
                 max_keys: int = 100_000) -> None:
        self.policy = policy
        self._clock = clock
        self._failures = BackoffTable(max_keys)
        self._known: OrderedDict[str, float] = OrderedDict()
        self._max_keys = max_keys
        self.refused = 0

    _keys = staticmethod(throttle_keys)

    def _is_known(self, pair: str, now: float) -> bool:
        since = self._known.get(pair)
        if since is None:
            return False
        if now - since >= self.policy.known_source_s:
            del self._known[pair]
            return False
        return True

    def wait_s(self, account: str, source: str) -> float:
        """Seconds before ``source`` may try ``account`` again (0: now). Counts nothing."""
        now = self._clock()
        account_key, pair = self._keys(account, source)
        wait = self._failures.wait_s(pair, self.policy.per_source, now)
        ceiling = self.policy.per_account
        if ceiling is not None and not self._is_known(pair, now):
            wait = max(wait, self._failures.wait_s(account_key, ceiling, now))
        if wait > 0:
            self.refused += 1
        return wait

    def failed(self, account: str, source: str) -> None:
        """Count one failure of ``source`` on ``account`` (and towards its ceiling)."""
        now = self._clock()
        account_key, pair = self._keys(account, source)
        self._failures.failed(pair, self.policy.per_source, now)
        if self.policy.per_account is not None:
            self._failures.failed(account_key, self.policy.per_account, now)

    def succeeded(self, account: str, source: str) -> None:
        """``source`` proved it is the account's: its failures go, it becomes known."""
        now = self._clock()
        _, pair = self._keys(account, source)
        self._failures.reset(pair)
        self._known[pair] = now
        self._known.move_to_end(pair)
        while len(self._known) > self._max_keys:
            self._known.popitem(last=False)

    def __len__(self) -> int:
        return len(self._failures)
