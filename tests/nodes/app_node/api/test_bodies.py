"""Request bodies are bounded on every route: in size
(a declared Content-Length beyond the route's limit is refused before a byte is
read, a chunked body the moment it passes it), in how many are read at once
(503 ``SERVER_BUSY`` with Retry-After beyond), in time, and in JSON depth
(400 ``JSON_TOO_DEEP``, never a 500)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from nodes.app_node.api import ROUTES, BodyLimits
from nodes.app_node.api._body import parse_json
from nodes.app_node.api._common import ApiError

from .apis import PASSWORD, Api, bearer, make_api

LIMIT = 64 * 1024
CHUNK = 16 * 1024
BODY_ROUTES = [r for r in ROUTES if r.body is not None]


class Counting:
    """An ASGI wrapper counting the body bytes the app pulled through ``receive``."""

    def __init__(self, app) -> None:
        self.app = app
        self.pulled = 0

    async def __call__(self, scope, receive, send) -> None:
        async def counted():
            message = await receive()
            self.pulled += len(message.get("body", b""))
            return message
        await self.app(scope, counted, send)


async def _chunks(total: int) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        yield b" " * CHUNK  # whitespace: valid JSON padding, however much is read
        sent += CHUNK


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Api]:
    async for api in make_api(tmp_path, body_limits=BodyLimits(max_body_bytes=LIMIT)):
        yield api


def _concrete(path: str, ids: dict[str, str]) -> str:
    return "/api" + re.sub(r"\{(\w+)(:\w+)?\}", lambda m: ids.get(m.group(1), "x1"), path)


async def _ids(api: Api) -> tuple[str, dict[str, str]]:
    token = await api.signup()
    me = (await api.client.get("/api/me", headers=bearer(token))).json()
    return token, {"team": me["active_team"], "user": me["user"]["id"]}


@pytest.mark.parametrize("route", BODY_ROUTES, ids=lambda r: f"{r.method} {r.path}")
async def test_every_body_route_stops_reading_at_its_limit(small: Api, route) -> None:
    token, ids = await _ids(small)
    counting = Counting(small.client._transport.app)  # type: ignore[attr-defined]
    transport = httpx.ASGITransport(app=counting)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        url = _concrete(route.path, ids)
        # chunked: no Content-Length, so only counting can stop it
        r = await client.request(route.method, url, headers=bearer(token),
                                 content=_chunks(16 * LIMIT))
        # the signed-up admin is an operator and owns the team: every route reads its body
        assert r.status_code == 413, r.text
        assert counting.pulled <= LIMIT + CHUNK
        assert r.json()["error"]["code"] == "BODY_TOO_LARGE"
        assert r.headers["connection"] == "close"
        # declared: refused from the header alone, nothing read
        counting.pulled = 0
        r = await client.request(route.method, url, headers=bearer(token),
                                 content=b" " * (LIMIT + 1))
        assert r.status_code == 413, r.text
        assert counting.pulled == 0


async def test_the_open_routes_refuse_a_big_body_before_any_work(small: Api) -> None:
    """Regression: app-node read any body whole (a 256 MiB POST cost it 512 MB)."""
    counting = Counting(small.client._transport.app)  # type: ignore[attr-defined]
    transport = httpx.ASGITransport(app=counting)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for route in [r for r in BODY_ROUTES if not r.auth]:
            counting.pulled = 0
            r = await client.request(route.method, "/api" + route.path,
                                     content=_chunks(64 * LIMIT))
            assert r.status_code == 413, (route.path, r.text)
            assert counting.pulled <= LIMIT + CHUNK


async def test_a_route_may_name_its_own_limit(tmp_path: Path, monkeypatch) -> None:
    from nodes.app_node.api import _app
    login = next(r for r in ROUTES if r.path == "/auth/login")
    import dataclasses
    monkeypatch.setattr(_app, "ROUTES", [dataclasses.replace(login, max_body_bytes=100)
                                         if r is login else r for r in ROUTES])
    async for api in make_api(tmp_path):
        r = await api.client.post("/api/auth/login", content=b" " * 101)
        assert r.status_code == 413 and "100 bytes" in r.json()["error"]["message"]


async def _stalled_login(api: Api, release: trio.Event, both: trio.Event,
                         started: list[int]) -> None:
    async def stalled() -> AsyncIterator[bytes]:
        yield b'{"email": "a@example.com",'
        started.append(1)
        if len(started) == 2:
            both.set()
        await release.wait()
        yield b' "password": "x"}'

    r = await api.client.post("/api/auth/login", content=stalled())
    assert r.status_code == 401  # answered once the body arrived


async def test_bodies_read_at_once_are_bounded(tmp_path: Path) -> None:
    limits = BodyLimits(max_bodies_in_flight=2, retry_after_s=3)
    async for api in make_api(tmp_path, body_limits=limits):
        release, both, started = trio.Event(), trio.Event(), []
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(_stalled_login, api, release, both, started)
                await both.wait()
                r = await api.client.post("/api/auth/login", json={
                    "email": "b@example.com", "password": PASSWORD})
                assert r.status_code == 503
                assert r.json()["error"]["code"] == "SERVER_BUSY"
                assert r.headers["retry-after"] == "3"
                release.set()
            # the slots are free again
            r = await api.client.post("/api/auth/login", json={
                "email": "b@example.com", "password": PASSWORD})
            assert r.status_code == 401


async def test_a_body_that_never_arrives_times_out(tmp_path: Path) -> None:
    async for api in make_api(tmp_path, body_limits=BodyLimits(body_timeout_s=0.2)):
        async def never() -> AsyncIterator[bytes]:
            yield b"{"
            await trio.sleep_forever()

        with trio.fail_after(30):
            r = await api.client.post("/api/auth/login", content=never())
        assert r.status_code == 408 and r.json()["error"]["code"] == "BODY_TIMEOUT"


# -- JSON depth -----------------------------------------------------------------------


async def test_json_nested_100000_deep_is_a_400_not_a_500(api: Api, caplog) -> None:
    """Regression: the parser's RecursionError was a 500 and a traceback."""
    deep = b"[" * 100_000 + b"]" * 100_000
    r = await api.client.post("/api/auth/login", content=deep)
    assert r.status_code == 400 and r.json()["error"]["code"] == "JSON_TOO_DEEP"
    assert not [rec for rec in caplog.records if rec.exc_info]


@pytest.mark.parametrize("route", BODY_ROUTES, ids=lambda r: f"{r.method} {r.path}")
async def test_every_body_route_refuses_deep_json(api: Api, route) -> None:
    token, ids = await _ids(api)
    deep = b'{"a":' * 5000 + b"1" + b"}" * 5000
    r = await api.client.request(route.method, _concrete(route.path, ids),
                                 headers=bearer(token), content=deep)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "JSON_TOO_DEEP"


def test_parse_json_refuses_only_beyond_the_depth() -> None:
    assert parse_json(b"[" * 64 + b"]" * 64, 64) is not None
    with pytest.raises(ApiError) as caught:
        parse_json(b"[" * 65 + b"]" * 65, 64)
    assert (caught.value.status, caught.value.code) == (400, "JSON_TOO_DEEP")
    # malformed, deep or not: the parser's own refusal (422), never a RecursionError
    for text in (b"[" * 100_000, b"{" * 10 + b"]", b"\xff\xfe"):
        with pytest.raises(ApiError) as caught:
            parse_json(text, 10**6 if text.startswith(b"[" * 1000) else 64)
        assert caught.value.status in (400, 422)


