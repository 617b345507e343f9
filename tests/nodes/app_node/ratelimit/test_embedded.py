"""The embedded limiter on trio's virtual clock."""

from __future__ import annotations

import trio

from nodes.app_node.ratelimit import EmbeddedLimiter, Limits, Rate, make_limiter


async def test_burst_then_rate_on_trio_clock(autojump_clock: trio.testing.MockClock) -> None:
    limiter = EmbeddedLimiter()
    rate = Rate(per_second=4.0, burst=2)
    first = [await limiter.check("k", rate) for _ in range(3)]
    assert [d.allowed for d in first] == [True, True, False]
    await trio.sleep(first[-1].retry_after_s)
    assert (await limiter.check("k", rate)).allowed
    # Over a minute at twice the rate, about half get through: burst + 4/s · 60 s.
    allowed = 0
    for _ in range(480):
        await trio.sleep(0.125)
        allowed += (await limiter.check("k", rate)).allowed
    assert 240 <= allowed <= 242
    stats = limiter.statistics()
    assert stats.allowed == 3 + allowed and stats.keys == 1 and stats.backend_errors == 0


async def test_bounded_keys(autojump_clock: trio.testing.MockClock) -> None:
    limiter = EmbeddedLimiter(max_keys=10)
    rate = Rate(per_second=1.0, burst=1)
    for i in range(100):
        assert (await limiter.check(f"ip:10.0.0.{i}", rate)).allowed
    stats = limiter.statistics()
    assert stats.keys == 10 and stats.evictions == 90


def test_make_limiter_without_redis_is_embedded() -> None:
    assert isinstance(make_limiter(Limits(), None), EmbeddedLimiter)
    assert isinstance(make_limiter(Limits(), ""), EmbeddedLimiter)
