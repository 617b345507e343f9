"""Limits settings, the limiter factory and the ASGI middleware answering 429.

The middleware asks the limiter once per HTTP request, before the app sees it.
A request whose bearer token app-node *verified* lately (:class:`VerifiedTokens`,
filled by the session check) is limited by its token (the per-token rate);
every other request (no token, a malformed header, a token never verified or
made up) by its client's address (the per-IP rate): sending ``Authorization:
Bearer <random>`` buys no fresh bucket. A valid token's
first request after a restart counts against its address; the next ones
against the token. The token itself never becomes a key: its SHA-256 does, so
neither the process nor Redis holds a usable bearer token.

The client's address is the TCP peer's, unless the peer is one of
``Limits.trusted_proxies`` (the entry point, Caddy): then ``X-Forwarded-For``
is walked from the right past the trusted hops (:mod:`nodes.kit.forwarded`), so
behind the door each client has its own bucket and a client's own header,
sent straight to app-node, is ignored. An IPv6 client is keyed by
its /64, the block one subscriber usually holds.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nodes.app_node import codes
from nodes.kit.forwarded import ProxyList, TrustedProxies, client_address

from ._backoff import Backoff, ThrottlePolicy
from ._core import Rate
from ._embedded import EmbeddedLimiter, Limiter
from ._redis import RedisLimiter

__all__ = ["KeyFunc", "Limits", "RateLimitMiddleware", "VerifiedTokens", "address_key",
           "client_of", "key_by_session_or_ip", "make_limiter", "token_hash"]

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
    #: Proxies whose ``X-Forwarded-For`` names the client (IP addresses or
    #: CIDRs; ``cosmicac up`` and ``bootstrap`` set the entry point's). Empty:
    #: the TCP peer is the client, and the header is ignored.
    trusted_proxies: ProxyList = ()
    #: Failed logins: per (email, address), with a ceiling per email that
    #: addresses which logged in to the account before are exempt from.
    login: ThrottlePolicy = ThrottlePolicy()
    #: Password-reset emails asked, per (email, address) and per email.
    reset_email: ThrottlePolicy = ThrottlePolicy(
        per_source=Backoff(free_failures=3, base_s=60.0, max_s=3600.0),
        per_account=Backoff(free_failures=10, base_s=60.0, max_s=3600.0))
    #: Tokens that were no invitation or reset link, per address (no ceiling: a
    #: guess names no account, and one for all would let a guesser stop invitees).
    token_guess: ThrottlePolicy = ThrottlePolicy(
        per_source=Backoff(free_failures=10, base_s=1.0, max_s=300.0), per_account=None)

    def proxies(self) -> TrustedProxies:
        """``trusted_proxies``, parsed (once per distinct list)."""
        return _trusted(self.trusted_proxies)


@functools.lru_cache(maxsize=16)
def _trusted(entries: tuple[str, ...]) -> TrustedProxies:
    return TrustedProxies(entries)


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


def token_hash(token: str) -> str:
    """SHA-256 of a bearer token, hex (what app-node's store keeps: ``auth.hash_token``)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class VerifiedTokens:
    """Hashes of bearer tokens app-node verified lately: only these get their own bucket.

    The session check adds a token once it is valid; the middleware asks. An
    entry lives ``ttl_s`` (60 s) and the set holds at most ``max_entries``
    (least recently used forgotten: that token's next request counts against
    its address again, then is verified and added back). It only chooses a
    bucket: every request's token is still checked by its route, so a token
    revoked within the TTL keeps its bucket for that long, never its access.
    """

    def __init__(self, *, ttl_s: float = 60.0, max_entries: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def add(self, token_hash: str) -> None:
        self._until[token_hash] = self._clock() + self.ttl_s
        self._until.move_to_end(token_hash)
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)

    def discard(self, token_hash: str) -> None:
        self._until.pop(token_hash, None)

    def __contains__(self, token_hash: object) -> bool:
        until = self._until.get(token_hash) if isinstance(token_hash, str) else None
        if until is None:
            return False
        if self._clock() >= until:
            del self._until[token_hash]  # type: ignore[arg-type]
            return False
        return True

    def __len__(self) -> int:
        return len(self._until)


def client_of(scope: Scope, trusted: TrustedProxies) -> str:
    """The request's client address (``unknown`` without one), through trusted proxies."""
    client = scope.get("client")
    forwarded = [value for name, value in scope.get("headers") or ()
                 if name.lower() == b"x-forwarded-for"]
    return client_address(client[0] if client else None, forwarded, trusted) or "unknown"


def address_key(address: str) -> str:
    """The bucket of an address: itself for IPv4, its /64 for IPv6."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def key_by_session_or_ip(limits: Limits, verified: VerifiedTokens | None = None) -> KeyFunc:
    """The default key: ``token:<sha256>`` at ``per_token`` for a verified token, else
    ``ip:<client address>`` at ``per_ip``.

    Args:
        limits: the rates and the trusted proxies.
        verified: the tokens verified lately; None: every request is keyed by address.
    """
    trusted = limits.proxies()

    def key_func(scope: Scope) -> tuple[str, Rate] | None:
        token = _bearer_token(scope)
        if token is not None and verified is not None:
            digest = token_hash(token)
            if digest in verified:
                return f"token:{digest[:32]}", limits.per_token
        return f"ip:{address_key(client_of(scope, trusted))}", limits.per_ip

    return key_func


class RateLimitMiddleware:
    """Answers 429 ``RATE_LIMITED`` with ``Retry-After`` once a key is over its rate."""

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
            "code": codes.RATE_LIMITED,
            "message": f"too many requests; retry in {retry_after} s",
        }}).encode()
        await send({"type": "http.response.start", "status": 429, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", retry_after.encode()),
        ]})
        await send({"type": "http.response.body", "body": body})
