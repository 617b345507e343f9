"""Properties of the whole route table, so a route added later cannot skip them:
every route that needs a session refuses a request without one (401) or with a
forged token, before it reads its body; the open ones are exactly the sign-up,
login, invitation and password-reset routes; the schema lists every route."""

from __future__ import annotations

import re

import pytest

from nodes.app_node.api import ROUTES

from .apis import Api, bearer
from .support import OPEN


def _concrete(path: str) -> str:
    return "/api" + re.sub(r"\{[^}]+\}", "x1", path)


def test_only_the_ways_in_are_open() -> None:
    assert {(r.method, r.path) for r in ROUTES if not r.auth} == OPEN


@pytest.mark.parametrize("route", [r for r in ROUTES if r.auth],
                         ids=lambda r: f"{r.method} {r.path}")
async def test_a_route_without_a_valid_session_is_401(api: Api, route) -> None:
    await api.signup()  # a user exists: the token below is merely wrong
    for headers in ({}, bearer("cac_forged_token"), {"Authorization": "Basic YTpi"}):
        r = await api.client.request(route.method, _concrete(route.path), headers=headers,
                                     json={} if route.method in ("POST", "PUT", "PATCH")
                                     else None)
        assert r.status_code == 401, (route.method, route.path, headers, r.text)
        assert r.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_the_schema_lists_every_route(api: Api) -> None:
    paths = (await api.client.get("/api/openapi.json")).json()["paths"]
    for route in ROUTES:
        path = "/api" + route.path.replace(":path}", "}")
        assert route.method.lower() in paths.get(path, {}), (route.method, path)
