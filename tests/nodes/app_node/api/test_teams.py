"""Teams, members and roles, invitations (email in the outbox, the link works)."""

from __future__ import annotations

import email
import re
from email import policy
from pathlib import Path

from .apis import PASSWORD, Api, bearer


def _mail_text(path: Path) -> str:
    message = email.message_from_bytes(path.read_bytes(), policy=policy.default)
    part = message.get_body(("plain",))
    assert part is not None
    return message["To"] + "\n" + part.get_content()


async def _team(api: Api, token: str) -> str:
    r = await api.client.get("/api/me", headers=bearer(token))
    return r.json()["active_team"]


async def test_teams_list_and_create(api: Api) -> None:
    token = await api.signup()
    r = await api.client.post("/api/teams", json={"name": "ml"}, headers=bearer(token))
    assert r.status_code == 201 and r.json()["role"] == "owner"
    r = await api.client.post("/api/teams", json={"name": "ML"}, headers=bearer(token))
    assert r.status_code == 409
    r = await api.client.get("/api/teams", headers=bearer(token))
    assert sorted(t["name"] for t in r.json()["teams"]) == ["core", "ml"]
    r = await api.client.post("/api/teams", json={}, headers=bearer(token))
    assert r.status_code == 422 and r.json()["error"]["field"] == "name"


async def test_roles_member_admin_outsider(api: Api) -> None:
    owner = await api.signup()
    team = await _team(api, owner)
    member = await api.user("m@example.com", team, "member", owner)
    admin = await api.user("a@example.com", team, "admin", owner)
    r = await api.client.post("/api/teams", json={"name": "other"}, headers=bearer(admin))
    other_team = r.json()["id"]
    outsider = await api.user("o@example.com", other_team, "member", admin)

    r = await api.client.get(f"/api/teams/{team}/members", headers=bearer(member))
    assert r.status_code == 200
    members = {m["user"]["email"]: m for m in r.json()["members"]}
    assert members["m@example.com"]["role"] == "member"
    member_id = members["m@example.com"]["user"]["id"]
    owner_id = members["admin@example.com"]["user"]["id"]

    # an outsider sees no such team; a member may not manage
    r = await api.client.get(f"/api/teams/{team}/members", headers=bearer(outsider))
    assert r.status_code == 404
    r = await api.client.patch(f"/api/teams/{team}/members/{member_id}", json={"role": "admin"},
                               headers=bearer(member))
    assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
    r = await api.client.patch(f"/api/teams/{team}/members/{member_id}", json={"role": "admin"},
                               headers=bearer(outsider))
    assert r.status_code == 404
    # an admin manages members but not owners
    r = await api.client.patch(f"/api/teams/{team}/members/{member_id}", json={"role": "admin"},
                               headers=bearer(admin))
    assert r.status_code == 200 and r.json()["role"] == "admin"
    r = await api.client.patch(f"/api/teams/{team}/members/{owner_id}",
                               json={"role": "member"}, headers=bearer(admin))
    assert r.status_code == 403
    r = await api.client.patch(f"/api/teams/{team}/members/{member_id}", json={"role": "boss"},
                               headers=bearer(admin))
    assert r.status_code == 422 and r.json()["error"]["field"] == "role"
    # the last owner cannot step down or be removed
    r = await api.client.patch(f"/api/teams/{team}/members/{owner_id}",
                               json={"role": "member"}, headers=bearer(owner))
    assert r.status_code == 409 and r.json()["error"]["code"] == "LAST_OWNER"
    r = await api.client.delete(f"/api/teams/{team}/members/{owner_id}", headers=bearer(owner))
    assert r.status_code == 409
    r = await api.client.delete(f"/api/teams/{team}/members/{member_id}", headers=bearer(admin))
    assert r.status_code == 204
    r = await api.client.get(f"/api/teams/{team}/members", headers=bearer(member))
    assert r.status_code == 404


async def test_invitation_email_and_accept_new_account(api: Api) -> None:
    owner = await api.signup()
    team = await _team(api, owner)
    r = await api.client.post(f"/api/teams/{team}/invitations",
                              json={"email": "new@example.com", "role": "admin"},
                              headers=bearer(owner))
    assert r.status_code == 201, r.text
    mails = [p for p in api.outbox.iterdir() if p.suffix == ".eml"]
    assert len(mails) == 1
    text = _mail_text(mails[0])
    assert "new@example.com" in text
    match = re.search(r"https://cosmic\.example/accept\?token=([A-Za-z0-9_\-]+)", text)
    assert match, text
    token = match.group(1)
    r = await api.client.post("/api/invitations/accept", json={"token": token})
    assert r.status_code == 422 and r.json()["error"]["field"] == "email"
    r = await api.client.post("/api/invitations/accept", json={
        "token": token, "email": "new@example.com", "name": "Neu", "password": PASSWORD})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["membership"]["role"] == "admin" and body["membership"]["team"] == team
    session = body["session"]["token"]
    r = await api.client.get("/api/me", headers=bearer(session))
    assert r.json()["active_team"] == team
    # used once only; a wrong token joins nothing (and leaves no account behind)
    r = await api.client.post("/api/invitations/accept", json={
        "token": token, "email": "x@example.com", "name": "X", "password": PASSWORD})
    assert r.status_code == 410
    r = await api.client.post("/api/auth/login", json={"email": "x@example.com",
                                                       "password": PASSWORD})
    assert r.status_code == 401


async def test_invitation_accept_with_session_and_expiry(api: Api) -> None:
    owner = await api.signup()
    team = await _team(api, owner)
    r = await api.client.post("/api/teams", json={"name": "second"}, headers=bearer(owner))
    second = r.json()["id"]
    member = await api.user("m@example.com", team, "member", owner)
    # /me says who is a platform operator (the first admin's team's owners and
    # admins), so a client shows operator controls to them only.
    assert (await api.client.get("/api/me", headers=bearer(owner))).json()["operator"]
    assert not (await api.client.get("/api/me", headers=bearer(member))).json()["operator"]
    r = await api.client.post(f"/api/teams/{second}/invitations",
                              json={"email": "m@example.com"}, headers=bearer(member))
    assert r.status_code == 404  # not a member of second
    r = await api.client.post(f"/api/teams/{team}/invitations",
                              json={"email": "z@example.com"}, headers=bearer(member))
    assert r.status_code == 403
    r = await api.client.post(f"/api/teams/{second}/invitations",
                              json={"email": "m@example.com"}, headers=bearer(owner))
    assert r.status_code == 201
    text = _mail_text(next(p for p in api.outbox.iterdir() if p.suffix == ".eml"))
    token = re.search(r"accept\?token=([A-Za-z0-9_\-]+)", text).group(1)
    api.clock.now += 8 * 86400
    r = await api.client.post("/api/invitations/accept", json={"token": token},
                              headers=bearer(owner))
    # the token is checked first: expired, whatever the session
    assert r.status_code == 410 and r.json()["error"]["field"] == "token"
    r = await api.client.post("/api/auth/login", json={"email": "m@example.com",
                                                       "password": PASSWORD})
    fresh = r.json()["token"]
    r = await api.client.post("/api/invitations/accept", json={"token": token},
                              headers=bearer(fresh))
    assert r.status_code == 410 and r.json()["error"]["code"] == "EXPIRED"
