"""API keys: created in the shared database (secret once), listed with last use,
revoked in both places, usage rows; members vs admins vs other teams."""

from __future__ import annotations

from crdt import AddAudioUsage, AddTokenUsage, MarkKeyUsed

from .apis import Api, bearer


async def _team(api: Api, token: str) -> str:
    return (await api.client.get("/api/me", headers=bearer(token))).json()["active_team"]


async def test_create_list_revoke(api: Api) -> None:
    owner = await api.signup()
    team = await _team(api, owner)
    r = await api.client.post("/api/apikeys", json={"name": "laptop"}, headers=bearer(owner))
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["key"].startswith(created["prefix"]) and created["team"] == team
    db = api.services.database
    key = await db.api_key_by_secret(created["key"])
    assert key is not None and key.id == created["id"] and key.team == team
    assert not key.revoked

    r = await api.client.get("/api/apikeys", headers=bearer(owner))
    [listed] = r.json()["keys"]
    assert "key" not in listed and listed["prefix"] == created["prefix"]
    assert listed["last_used_ms"] is None
    await db.append([MarkKeyUsed(created["id"], 1_800_000_123_000)])
    r = await api.client.get("/api/apikeys", headers=bearer(owner))
    assert r.json()["keys"][0]["last_used_ms"] == 1_800_000_123_000

    r = await api.client.delete(f"/api/apikeys/{created['id']}", headers=bearer(owner))
    assert r.status_code == 204
    assert (await db.api_key(created["id"])).revoked
    r = await api.client.get("/api/apikeys", headers=bearer(owner))
    assert r.json()["keys"][0]["revoked_at"] == api.clock.now


async def test_usage_rows(api: Api) -> None:
    owner = await api.signup()
    r = await api.client.post("/api/apikeys", json={"name": "k"}, headers=bearer(owner))
    key_id = r.json()["id"]
    await api.services.database.append([
        AddTokenUsage(key_id, "llama", "2027-01-02", prompt=10, completion=5, total=15),
        AddTokenUsage(key_id, "llama", "2027-01-02", prompt=1, completion=1, total=2),
        AddAudioUsage(key_id, "whisper", "2027-01-03", 2500),
    ])
    r = await api.client.get(f"/api/apikeys/usage?key={key_id}", headers=bearer(owner))
    assert r.status_code == 200, r.text
    rows = r.json()["rows"]
    assert rows[0] == {"day": "2027-01-02", "model": "llama", "prompt_tokens": 11,
                       "completion_tokens": 6, "total_tokens": 17, "requests": 2,
                       "audio_seconds": 0.0}
    assert rows[1]["audio_seconds"] == 2.5
    r = await api.client.get(f"/api/apikeys/usage?key={key_id}&model=whisper",
                             headers=bearer(owner))
    assert [row["model"] for row in r.json()["rows"]] == ["whisper"]
    r = await api.client.get("/api/apikeys/usage", headers=bearer(owner))
    assert r.status_code == 422 and r.json()["error"]["field"] == "key"


async def test_member_admin_outsider(api: Api) -> None:
    owner = await api.signup()
    team = await _team(api, owner)
    member = await api.user("m@example.com", team, "member", owner)
    admin = await api.user("a@example.com", team, "admin", owner)
    r = await api.client.post("/api/teams", json={"name": "other"}, headers=bearer(owner))
    outsider = await api.user("o@example.com", r.json()["id"], "member", owner)

    r = await api.client.post("/api/apikeys", json={"name": "mine"}, headers=bearer(member))
    assert r.status_code == 201
    members_key = r.json()["id"]
    r = await api.client.post("/api/apikeys", json={"name": "ops"}, headers=bearer(admin))
    admins_key = r.json()["id"]
    r = await api.client.get("/api/apikeys", headers=bearer(member))
    assert {k["id"] for k in r.json()["keys"]} == {members_key, admins_key}

    # another team's member: no such key, no such team
    for path in (f"/api/apikeys/usage?key={members_key}",):
        assert (await api.client.get(path, headers=bearer(outsider))).status_code == 404
    r = await api.client.delete(f"/api/apikeys/{members_key}", headers=bearer(outsider))
    assert r.status_code == 404
    r = await api.client.get(f"/api/apikeys?team_id={team}", headers=bearer(outsider))
    assert r.status_code == 404
    r = await api.client.post("/api/apikeys", json={"name": "x", "team_id": team},
                              headers=bearer(outsider))
    assert r.status_code == 404
    # a member revokes their own key only; an admin any
    r = await api.client.delete(f"/api/apikeys/{admins_key}", headers=bearer(member))
    assert r.status_code == 403
    r = await api.client.delete(f"/api/apikeys/{members_key}", headers=bearer(member))
    assert r.status_code == 204
    r = await api.client.delete(f"/api/apikeys/{admins_key}", headers=bearer(admin))
    assert r.status_code == 204
    r = await api.client.post("/api/apikeys", json={"name": ""}, headers=bearer(member))
    assert r.status_code == 422 and r.json()["error"]["field"] == "name"
    assert (await api.client.get("/api/apikeys")).status_code == 401
