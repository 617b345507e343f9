"""The Redis limiter against a real redis-server (started here, on a free loopback port).

Skipped only when redis-server is not installed and ``CI`` is unset (see
``tests/nodes/app_node/redis_server.py``).
Waits are real but bounded: each on a condition, under an overall deadline.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import trio

from nodes.app_node.ratelimit import Limits, Rate, RedisLimiter, make_limiter

from ..redis_server import RedisServer, needs_redis

pytestmark = needs_redis


@pytest.fixture
def limiter(redis_server: RedisServer) -> Iterator[RedisLimiter]:
    limiter = RedisLimiter(redis_server.url, retry_interval_s=0.2)
    yield limiter
    limiter.close()


async def test_burst_then_refusal_with_retry_after(redis_server: RedisServer,
                                                   limiter: RedisLimiter) -> None:
    rate = Rate(per_second=0.5, burst=3)  # slow: the test cannot outrun it
    decisions = [await limiter.check("token:abc", rate) for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    assert 1.5 < decisions[-1].retry_after_s <= 2.0
    assert decisions[-1].retry_after_header == "2"
    client = redis_server.client()
    try:
        assert client.exists("cac:rl:token:abc")
        assert 0 < client.pttl("cac:rl:token:abc") <= 6001  # expires once idle: no leak
    finally:
        client.close()
    assert limiter.statistics().backend_errors == 0


async def test_concurrent_checks_are_atomic(redis_server: RedisServer,
                                            limiter: RedisLimiter) -> None:
    """50 requests at once from two 'app-nodes' sharing Redis: exactly the burst passes."""
    other = RedisLimiter(redis_server.url)
    rate = Rate(per_second=0.1, burst=10)
    results: list[bool] = []

    async def one(which: RedisLimiter) -> None:
        results.append((await which.check("ip:10.0.0.1", rate)).allowed)

    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(one, limiter if i % 2 else other)
    finally:
        other.close()
    assert len(results) == 50 and sum(results) == 10


async def test_noscript_falls_back_to_eval(redis_server: RedisServer,
                                          limiter: RedisLimiter) -> None:
    rate = Rate(per_second=0.1, burst=2)
    assert (await limiter.check("k", rate)).allowed
    client = redis_server.client()
    try:
        client.script_flush()
    finally:
        client.close()
    assert (await limiter.check("k", rate)).allowed  # EVALSHA → NOSCRIPT → EVAL
    assert not (await limiter.check("k", rate)).allowed
    assert limiter.statistics().backend_errors == 0


async def test_redis_killed_mid_test_fails_over_to_process_limits(
        redis_server: RedisServer, limiter: RedisLimiter,
        caplog: pytest.LogCaptureFixture) -> None:
    rate = Rate(per_second=0.1, burst=2)
    assert (await limiter.check("k", rate)).allowed
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="nodes.app_node.ratelimit._redis"):
        with trio.fail_after(10):
            during = [await limiter.check("k", rate) for _ in range(3)]
    # Fail over, not open: the in-process limiter still enforces the burst.
    assert [d.allowed for d in during] == [True, True, False]
    assert not limiter.redis_available
    stats = limiter.statistics()
    assert stats.backend_errors == 1  # then Redis is left alone for retry_interval_s
    assert stats.fallback_decisions == 3
    assert sum("Redis unreachable" in r.getMessage() for r in caplog.records) == 1

    redis_server.start()
    with trio.fail_after(10):
        while True:
            await trio.sleep(0.05)
            fresh = await limiter.check("k2", rate)
            if limiter.redis_available:
                break
    assert fresh.allowed and fresh.remaining == 1  # answered by the new, empty Redis
    assert "answers again" in caplog.records[-1].getMessage()


async def test_make_limiter_with_redis_url(redis_server: RedisServer) -> None:
    limiter = make_limiter(Limits(), redis_server.url)
    try:
        assert isinstance(limiter, RedisLimiter)
        assert (await limiter.check("k", Limits().per_ip)).allowed
    finally:
        limiter.close()
