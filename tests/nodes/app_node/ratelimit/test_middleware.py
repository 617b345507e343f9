"""The ASGI middleware through httpx's ASGITransport, on trio's virtual clock.

Which bucket a request lands in: a verified
session's own, else its client's address, read through trusted proxies only."""

from __future__ import annotations

import httpx
import pytest
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from nodes.app_node.ratelimit import (
    EmbeddedLimiter,
    Limits,
    Rate,
    RateLimitMiddleware,
    VerifiedTokens,
    key_by_session_or_ip,
    token_hash,
)

LIMITS = Limits(per_token=Rate(per_second=1.0, burst=3), per_ip=Rate(per_second=0.25, burst=2))
#: The door (the entry point, or Caddy) at 10.0.0.5; app-node trusts it.
BEHIND_DOOR = LIMITS.model_copy(update={"trusted_proxies": ("10.0.0.5", "fd00::/8")})


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def client(limiter: EmbeddedLimiter, ip: str = "192.0.2.7", *, limits: Limits = LIMITS,
           verified: VerifiedTokens | None = None) -> httpx.AsyncClient:
    app = RateLimitMiddleware(Starlette(routes=[Route("/api/hello", hello)]), limiter,
                              key_by_session_or_ip(limits, verified))
    transport = httpx.ASGITransport(app=app, client=(ip, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://app-node")


async def test_per_ip_limit_answers_429_with_retry_after(
        autojump_clock: trio.testing.MockClock) -> None:
    limiter = EmbeddedLimiter()
    async with client(limiter) as http:
        codes = [(await http.get("/api/hello")).status_code for _ in range(2)]
        refused = await http.get("/api/hello")
        assert codes == [200, 200]
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "4"  # 1 / 0.25 per second
        assert refused.headers["content-type"] == "application/json"
        error = refused.json()["error"]
        assert error["code"] == "RATE_LIMITED" and "4 s" in error["message"]
        await trio.sleep(4)
        assert (await http.get("/api/hello")).status_code == 200
    async with client(limiter, ip="192.0.2.8") as other:  # another IP: its own budget
        assert (await other.get("/api/hello")).status_code == 200


async def test_a_verified_token_is_the_key(autojump_clock: trio.testing.MockClock) -> None:
    limiter, verified = EmbeddedLimiter(), VerifiedTokens(clock=trio.current_time)
    verified.add(token_hash("token-a"))
    verified.add(token_hash("token-b"))
    async with client(limiter, verified=verified) as http:
        token_a = {"Authorization": "Bearer token-a"}
        codes = [(await http.get("/api/hello", headers=token_a)).status_code
                 for _ in range(4)]
        assert codes == [200, 200, 200, 429]  # per_token burst is 3
        # Another verified token from the same IP has its own budget; so has the IP.
        token_b = {"Authorization": "Bearer token-b"}
        assert (await http.get("/api/hello", headers=token_b)).status_code == 200
        assert (await http.get("/api/hello")).status_code == 200
        refused = await http.get("/api/hello", headers=token_a)
        assert refused.headers["retry-after"] == "1"
    # The raw token is never a key: only its hash.
    keys = list(limiter._table._tats)
    assert all("token-a" not in key for key in keys)
    assert sum(key.startswith("token:") for key in keys) == 2


async def test_made_up_bearer_tokens_share_the_address_bucket(
        autojump_clock: trio.testing.MockClock) -> None:
    """Regression: each ``Bearer <random>`` used to get a fresh bucket."""
    limiter, verified = EmbeddedLimiter(), VerifiedTokens(clock=trio.current_time)
    async with client(limiter, verified=verified) as http:
        codes = [(await http.get("/api/hello", headers={"Authorization": f"Bearer r{i}"}))
                 .status_code for i in range(3)]
        assert codes == [200, 200, 429]  # the address's burst of 2, then refused
        assert (await http.get("/api/hello")).status_code == 429  # the same bucket
    assert list(limiter._table._tats) == ["ip:192.0.2.7"]


async def test_a_verified_token_falls_back_to_the_address_after_its_ttl(
        autojump_clock: trio.testing.MockClock) -> None:
    verified = VerifiedTokens(ttl_s=60, clock=trio.current_time)
    verified.add(token_hash("token-a"))
    key_func = key_by_session_or_ip(LIMITS, verified)
    scope = {"type": "http", "client": ("192.0.2.7", 1),
             "headers": [(b"authorization", b"Bearer token-a")]}
    assert key_func(scope)[0].startswith("token:")
    await trio.sleep(60)
    assert key_func(scope)[0] == "ip:192.0.2.7"
    assert len(verified) == 0


async def test_clients_behind_a_trusted_door_have_their_own_buckets(
        autojump_clock: trio.testing.MockClock) -> None:
    """Regression: behind the door every client shared the door's bucket."""
    limiter = EmbeddedLimiter()
    async with client(limiter, "10.0.0.5", limits=BEHIND_DOOR) as door:
        one = {"X-Forwarded-For": "198.51.100.1"}
        two = {"X-Forwarded-For": "198.51.100.2"}
        assert [(await door.get("/api/hello", headers=one)).status_code
                for _ in range(3)] == [200, 200, 429]
        # another client through the same door is not refused
        assert (await door.get("/api/hello", headers=two)).status_code == 200
    assert set(limiter._table._tats) == {"ip:198.51.100.1", "ip:198.51.100.2"}


async def test_a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored(
        autojump_clock: trio.testing.MockClock) -> None:
    limiter = EmbeddedLimiter()
    async with client(limiter, "192.0.2.66", limits=BEHIND_DOOR) as direct:
        codes = [(await direct.get("/api/hello",
                                   headers={"X-Forwarded-For": f"203.0.113.{i}"})).status_code
                 for i in range(3)]
    assert codes == [200, 200, 429]
    assert list(limiter._table._tats) == ["ip:192.0.2.66"]


@pytest.mark.parametrize(("peer", "forwarded", "key"), [
    # untrusted peer: the header is the client's own word
    ("192.0.2.66", [b"203.0.113.9"], "ip:192.0.2.66"),
    # the door: the rightmost untrusted entry
    ("10.0.0.5", [b"203.0.113.9"], "ip:203.0.113.9"),
    ("10.0.0.5", [b"6.6.6.6, 203.0.113.9"], "ip:203.0.113.9"),
    ("10.0.0.5", [b"6.6.6.6", b"203.0.113.9, 10.0.0.5"], "ip:203.0.113.9"),
    # nothing forwarded: the door itself
    ("10.0.0.5", [], "ip:10.0.0.5"),
    # garbage from the door's client: the door is all that is known
    ("10.0.0.5", [b"not-an-ip"], "ip:10.0.0.5"),
    # IPv6 clients by /64; an IPv4-mapped peer is its IPv4 address
    ("10.0.0.5", [b"2001:db8:1:2:aaaa::1"], "ip:2001:db8:1:2::/64"),
    ("fd00::1", [b"2001:db8:1:2::7"], "ip:2001:db8:1:2::/64"),
    ("::ffff:192.0.2.66", [], "ip:192.0.2.66"),
])
def test_the_address_key_through_trusted_proxies(peer: str, forwarded: list[bytes],
                                                 key: str) -> None:
    key_func = key_by_session_or_ip(BEHIND_DOOR)
    scope = {"type": "http", "client": (peer, 1),
             "headers": [(b"x-forwarded-for", value) for value in forwarded]}
    assert key_func(scope) == (key, BEHIND_DOOR.per_ip)


async def test_key_func_none_and_non_http_pass_through() -> None:
    seen: list[str] = []

    async def app(scope, receive, send) -> None:
        seen.append(scope["type"])

    middleware = RateLimitMiddleware(app, EmbeddedLimiter(), lambda scope: None)
    for _ in range(10):
        await middleware({"type": "http", "headers": []}, None, None)  # type: ignore[arg-type]
    await middleware({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["http"] * 10 + ["lifespan"]


def test_malformed_authorization_falls_back_to_ip() -> None:
    key_func = key_by_session_or_ip(LIMITS, VerifiedTokens())
    scope = {"type": "http", "client": ("198.51.100.1", 1),
             "headers": [(b"authorization", b"Basic abc")]}
    assert key_func(scope) == ("ip:198.51.100.1", LIMITS.per_ip)
    scope["headers"] = [(b"authorization", b"Bearer ")]
    assert key_func(scope) == ("ip:198.51.100.1", LIMITS.per_ip)
    scope["client"] = None
    assert key_func(scope) == ("ip:unknown", LIMITS.per_ip)
