"""Pending invitations listed and revoked by owners and admins; an invitation is
accepted only by the address it was sent to."""

from __future__ import annotations

import email
import re
from datetime import timedelta
from email import policy

from nodes.app_node.services import Lifetimes

from .apis import EVERYONE_CREATES, PASSWORD, Api, bearer


async def _team(api: Api, token: str) -> str:
    return (await api.client.get("/api/me", headers=bearer(token))).json()["active_team"]


async def _invite(api: Api, team: str, token: str, address: str) -> tuple[str, str]:
    """(invitation id, the token from its email)."""
    r = await api.client.post(f"/api/teams/{team}/invitations", json={"email": address},
                              headers=bearer(token))
    assert r.status_code == 201, r.text
    invitation = r.json()["id"]
    for path in sorted(api.outbox.iterdir()):
        message = email.message_from_bytes(path.read_bytes(), policy=policy.default)
        if message["To"] == address.lower():
            text = message.get_body(("plain",)).get_content()
            return invitation, re.search(r"accept\?token=([A-Za-z0-9_\-]+)", text).group(1)
    raise AssertionError(f"no email to {address}")


async def test_list_and_revoke(api: Api) -> None:
    owner = await api.signup()
    team = await _team(api, owner)
    member = await api.user("m@example.com", team, "member", owner)
    admin = await api.user("a@example.com", team, "admin", owner)
    api.services.teams = EVERYONE_CREATES  # the member makes a team of their own
    r = await api.client.post("/api/teams", json={"name": "other"}, headers=bearer(member))
    other = r.json()["id"]
    outsider = await api.user("o@example.com", other, "admin", member)

    api.services.lifetimes = Lifetimes(invitation=timedelta(hours=2))
    await _invite(api, team, owner, "one@example.com")
    await _invite(api, team, admin, "two@example.com")
    api.clock.now += 3600
    third, third_token = await _invite(api, team, admin, "three@example.com")
    api.clock.now += 3601  # the first two have expired
    r = await api.client.post("/api/invitations/accept", json={
        "token": third_token, "email": "three@example.com", "name": "Three",
        "password": PASSWORD})
    assert r.status_code == 200, r.text
    fourth, fourth_token = await _invite(api, team, owner, "four@example.com")
    others, _ = await _invite(api, other, member, "x@example.com")

    for token in (owner, admin):
        r = await api.client.get(f"/api/teams/{team}/invitations", headers=bearer(token))
        assert r.status_code == 200, r.text
        [pending] = r.json()["invitations"]
        assert (pending["id"], pending["email"], pending["role"]) == (
            fourth, "four@example.com", "member")
        assert "token" not in str(r.json())
    r = await api.client.get(f"/api/teams/{team}/invitations", headers=bearer(member))
    assert r.status_code == 403
    r = await api.client.get(f"/api/teams/{team}/invitations", headers=bearer(outsider))
    assert r.status_code == 404

    url = f"/api/teams/{team}/invitations/{fourth}"
    assert (await api.client.delete(url, headers=bearer(member))).status_code == 403
    assert (await api.client.delete(url, headers=bearer(outsider))).status_code == 404
    # another team's invitation is not found through this team
    r = await api.client.delete(f"/api/teams/{team}/invitations/{others}",
                                headers=bearer(owner))
    assert r.status_code == 404 and r.json()["error"]["field"] == "invitation"
    r = await api.client.delete(f"/api/teams/{team}/invitations/nope", headers=bearer(owner))
    assert r.status_code == 404
    # an accepted one cannot be revoked (remove the member instead)
    r = await api.client.delete(f"/api/teams/{team}/invitations/{third}",
                                headers=bearer(owner))
    assert r.status_code == 409

    assert (await api.client.delete(url, headers=bearer(admin))).status_code == 204
    r = await api.client.get(f"/api/teams/{team}/invitations", headers=bearer(owner))
    assert r.json()["invitations"] == []
    r = await api.client.post("/api/invitations/accept", json={
        "token": fourth_token, "email": "four@example.com", "name": "Four",
        "password": PASSWORD})
    assert r.status_code == 404


async def test_accepted_only_by_the_invited_address(api: Api) -> None:
    owner = await api.signup()
    team = await _team(api, owner)
    r = await api.client.post("/api/teams", json={"name": "second"}, headers=bearer(owner))
    second = r.json()["id"]
    member = await api.user("m@example.com", team, "member", owner)
    _, token = await _invite(api, second, owner, "M@Example.com")

    # someone else's session: refused, and the invitation stays usable
    r = await api.client.post("/api/invitations/accept", json={"token": token},
                              headers=bearer(owner))
    assert r.status_code == 403 and r.json()["error"]["code"] == "WRONG_ACCOUNT"
    # a new account under another address: refused, and no account is left behind
    r = await api.client.post("/api/invitations/accept", json={
        "token": token, "email": "thief@example.com", "name": "T", "password": PASSWORD})
    assert r.status_code == 403 and r.json()["error"]["code"] == "WRONG_ACCOUNT"
    r = await api.client.post("/api/auth/login", json={"email": "thief@example.com",
                                                       "password": PASSWORD})
    assert r.status_code == 401
    # the invited account (the address compared case-insensitively) joins
    r = await api.client.post("/api/invitations/accept", json={"token": token},
                              headers=bearer(member))
    assert r.status_code == 200, r.text
    assert r.json()["membership"] == {"user": r.json()["membership"]["user"], "team": second,
                                      "role": "member"}
