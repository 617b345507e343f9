"""The ASGI middleware through httpx's ASGITransport, on trio's virtual clock."""

from __future__ import annotations

import httpx
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
    key_by_token_or_ip,
)

LIMITS = Limits(per_token=Rate(per_second=1.0, burst=3), per_ip=Rate(per_second=0.25, burst=2))


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def client(limiter: EmbeddedLimiter, ip: str = "192.0.2.7") -> httpx.AsyncClient:
    app = RateLimitMiddleware(Starlette(routes=[Route("/api/hello", hello)]), limiter,
                              key_by_token_or_ip(LIMITS))
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
        assert error["code"] == "rate_limited" and "4 s" in error["message"]
        await trio.sleep(4)
        assert (await http.get("/api/hello")).status_code == 200
    async with client(limiter, ip="192.0.2.8") as other:  # another IP: its own budget
        assert (await other.get("/api/hello")).status_code == 200


async def test_bearer_token_is_the_key_when_present(
        autojump_clock: trio.testing.MockClock) -> None:
    limiter = EmbeddedLimiter()
    async with client(limiter) as http:
        token_a = {"Authorization": "Bearer token-a"}
        codes = [(await http.get("/api/hello", headers=token_a)).status_code
                 for _ in range(4)]
        assert codes == [200, 200, 200, 429]  # per_token burst is 3
        # Another token from the same IP has its own budget; so has the IP itself.
        token_b = {"Authorization": "Bearer token-b"}
        assert (await http.get("/api/hello", headers=token_b)).status_code == 200
        assert (await http.get("/api/hello")).status_code == 200
        refused = await http.get("/api/hello", headers=token_a)
        assert refused.headers["retry-after"] == "1"
    # The raw token is never a key: only its hash.
    keys = list(limiter._table._tats)
    assert all("token-a" not in key for key in keys)
    assert sum(key.startswith("token:") for key in keys) == 2


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
    key_func = key_by_token_or_ip(LIMITS)
    scope = {"type": "http", "client": ("198.51.100.1", 1),
             "headers": [(b"authorization", b"Basic abc")]}
    assert key_func(scope) == ("ip:198.51.100.1", LIMITS.per_ip)
    scope["headers"] = [(b"authorization", b"Bearer ")]
    assert key_func(scope) == ("ip:198.51.100.1", LIMITS.per_ip)
    scope["client"] = None
    assert key_func(scope) == ("ip:unknown", LIMITS.per_ip)
