"""Sign-up, login, logout, /me, the active team, errors, the limiter, the docs."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from nodes.app_node.auth import ScryptParams
from nodes.app_node.ratelimit import Limits, Rate

from .apis import PASSWORD, Api, bearer, make_api


async def test_signup_then_closed(api: Api) -> None:
    token = await api.signup()
    assert token.startswith("cac_")
    r = await api.client.post("/api/auth/signup", json={
        "email": "b@example.com", "name": "B", "password": PASSWORD, "team_name": "x"})
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "CONFLICT"


async def test_signup_validation_names_the_field(api: Api) -> None:
    r = await api.client.post("/api/auth/signup", json={
        "email": "a@example.com", "name": "A", "password": "short", "team_name": "x"})
    assert r.status_code == 422
    assert r.json()["error"]["field"] == "password"
    r = await api.client.post("/api/auth/signup", json={
        "email": "a@example.com", "password": PASSWORD, "team_name": "x"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "name"
    r = await api.client.post("/api/auth/signup", json={
        "email": "not-an-address", "name": "A", "password": PASSWORD, "team_name": "x"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "email"
    r = await api.client.post("/api/auth/signup", content=b"{nope")
    assert r.status_code == 422 and r.json()["error"]["code"] == "INVALID"


async def test_login_me_logout(api: Api) -> None:
    await api.signup()
    key = "ab" * 32
    r = await api.client.post("/api/auth/login", json={
        "email": "ADMIN@example.com", "password": PASSWORD, "cli_public_key": key})
    assert r.status_code == 200, r.text
    token = r.json()["token"]
    assert r.json()["expires_at"] == api.clock.now + 7 * 86400
    r = await api.client.get("/api/me", headers=bearer(token))
    me = r.json()
    assert me["user"]["email"] == "admin@example.com"
    assert me["user"]["cli_public_key"] == key
    assert [t["role"] for t in me["teams"]] == ["owner"]
    assert me["active_team"] == me["teams"][0]["id"]
    r = await api.client.post("/api/auth/logout", headers=bearer(token))
    assert r.status_code == 204
    r = await api.client.get("/api/me", headers=bearer(token))
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_login_refusals(api: Api) -> None:
    await api.signup()
    r = await api.client.post("/api/auth/login", json={"email": "admin@example.com",
                                                       "password": "wrong password!"})
    assert r.status_code == 401
    r = await api.client.post("/api/auth/login", json={"email": "nobody@example.com",
                                                       "password": PASSWORD})
    assert r.status_code == 401
    r = await api.client.post("/api/auth/login", json={
        "email": "admin@example.com", "password": PASSWORD, "cli_public_key": "xyz"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "cli_public_key"


async def test_token_expires_on_the_clock(api: Api) -> None:
    token = await api.signup()
    assert (await api.client.get("/api/me", headers=bearer(token))).status_code == 200
    api.clock.now += 7 * 86400
    r = await api.client.get("/api/me", headers=bearer(token))
    assert r.status_code == 401
    assert "expired" in r.json()["error"]["message"]


async def test_no_or_bad_token(api: Api) -> None:
    await api.signup()
    assert (await api.client.get("/api/me")).status_code == 401
    r = await api.client.get("/api/me", headers=bearer("cac_made_up"))
    assert r.status_code == 401


async def test_active_team(api: Api) -> None:
    token = await api.signup()
    r = await api.client.post("/api/teams", json={"name": "second"}, headers=bearer(token))
    second = r.json()["id"]
    r = await api.client.put("/api/me/active-team", json={"team_id": second},
                             headers=bearer(token))
    assert r.status_code == 200 and r.json()["active_team"] == second
    r = await api.client.put("/api/me/active-team", json={"team_id": "nope"},
                             headers=bearer(token))
    assert r.status_code == 404 and r.json()["error"]["field"] == "team_id"


async def test_rate_limited(tmp_path: Path) -> None:
    tight = Limits(per_token=Rate(per_second=0.001, burst=2),
                   per_ip=Rate(per_second=0.001, burst=2))
    async for api in make_api(tmp_path, tight):
        statuses = [(await api.client.get("/api/openapi.json")).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        r = await api.client.get("/api/docs")
        assert r.status_code == 429 and r.json()["error"]["code"] == "RATE_LIMITED"
        assert "retry-after" in r.headers


async def test_openapi_lists_every_route(api: Api) -> None:
    from nodes.app_node.api import ROUTES
    doc = (await api.client.get("/api/openapi.json")).json()
    for spec in ROUTES:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", spec.path)  # {name:path} is {name}
        assert spec.method.lower() in doc["paths"]["/api" + path]
    assert "SignupIn" in doc["components"]["schemas"]
    r = await api.client.get("/api/docs")
    assert r.status_code == 200 and "/api/openapi.json" in r.text


async def test_unknown_route_is_json(api: Api) -> None:
    r = await api.client.get("/api/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"


async def test_a_login_stores_the_password_again_at_a_raised_cost(tmp_path: Path) -> None:
    """The operator raises ``password_hash``: each user's next login rehashes their
    password at the new cost and keeps their sessions; a login at the cost already
    stored leaves the hash alone."""
    from nodes.app_node.api import create_app

    async for api in make_api(tmp_path):
        first = await api.signup()
        users = api.services.store.users
        cheap_hash = users.by_email("admin@example.com").password_hash
        assert cheap_hash.startswith("$scrypt$ln=4,")
        await api.login("admin@example.com")  # the same cost: nothing to do
        assert users.by_email("admin@example.com").password_hash == cheap_hash

        raised = create_app(api.services, password_params=ScryptParams(ln=5, r=8, p=1))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=raised),
                                     base_url="http://test") as client:
            r = await client.post("/api/auth/login", json={"email": "admin@example.com",
                                                           "password": PASSWORD})
            assert r.status_code == 200, r.text
            stored = users.by_email("admin@example.com").password_hash
            assert stored.startswith("$scrypt$ln=5,") and stored != cheap_hash
            assert (await client.get("/api/me", headers=bearer(first))).status_code == 200
            r = await client.post("/api/auth/login", json={"email": "admin@example.com",
                                                           "password": PASSWORD})
            assert r.status_code == 200  # the new hash verifies


def test_a_changed_password_is_not_overwritten_by_a_late_upgrade(tmp_path: Path) -> None:
    from nodes.app_node.auth import hash_password
    from nodes.app_node.store import Store

    from .apis import CHEAP

    store = Store.open(tmp_path / "app.sqlite")
    try:
        user = store.users.create(email="a@example.com", name="A",
                                  password_hash=hash_password(PASSWORD, params=CHEAP), now=0.0)
        changed = hash_password("another password entirely", params=CHEAP)
        store.users.set_password(user.id, changed, now=1.0)
        late = hash_password(PASSWORD, params=ScryptParams(ln=5, r=8, p=1))
        assert not store.users.upgrade_password_hash(user.id, user.password_hash, late)
        assert store.users.get(user.id).password_hash == changed
    finally:
        store.close()
