"""The failure throttles' drivers: in process, or shared in Redis.

:class:`EmbeddedThrottle` drives the sans-IO :class:`~._backoff.Throttle` on a
clock. :class:`RedisThrottle` keeps the same state in Redis, so every app-node
behind a balancer counts a guesser's failures together, through the
:class:`~._redis.RedisLimiter`'s client, threads and outage handling: while
Redis is unreachable it decides with its own :class:`EmbeddedThrottle`
(failures counted per process until Redis answers again).

Redis layout, under the limiter's prefix (``cac:rl:``) and ``th:<throttle>:``:

- ``s:<account digest>:<source>``: hash, ``n`` failures and ``until`` (µs, Redis
  ``TIME``), expiring ``forget_s`` after the last failure;
- ``a:<account digest>``: the same for the account's ceiling;
- ``k:<account digest>:<source>``: ``1`` for a source that succeeded (known),
  expiring ``known_source_s`` after the success.

Each step is one Lua script (atomic), with the arithmetic of
:meth:`~._backoff.BackoffTable.failed`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any, Protocol

import trio

from ._backoff import Backoff, Throttle, ThrottlePolicy, throttle_keys
from ._redis import RedisLimiter, run_script

__all__ = ["EmbeddedThrottle", "FailureThrottle", "RedisThrottle", "make_throttles"]

#: KEYS: pair, account, known; ARGV[1]: 1 to apply the account's ceiling.
#: Returns the wait in µs (0: the pair may try now).
WAIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local wait = 0
local u = tonumber(redis.call('HGET', KEYS[1], 'until'))
if u and u > now then wait = u - now end
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[3]) == 0 then
  local a = tonumber(redis.call('HGET', KEYS[2], 'until'))
  if a and a - now > wait then wait = a - now end
end
return wait
"""

#: KEYS: pair[, account]; ARGV: free, base_us, max_us, forget_ms for the pair, then
#: the same for the account when it is given.
FAIL_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fail(key, free, base, max, forget)
  local n = redis.call('HINCRBY', key, 'n', 1)
  if n > free then
    local e = n - free - 1
    if e > 64 then e = 64 end
    local w = base * 2 ^ e
    if w > max then w = max end
    local u = tonumber(redis.call('HGET', key, 'until')) or 0
    if now + w > u then
      redis.call('HSET', key, 'until', string.format('%.0f', now + w))
    end
  end
  redis.call('PEXPIRE', key, forget)
end
for i, key in ipairs(KEYS) do
  local o = (i - 1) * 4
  fail(key, tonumber(ARGV[o + 1]), tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]),
       tonumber(ARGV[o + 4]))
end
return 1
"""

#: KEYS: pair, known; ARGV[1]: how long the source stays known (ms; 0: not at all).
SUCCEED_LUA = """
redis.call('DEL', KEYS[1])
if tonumber(ARGV[1]) > 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
end
return 1
"""

_SHA = {script: hashlib.sha1(script.encode()).hexdigest()
        for script in (WAIT_LUA, FAIL_LUA, SUCCEED_LUA)}


class FailureThrottle(Protocol):
    """What the routes use: ask, then report the attempt's outcome."""

    async def wait_s(self, account: str, source: str) -> float: ...

    async def failed(self, account: str, source: str) -> None: ...

    async def succeeded(self, account: str, source: str) -> None: ...


class EmbeddedThrottle:
    """The in-process throttle (:class:`~._backoff.Throttle`) behind the async API."""

    def __init__(self, policy: ThrottlePolicy, clock: Callable[[], float], *,
                 max_keys: int = 100_000) -> None:
        self.core = Throttle(policy, clock, max_keys=max_keys)

    async def wait_s(self, account: str, source: str) -> float:
        await trio.lowlevel.checkpoint()
        return self.core.wait_s(account, source)

    async def failed(self, account: str, source: str) -> None:
        await trio.lowlevel.checkpoint()
        self.core.failed(account, source)

    async def succeeded(self, account: str, source: str) -> None:
        await trio.lowlevel.checkpoint()
        self.core.succeeded(account, source)


def _backoff_args(backoff: Backoff) -> list[int]:
    return [backoff.free_failures, math.ceil(backoff.base_s * 1e6),
            math.ceil(backoff.max_s * 1e6), math.ceil(backoff.forget_s * 1000)]


class RedisThrottle:
    """A throttle whose state every app-node shares in Redis (see the module).

    Args:
        name: the throttle's name in its keys (``login``, ``reset_email``, …).
        limiter: the rate limiter whose Redis client and outage state it shares.
        policy: the backoffs.
        clock / max_keys: of the in-process fallback.
    """

    def __init__(self, name: str, limiter: RedisLimiter, policy: ThrottlePolicy,
                 clock: Callable[[], float], *, max_keys: int = 100_000) -> None:
        self.name = name
        self.policy = policy
        self.limiter = limiter
        self.fallback = EmbeddedThrottle(policy, clock, max_keys=max_keys)

    def _keys(self, prefix: str, account: str, source: str) -> tuple[str, str, str]:
        account_key, pair = throttle_keys(account, source)
        base = f"{prefix}th:{self.name}:"
        return base + pair, base + account_key, base + "k" + pair[1:]

    async def _run(self, script: str, keys: Callable[[str], list[str]],
                   args: list[Any]) -> Any:
        return await self.limiter.call(
            lambda client, prefix: run_script(client, script, _SHA[script], keys(prefix), args))

    async def wait_s(self, account: str, source: str) -> float:
        ceiling = 1 if self.policy.per_account is not None else 0
        reply = await self._run(WAIT_LUA, lambda p: list(self._keys(p, account, source)),
                                [ceiling])
        if reply is None:
            return await self.fallback.wait_s(account, source)
        return int(reply) / 1_000_000

    async def failed(self, account: str, source: str) -> None:
        args = _backoff_args(self.policy.per_source)
        if self.policy.per_account is not None:
            args += _backoff_args(self.policy.per_account)

        def keys(prefix: str) -> list[str]:
            pair, account_key, _ = self._keys(prefix, account, source)
            return [pair, account_key] if self.policy.per_account is not None else [pair]

        if await self._run(FAIL_LUA, keys, args) is None:
            await self.fallback.failed(account, source)

    async def succeeded(self, account: str, source: str) -> None:
        known_ms = math.ceil(self.policy.known_source_s * 1000)

        def keys(prefix: str) -> list[str]:
            pair, _, known = self._keys(prefix, account, source)
            return [pair, known]

        if await self._run(SUCCEED_LUA, keys, [known_ms]) is None:
            await self.fallback.succeeded(account, source)


#: The throttles app-node keeps, by their name in :class:`~._middleware.Limits`.
THROTTLES = ("login", "reset_email", "token_guess")


def make_throttles(limits: Any, limiter: object,
                   clock: Callable[[], float]) -> dict[str, FailureThrottle]:
    """Each of :data:`THROTTLES` at ``limits``' policy: in Redis when ``limiter`` is a
    :class:`RedisLimiter` (shared by every app-node), else in process."""
    throttles: dict[str, FailureThrottle] = {}
    for name in THROTTLES:
        policy: ThrottlePolicy = getattr(limits, name)
        if isinstance(limiter, RedisLimiter):
            throttles[name] = RedisThrottle(name, limiter, policy, clock,
                                            max_keys=limits.max_keys)
        else:
            throttles[name] = EmbeddedThrottle(policy, clock, max_keys=limits.max_keys)
    return throttles
