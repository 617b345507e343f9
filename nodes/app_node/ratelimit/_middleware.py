"""Limits settings, the limiter factory and the ASGI middleware answering 429.

The middleware asks the limiter once per HTTP request, before the app sees it.
A request with ``Authorization: Bearer <token>`` is limited by its token (the
per-token rate); one without, by its client IP (the per-IP rate). The token
itself never becomes a key: its SHA-256 does, so neither the process nor Redis
holds a usable bearer token.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ._core import Rate
from ._embedded import EmbeddedLimiter, Limiter
from ._redis import RedisLimiter

__all__ = ["KeyFunc", "Limits", "RateLimitMiddleware", "key_by_token_or_ip", "make_limiter"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: scope → (key, rate) to limit the request by, or ``None`` to let it through unlimited.
KeyFunc = Callable[[Scope], "tuple[str, Rate] | None"]


class Limits(BaseModel):
    """app-node's rate limits (part of its settings)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Requests by one bearer token.
    per_token: Rate = Rate(per_second=10.0, burst=50)
    #: Requests without a token, by client IP (login, public endpoints).
    per_ip: Rate = Rate(per_second=5.0, burst=20)
    #: Keys held in process (the embedded limiter, or Redis's fallback); LRU beyond.
    max_keys: int = Field(default=100_000, ge=1)


def make_limiter(settings: Limits, redis_url: str | None) -> Limiter:
    """A :class:`RedisLimiter` when ``redis_url`` (``REDIS_URL``) is set, else embedded."""
    if redis_url:
        return RedisLimiter(redis_url, fallback_max_keys=settings.max_keys)
    return EmbeddedLimiter(settings.max_keys)


def _bearer_token(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            if scheme.lower() == "bearer" and token:
                return token
            return None
    return None


def key_by_token_or_ip(limits: Limits) -> KeyFunc:
    """The default key: ``token:<sha256>`` at ``per_token``, else ``ip:<addr>`` at ``per_ip``."""

    def key_func(scope: Scope) -> tuple[str, Rate] | None:
        token = _bearer_token(scope)
        if token is not None:
            digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:32]
            return f"token:{digest}", limits.per_token
        client = scope.get("client")
        host = client[0] if client else "unknown"
        return f"ip:{host}", limits.per_ip

    return key_func


class RateLimitMiddleware:
    """Answers 429 ``rate_limited`` with ``Retry-After`` once a key is over its rate."""

    def __init__(self, app: ASGIApp, limiter: Limiter, key_func: KeyFunc) -> None:
        self.app = app
        self.limiter = limiter
        self.key_func = key_func

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        keyed = self.key_func(scope)
        if keyed is None:
            await self.app(scope, receive, send)
            return
        key, rate = keyed
        decision = await self.limiter.check(key, rate)
        if decision.allowed:
            await self.app(scope, receive, send)
            return
        retry_after = decision.retry_after_header
        body = json.dumps({"error": {
            "code": "rate_limited",
            "message": f"too many requests; retry in {retry_after} s",
        }}).encode()
        await send({"type": "http.response.start", "status": 429, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", retry_after.encode()),
        ]})
        await send({"type": "http.response.body", "body": body})
