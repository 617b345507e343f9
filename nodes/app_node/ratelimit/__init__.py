"""Rate limits of app-node's API: per verified bearer token and per client address,
and failure throttles with backoff for logins, reset emails and token guesses
(:mod:`._backoff`, driven in process or in Redis by :mod:`._throttles`).

A sans-IO GCRA core (:mod:`._core`), an in-process limiter on trio's clock
(:mod:`._embedded`), a shared limiter atomic in Redis (:mod:`._redis`, used
when ``REDIS_URL`` is set; it falls back to in-process limits while Redis is
down) and an ASGI middleware answering 429 with ``Retry-After``
(:mod:`._middleware`). See README.md.
"""

from ._backoff import Backoff, BackoffTable, Throttle, ThrottlePolicy
from ._core import Decision, GcraTable, Rate, gcra
from ._embedded import EmbeddedLimiter, Limiter, LimiterStatistics
from ._middleware import (
    KeyFunc,
    Limits,
    RateLimitMiddleware,
    VerifiedTokens,
    address_key,
    client_of,
    key_by_session_or_ip,
    make_limiter,
    token_hash,
)
from ._redis import RedisLimiter
from ._throttles import EmbeddedThrottle, FailureThrottle, RedisThrottle, make_throttles

__all__ = [
    "Backoff",
    "BackoffTable",
    "Decision",
    "EmbeddedLimiter",
    "EmbeddedThrottle",
    "FailureThrottle",
    "GcraTable",
    "KeyFunc",
    "Limiter",
    "LimiterStatistics",
    "Limits",
    "Rate",
    "RateLimitMiddleware",
    "RedisLimiter",
    "RedisThrottle",
    "Throttle",
    "ThrottlePolicy",
    "VerifiedTokens",
    "address_key",
    "client_of",
    "gcra",
    "key_by_session_or_ip",
    "make_limiter",
    "make_throttles",
    "token_hash",
]

