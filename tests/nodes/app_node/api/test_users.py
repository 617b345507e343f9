"""Password reset by email, password change, PATCH /me, the operators' list of users."""

from __future__ import annotations

import email
import re
from email import policy
from pathlib import Path

from nodes.app_node.auth import hash_token
from nodes.app_node.model import TokenKind

from .apis import EVERYONE_CREATES, PASSWORD, Api, bearer

NEW = "a brand new passphrase"


def _mails(api: Api) -> list[Path]:
    if not api.outbox.exists():
        return []
    return sorted(p for p in api.outbox.iterdir() if p.suffix == ".eml")


def _reset_token(path: Path) -> tuple[str, str]:
    """(to, token) of a reset email."""
    message = email.message_from_bytes(path.read_bytes(), policy=policy.default)
    text = message.get_body(("plain",)).get_content()
    match = re.search(r"https://cosmic\.example/reset\?token=([A-Za-z0-9_\-]+)", text)
    assert match, text
    return message["To"], match.group(1)


async def _login(api: Api, address: str, password: str) -> int:
    r = await api.client.post("/api/auth/login", json={"email": address, "password": password})
    return r.status_code


async def test_reset_by_email(api: Api) -> None:
    session = await api.signup()
    r = await api.client.post("/api/auth/password-reset", json={"email": "Admin@Example.com"})
    assert r.status_code == 202 and r.content == b""
    [mail] = _mails(api)
    to, token = _reset_token(mail)
    assert to == "admin@example.com"
    # only its hash is stored, as a reset token (not usable as a session)
    stored = api.services.store.tokens.valid(hash_token(token), now=api.clock.now,
                                             kind=TokenKind.RESET)
    assert stored.expires_at == api.clock.now + 3600
    assert (await api.client.get("/api/me", headers=bearer(token))).status_code == 401

    r = await api.client.post("/api/auth/password-reset/confirm",
                              json={"token": "cac_not-a-token", "password": NEW})
    assert r.status_code == 404 and r.json()["error"]["field"] == "token"
    r = await api.client.post("/api/auth/password-reset/confirm",
                              json={"token": token, "password": "short"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "password"
    r = await api.client.post("/api/auth/password-reset/confirm",
                              json={"token": token, "password": NEW})
    assert r.status_code == 204, r.text
    # every session is revoked; the new password works, the old does not
    assert (await api.client.get("/api/me", headers=bearer(session))).status_code == 401
    assert await _login(api, "admin@example.com", PASSWORD) == 401
    assert await _login(api, "admin@example.com", NEW) == 200
    # the link works once
    r = await api.client.post("/api/auth/password-reset/confirm",
                              json={"token": token, "password": PASSWORD})
    assert r.status_code == 410 and r.json()["error"]["field"] == "token"
    assert "request a new one" in r.json()["error"]["message"]


async def test_reset_link_expires_after_an_hour(api: Api) -> None:
    await api.signup()
    await api.client.post("/api/auth/password-reset", json={"email": "admin@example.com"})
    _, token = _reset_token(_mails(api)[0])
    api.clock.now += 3601
    r = await api.client.post("/api/auth/password-reset/confirm",
                              json={"token": token, "password": NEW})
    assert r.status_code == 410 and r.json()["error"]["code"] == "EXPIRED"
    assert await _login(api, "admin@example.com", PASSWORD) == 200


async def test_reset_reveals_nothing_about_accounts(api: Api) -> None:
    await api.signup()
    known = await api.client.post("/api/auth/password-reset",
                                  json={"email": "admin@example.com"})
    unknown = await api.client.post("/api/auth/password-reset",
                                    json={"email": "nobody@example.com"})
    assert (known.status_code, known.content) == (unknown.status_code, unknown.content)
    assert {k: v for k, v in known.headers.items() if k != "date"} == \
        {k: v for k, v in unknown.headers.items() if k != "date"}
    assert len(_mails(api)) == 1  # nothing sent to an address with no account
    # a disabled account gets nothing either
    admin = api.services.store.users.by_email("admin@example.com")
    api.services.store.users.update(admin.id, disabled=True)
    r = await api.client.post("/api/auth/password-reset", json={"email": "admin@example.com"})
    assert r.status_code == 202 and len(_mails(api)) == 1
    for body, field in (({"email": "not-an-address"}, "email"), ({}, "email"),
                        ({"email": "a@b.c", "x": 1}, "x")):
        r = await api.client.post("/api/auth/password-reset", json=body)
        assert r.status_code == 422 and r.json()["error"]["field"] == field
    r = await api.client.post("/api/auth/password-reset/confirm", json={"password": NEW})
    assert r.status_code == 422 and r.json()["error"]["field"] == "token"


async def test_change_password(api: Api) -> None:
    owner = await api.signup()
    team = (await api.client.get("/api/me", headers=bearer(owner))).json()["active_team"]
    member = await api.user("m@example.com", team, "member", owner)
    other_session = (await api.client.post("/api/auth/login", json={
        "email": "m@example.com", "password": PASSWORD})).json()["token"]

    r = await api.client.put("/api/me/password", json={"current_password": "wrong one!",
                                                       "password": NEW}, headers=bearer(member))
    assert r.status_code == 403 and r.json()["error"]["field"] == "current_password"
    r = await api.client.put("/api/me/password", json={"current_password": PASSWORD,
                                                       "password": "short"},
                             headers=bearer(member))
    assert r.status_code == 422 and r.json()["error"]["field"] == "password"
    r = await api.client.put("/api/me/password", json={"password": NEW}, headers=bearer(member))
    assert r.status_code == 422 and r.json()["error"]["field"] == "current_password"
    r = await api.client.put("/api/me/password", json={"current_password": PASSWORD,
                                                       "password": NEW})
    assert r.status_code == 401

    r = await api.client.put("/api/me/password", json={"current_password": PASSWORD,
                                                       "password": NEW}, headers=bearer(member))
    assert r.status_code == 200, r.text
    fresh = r.json()["token"]
    assert r.json()["user"]["email"] == "m@example.com"
    for old in (member, other_session):
        assert (await api.client.get("/api/me", headers=bearer(old))).status_code == 401
    assert (await api.client.get("/api/me", headers=bearer(fresh))).status_code == 200
    assert await _login(api, "m@example.com", NEW) == 200
    # the owner's own session is untouched
    assert (await api.client.get("/api/me", headers=bearer(owner))).status_code == 200


async def test_patch_me(api: Api) -> None:
    token = await api.signup()
    r = await api.client.patch("/api/me", json={"name": "  Ada L. "}, headers=bearer(token))
    assert r.status_code == 200 and r.json()["user"]["name"] == "Ada L."
    assert r.json()["teams"][0]["name"] == "core"
    for body, field in (({"name": ""}, "name"), ({"name": "x" * 101}, "name"),
                        ({"name": "a", "email": "x@y.z"}, "email"), ({}, "name")):
        r = await api.client.patch("/api/me", json=body, headers=bearer(token))
        assert r.status_code == 422 and r.json()["error"]["field"] == field, body
    assert (await api.client.patch("/api/me", json={"name": "x"})).status_code == 401


async def test_users_for_operators_only(api: Api) -> None:
    operator = await api.signup()
    core = (await api.client.get("/api/me", headers=bearer(operator))).json()["active_team"]
    member = await api.user("m@example.com", core, "member", operator)
    admin = await api.user("a@example.com", core, "admin", operator)
    api.services.teams = EVERYONE_CREATES  # the member makes a team of their own
    r = await api.client.post("/api/teams", json={"name": "other"}, headers=bearer(member))
    other = r.json()["id"]
    outsider = await api.user("o@example.com", other, "admin", member)

    for token in (operator, admin):
        r = await api.client.get("/api/users", headers=bearer(token))
        assert r.status_code == 200, r.text
        users = {u["user"]["email"]: u for u in r.json()["users"]}
        assert list(users) == ["admin@example.com", "m@example.com", "a@example.com",
                               "o@example.com"]
        assert {(t["name"], t["role"]) for t in users["m@example.com"]["teams"]} == {
            ("core", "member"), ("other", "owner")}
        assert "password_hash" not in str(r.json())
        assert r.json()["next"] is None
    for token in (member, outsider):
        r = await api.client.get("/api/users", headers=bearer(token))
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    assert (await api.client.get("/api/users")).status_code == 401

    r = await api.client.get("/api/users", params={"limit": "3"}, headers=bearer(operator))
    first = r.json()
    assert len(first["users"]) == 3 and first["next"]
    r = await api.client.get("/api/users", params={"limit": "3", "cursor": first["next"]},
                             headers=bearer(operator))
    assert [u["user"]["email"] for u in r.json()["users"]] == ["o@example.com"]
    for params, field in (({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"),
                          ({"cursor": "nope"}, "cursor")):
        r = await api.client.get("/api/users", params=params, headers=bearer(operator))
        assert r.status_code == 422 and r.json()["error"]["field"] == field, params
