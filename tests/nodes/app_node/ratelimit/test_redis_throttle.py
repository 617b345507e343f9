"""The failure throttles shared in Redis, against a real redis-server: the same
answers as in process, shared by every app-node, and in process during an outage."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from nodes.app_node.ratelimit import (
    Backoff,
    EmbeddedLimiter,
    EmbeddedThrottle,
    Limits,
    RedisLimiter,
    RedisThrottle,
    ThrottlePolicy,
    make_throttles,
)

from ..redis_server import RedisServer, needs_redis

pytestmark = needs_redis

POLICY = ThrottlePolicy(per_source=Backoff(free_failures=2, base_s=10, max_s=80, forget_s=600),
                        per_account=Backoff(free_failures=4, base_s=10, max_s=60,
                                            forget_s=600))
USER, HOME = "user@example.com", "198.51.100.7"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def limiters(redis_server: RedisServer) -> Iterator[tuple[RedisLimiter, RedisLimiter]]:
    one = RedisLimiter(redis_server.url, retry_interval_s=0.2)
    two = RedisLimiter(redis_server.url, retry_interval_s=0.2)
    yield one, two
    one.close()
    two.close()


#: (action, account, source) steps; after each, the waits asked of both throttles.
STEPS = [("fail", USER, "192.0.2.1")] * 4 + [
    ("fail", USER, "192.0.2.2"), ("fail", USER, "192.0.2.3"),
    ("succeed", USER, HOME), ("fail", USER, "192.0.2.4"),
    ("succeed", USER, "192.0.2.1"), ("fail", "other@example.com", "192.0.2.1"),
]
ASKED = [(USER, "192.0.2.1"), (USER, "192.0.2.9"), (USER, HOME),
         ("other@example.com", "192.0.2.1")]


async def test_redis_answers_as_the_process_does(limiters) -> None:
    shared = RedisThrottle("login", limiters[0], POLICY, Clock())
    local = EmbeddedThrottle(POLICY, Clock())
    for action, account, source in STEPS:
        for throttle in (shared, local):
            if action == "fail":
                await throttle.failed(account, source)
            else:
                await throttle.succeeded(account, source)
        for account, source in ASKED:
            # Redis's clock moves on a little during the test; waits are ≥ 10 s steps
            assert await shared.wait_s(account, source) == pytest.approx(
                await local.wait_s(account, source), abs=1.0), (action, account, source)
    assert limiters[0].statistics().backend_errors == 0


async def test_every_app_node_counts_a_guessers_failures_together(
        limiters, redis_server: RedisServer) -> None:
    one = RedisThrottle("login", limiters[0], POLICY, Clock())
    two = RedisThrottle("login", limiters[1], POLICY, Clock())
    for throttle in (one, two, one):
        await throttle.failed(USER, "192.0.2.1")
    assert 9 < await two.wait_s(USER, "192.0.2.1") <= 10  # 3rd failure: 10 s, on both
    assert await one.wait_s(USER, "192.0.2.1") > 9
    # another throttle's name is another table
    other = RedisThrottle("reset_email", limiters[1], POLICY, Clock())
    assert await other.wait_s(USER, "192.0.2.1") == 0
    client = redis_server.client()
    try:
        keys = [key.decode() for key in client.keys("*")]
        assert keys and all(key.startswith("cac:rl:th:login:") for key in keys)
        assert not any("example" in key for key in keys)  # digests, no address book
        assert all(0 < client.pttl(key) <= 600_000 for key in keys)  # forgotten in time
    finally:
        client.close()


async def test_an_outage_falls_back_to_the_process(limiters,
                                                  redis_server: RedisServer) -> None:
    throttle = RedisThrottle("login", limiters[0], POLICY, Clock())
    redis_server.stop()
    with trio.fail_after(10):
        for _ in range(3):
            await throttle.failed(USER, "192.0.2.1")
        assert await throttle.wait_s(USER, "192.0.2.1") == 10  # still enforced
    assert not limiters[0].redis_available
    assert limiters[0].statistics().backend_errors == 1  # then left alone a while


def test_make_throttles_shares_redis_when_the_limiter_does(limiters) -> None:
    shared = make_throttles(Limits(), limiters[0], Clock())
    assert {type(t) for t in shared.values()} == {RedisThrottle}
    local = make_throttles(Limits(), EmbeddedLimiter(), Clock())
    assert {type(t) for t in local.values()} == {EmbeddedThrottle}
    assert set(shared) == set(local) == {"login", "reset_email", "token_guess"}
