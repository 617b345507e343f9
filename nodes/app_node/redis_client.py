"""How app-node opens Redis, for its rate limits and its health history.

redis-py is imported here on first use: an app-node without ``REDIS_URL`` (the
embedded default, and every test's) never loads it, which is a seventh of its
start-up imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

__all__ = ["connect", "redis_error"]


def connect(url: str, *, timeout_s: float, decode_responses: bool = False) -> redis.Redis:
    """A client of the Redis at ``url`` whose every call is bounded by ``timeout_s``."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
        # One immediate retry: a pooled connection gone stale (Redis restarted)
        # reconnects at once; a dead Redis still costs at most two timeouts.
        retry=Retry(NoBackoff(), 1), decode_responses=decode_responses)


def redis_error() -> type[Exception]:
    """redis-py's base error (a timeout, a refused connection, a reply it rejects)."""
    from redis.exceptions import RedisError

    return RedisError
