"""Racks and nodes for platform operators (owners/admins of the first admin's team):
list, register, remove, nodes with reserve/release; a member, and the owner of
another team, get 403."""

from __future__ import annotations

from .apis import EVERYONE_CREATES, Api, bearer

RACK = "ab" * 32  # the one tests/nodes/ork/world.World registers
NEW_RACK = "ef" * 32


async def test_operator_manages_racks_and_nodes(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    team = (await api.client.get("/api/me", headers=bearer(owner))).json()["active_team"]
    admin = await api.user("a@example.com", team, "admin", owner)

    r = await api.client.get("/api/racks", headers=bearer(admin))
    assert r.status_code == 200, r.text
    [rack] = r.json()["racks"]
    assert rack["key"] == RACK and rack["gpus"] == 16
    r = await api.client.post("/api/racks", headers=bearer(owner),
                              json={"rack": NEW_RACK.upper(), "location": "lab", "name": "r2"})
    assert r.status_code == 201, r.text
    assert r.json()["key"] == NEW_RACK and r.json()["location"] == "lab"
    r = await api.client.get("/api/racks", headers=bearer(owner))
    assert {x["key"] for x in r.json()["racks"]} == {RACK, NEW_RACK}
    r = await api.client.delete(f"/api/racks/{NEW_RACK}", headers=bearer(owner))
    assert r.status_code == 204, r.text
    r = await api.client.delete(f"/api/racks/{NEW_RACK}", headers=bearer(owner))
    assert r.status_code == 404, r.text
    r = await api.client.post("/api/racks", headers=bearer(owner), json={"rack": "zz"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "rack"

    r = await api.client.get("/api/nodes", headers=bearer(owner))
    assert r.status_code == 200, r.text
    assert sorted(n["name"] for n in r.json()["nodes"]) == ["n0", "n1"]
    r = await api.client.post("/api/nodes/reserve", headers=bearer(owner),
                              json={"rack": RACK, "nodes": ["n0"], "team": team})
    assert r.status_code == 204, r.text
    nodes = {n["name"]: n for n in (await api.client.get(
        "/api/nodes", headers=bearer(owner))).json()["nodes"]}
    assert nodes["n0"]["reserved_for"] == team and nodes["n1"]["reserved_for"] is None
    r = await api.client.post("/api/nodes/reserve", headers=bearer(owner),
                              json={"rack": RACK, "nodes": ["n0"], "team": "no-such-team"})
    assert r.status_code == 404 and r.json()["error"]["field"] == "team"
    r = await api.client.post("/api/nodes/release", headers=bearer(owner),
                              json={"rack": RACK, "nodes": ["n0"]})
    assert r.status_code == 204, r.text
    nodes = {n["name"]: n for n in (await api.client.get(
        "/api/nodes", headers=bearer(owner))).json()["nodes"]}
    assert nodes["n0"]["reserved_for"] is None


async def test_members_and_other_teams_owners_are_403(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    team = (await api.client.get("/api/me", headers=bearer(owner))).json()["active_team"]
    member = await api.user("m@example.com", team, "member", owner)
    api.services.teams = EVERYONE_CREATES  # the member makes a team of their own
    r = await api.client.post("/api/teams", json={"name": "other"}, headers=bearer(member))
    assert r.status_code == 201, r.text  # the member owns a team of their own now
    for method, path, body in [
            ("GET", "/api/racks", None), ("POST", "/api/racks", {"rack": "ef" * 32}),
            ("DELETE", f"/api/racks/{RACK}", None), ("GET", "/api/nodes", None),
            ("POST", "/api/nodes/reserve", {"rack": RACK, "nodes": ["n0"], "team": team}),
            ("POST", "/api/nodes/release", {"rack": RACK, "nodes": ["n0"]})]:
        r = await api.client.request(method, path, json=body, headers=bearer(member))
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["error"]["code"] == "FORBIDDEN"
    r = await api.client.get("/api/racks")
    assert r.status_code == 401


async def test_racks_without_wrk_ork_are_503(api: Api) -> None:
    owner = await api.signup()
    r = await api.client.get("/api/racks", headers=bearer(owner))
    assert r.status_code == 503 and r.json()["error"]["code"] == "ORK_UNAVAILABLE"


async def test_racks_events_push_capacity_as_jobs_claim_gpus(ork_api: Api) -> None:
    """Served over the lean server (in process the answer would be read whole)."""
    import trio

    from .support import _inference, events, served

    api = ork_api
    owner = await api.signup()
    with trio.fail_after(30):
        async with served(api) as client, events(client, "/racks/events", owner) as stream:
            kind, data = await stream.next()
            assert kind == "racks" and [r["free"] for r in data["racks"]] == [16]
            assert sorted(n["name"] for n in data["nodes"]) == ["n0", "n1"]
            r = await api.client.post("/api/jobs", headers=bearer(owner),
                                      json=_inference(replicas=1, gpus=2))
            assert r.status_code == 201, r.text
            kind, data = await stream.next()
            assert kind == "racks" and [r["free"] for r in data["racks"]] == [14]
            assert sum(n["free"] for n in data["nodes"]) == 14
