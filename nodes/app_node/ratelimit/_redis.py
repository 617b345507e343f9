"""The shared limiter: the same GCRA step, atomic in Redis through a Lua script.

Every app-node behind a balancer shares one TAT per key, so the limits hold
for the platform rather than per process. The step runs as one Lua script
(atomic: no two nodes interleave a read and a write of a key) and uses
Redis's own ``TIME``, so the nodes' clocks never have to agree. The script
is sent by ``EVALSHA``; on ``NOSCRIPT`` (a restarted or flushed Redis) it is
sent once with ``EVAL``, which caches it again.

Why the synchronous ``redis`` client in a worker thread rather than RESP
spoken over a trio socket: its connection pool, reconnects, RESP parsing and
``NoScriptError`` are well tested, and a call is bounded by the client's
socket timeouts (``timeout_s``), so a thread never hangs on a dead server.
Threads are capped by a :class:`trio.CapacityLimiter` (``max_threads``);
beyond it requests wait their turn in trio.

**When Redis is unreachable the limiter fails over to an in-process
:class:`EmbeddedLimiter`** (logged once per outage at WARNING, counted in
``statistics().backend_errors`` and ``fallback_decisions``). Failing closed
would turn a Redis outage into a full API outage; failing wide open would
leave the API unprotected exactly when something is already wrong. The
fallback still enforces the limits, per process instead of platform-wide.
After a failure Redis is not tried again for ``retry_interval_s``, so an
outage costs each request nothing but the embedded check.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from ..redis_client import connect, redis_error
from ._core import Decision, Rate
from ._embedded import EmbeddedLimiter, LimiterStatistics

if TYPE_CHECKING:
    import redis

__all__ = ["GCRA_LUA", "RedisLimiter", "run_script"]

log = logging.getLogger(__name__)

#: KEYS[1] = the key; ARGV = interval_us, burst. Returns {allowed, retry_after_us,
#: remaining}, all integers. Same arithmetic, in microseconds, as :func:`._core.gcra`.
GCRA_LUA = """
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat < now then tat = now end
local new_tat = tat + interval
local allow_at = new_tat - burst * interval
if now < allow_at then
  return {0, allow_at - now, 0}
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat),
           'PX', math.ceil((new_tat - now) / 1000) + 1)
local remaining = math.floor((now - allow_at) / interval)
if remaining > burst - 1 then remaining = burst - 1 end
return {1, 0, remaining}
"""

_GCRA_SHA = hashlib.sha1(GCRA_LUA.encode()).hexdigest()

T = TypeVar("T")


def run_script(client: redis.Redis, script: str, sha: str, keys: Sequence[str],
               args: Sequence[Any]) -> Any:
    """``EVALSHA``, then ``EVAL`` on ``NOSCRIPT`` (a restarted or flushed Redis)."""
    from redis.exceptions import NoScriptError  # loaded with the client

    try:
        return client.evalsha(sha, len(keys), *keys, *args)
    except NoScriptError:
        return client.eval(script, len(keys), *keys, *args)


def _gcra_step(client: redis.Redis, key: str, rate: Rate) -> Any:
    return run_script(client, GCRA_LUA, _GCRA_SHA, [key], [rate.interval_us, rate.burst])


class RedisLimiter:
    """GCRA per key in Redis, falling back to an in-process limiter when Redis is down."""

    def __init__(self, url: str, *, key_prefix: str = "cac:rl:", timeout_s: float = 0.5,
                 retry_interval_s: float = 1.0, max_threads: int = 32,
                 fallback_max_keys: int = 100_000) -> None:
        self._client = connect(url, timeout_s=timeout_s)
        self._redis_error = redis_error()
        self._prefix = key_prefix
        self._retry_interval_s = retry_interval_s
        self._threads = trio.CapacityLimiter(max_threads)
        self.fallback = EmbeddedLimiter(fallback_max_keys)
        self._down_until: float | None = None
        self._allowed = 0
        self._denied = 0
        self._backend_errors = 0
        self._fallback_decisions = 0

    async def call(self, fn: Callable[[redis.Redis, str], T]) -> T | None:
        """``fn(client, key_prefix)`` in a worker thread; None while Redis is unreachable.

        The one path to Redis (the GCRA step and the failure throttles share it): a
        failure is counted and logged once per outage, and Redis is left alone for
        ``retry_interval_s``; the caller then decides in process.
        """
        now = trio.current_time()
        if self._down_until is not None and now < self._down_until:
            return None
        try:
            reply = await trio.to_thread.run_sync(fn, self._client, self._prefix,
                                                  limiter=self._threads)
        except self._redis_error as error:
            self._backend_errors += 1
            if self._down_until is None:
                log.warning("rate limits: Redis unreachable (%s: %s); limiting per "
                            "process until it answers again", type(error).__name__, error)
            self._down_until = trio.current_time() + self._retry_interval_s
            return None
        if self._down_until is not None:
            log.warning("rate limits: Redis answers again; limits are shared again")
            self._down_until = None
        return reply

    async def check(self, key: str, rate: Rate) -> Decision:
        """Decide one request of ``key``: in Redis, or in process during an outage."""
        reply = await self.call(lambda client, prefix: _gcra_step(client, prefix + key, rate))
        if reply is not None:
            allowed, retry_after, remaining = reply
            decision = Decision(allowed=bool(allowed),
                                retry_after_s=int(retry_after) / 1_000_000,
                                remaining=int(remaining))
            if decision.allowed:
                self._allowed += 1
            else:
                self._denied += 1
            return decision
        self._fallback_decisions += 1
        return await self.fallback.check(key, rate)

    @property
    def redis_available(self) -> bool:
        """False while the limiter is in fallback after a failed call."""
        return self._down_until is None

    def statistics(self) -> LimiterStatistics:
        own = self.fallback.statistics()
        return LimiterStatistics(
            allowed=self._allowed + own.allowed, denied=self._denied + own.denied,
            keys=own.keys, evictions=own.evictions, backend_errors=self._backend_errors,
            fallback_decisions=self._fallback_decisions)

    def close(self) -> None:
        """Close the client's connections (idempotent)."""
        self._client.close()
