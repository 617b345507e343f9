"""Rate limits of app-node's API: per bearer token and per client IP (issue 13).

A sans-IO GCRA core (:mod:`._core`), an in-process limiter on trio's clock
(:mod:`._embedded`), a shared limiter atomic in Redis (:mod:`._redis`, used
when ``REDIS_URL`` is set; it falls back to in-process limits while Redis is
down) and an ASGI middleware answering 429 with ``Retry-After``
(:mod:`._middleware`). See README.md.
"""

from ._core import Decision, GcraTable, Rate, gcra
from ._embedded import EmbeddedLimiter, Limiter, LimiterStatistics
from ._middleware import KeyFunc, Limits, RateLimitMiddleware, key_by_token_or_ip, make_limiter
from ._redis import RedisLimiter

__all__ = [
    "Decision",
    "EmbeddedLimiter",
    "GcraTable",
    "KeyFunc",
    "Limiter",
    "LimiterStatistics",
    "Limits",
    "Rate",
    "RateLimitMiddleware",
    "RedisLimiter",
    "gcra",
    "key_by_token_or_ip",
    "make_limiter",
]

