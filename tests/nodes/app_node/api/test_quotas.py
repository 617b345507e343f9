"""Regression: no quota, and any user could create a team. A plain member
made a team, took every free GPU, and the admin's 1-GPU job waited Pending.

Now only operators create teams unless the setting says otherwise (403
``TEAM_CREATION_FORBIDDEN``); operators set a team's GPU quotas (a table of who
may); a job that would take its team (or its creator) past a quota is refused
with 409 ``QUOTA_EXCEEDED`` and not created; two creates racing at the edge:
exactly one passes; a new team gets the operators' default quota."""

from __future__ import annotations

import sqlite3

import pytest
import trio

from nodes.app_node.store import SCHEMA_VERSION, Store
from nodes.app_node.team_rules import TeamsSettings

from .apis import EVERYONE_CREATES, Api, bearer

IMAGE = "docker://registry.local/jobs/app:1"


def _container(gpus: int, **extra) -> dict:
    return {"name": "box", "type": "container", "image": IMAGE, "gpus": gpus, **extra}


async def _core(api: Api, token: str) -> str:
    return (await api.client.get("/api/me", headers=bearer(token))).json()["active_team"]


def _team_of(api: Api, owner_email: str, name: str) -> str:
    """A team made straight in the store (as if it was made before the setting)."""
    store = api.services.store
    api.clock.now += 1  # later than core, the operators' team
    owner = store.users.by_email(owner_email)
    return store.teams.create(name=name, owner=owner.id, now=api.clock.now).id


@pytest.fixture
async def people(ork_api: Api) -> dict:
    """The issue's cast: the operator (first admin) and an admin of the core team
    (both operators); a plain member of core who owns the team ``lab``, where
    ``lab-admin`` is admin and ``lab-member`` member; ``stranger`` owns ``third``."""
    api = ork_api
    operator = await api.signup()
    core = await _core(api, operator)
    tokens = {"operator": operator,
              "core-admin": await api.user("ca@example.com", core, "admin", operator),
              "core-member": await api.user("cm@example.com", core, "member", operator)}
    lab = _team_of(api, "cm@example.com", "lab")
    tokens["lab-admin"] = await api.user("la@example.com", lab, "admin", operator)
    tokens["lab-member"] = await api.user("lm@example.com", lab, "member", operator)
    stranger = await api.user("s@example.com", core, "member", operator)
    third = _team_of(api, "s@example.com", "third")
    api.services.store.teams.remove_member(core, api.services.store.users.by_email(
        "s@example.com").id)
    tokens["stranger"] = stranger
    return {"api": api, "tokens": tokens, "core": core, "lab": lab, "third": third}


# -- who may create a team ---------------------------------------------------------

async def test_a_plain_member_cannot_create_a_team_by_default(people: dict) -> None:
    api, tokens = people["api"], people["tokens"]
    for who in ("core-member", "lab-admin", "lab-member", "stranger"):
        r = await api.client.post("/api/teams", json={"name": f"mine-{who}"},
                                  headers=bearer(tokens[who]))
        assert r.status_code == 403, (who, r.text)
        error = r.json()["error"]
        assert error["code"] == "TEAM_CREATION_FORBIDDEN"
        assert "operator" in error["message"]
    assert {t.name for t in api.services.store.teams.all()} == {"core", "lab", "third"}
    for who in ("operator", "core-admin"):
        # later than core: the operators' team is the first admin's oldest
        api.clock.now += 1
        r = await api.client.post("/api/teams", json={"name": f"ops-{who}"},
                                  headers=bearer(tokens[who]))
        assert r.status_code == 201, (who, r.text)
        assert r.json()["role"] == "owner" and r.json()["quota"]["gpus"] is None
    # the operators' setting opens it to everyone
    api.services.teams = EVERYONE_CREATES
    r = await api.client.post("/api/teams", json={"name": "mine"},
                              headers=bearer(tokens["core-member"]))
    assert r.status_code == 201, r.text


async def test_a_new_team_gets_the_default_quota(people: dict) -> None:
    api, tokens = people["api"], people["tokens"]
    api.services.teams = TeamsSettings(default_gpus=4, default_per_user_gpus=2)
    api.clock.now += 1
    r = await api.client.post("/api/teams", json={"name": "new"},
                              headers=bearer(tokens["operator"]))
    assert r.status_code == 201, r.text
    quota = r.json()["quota"]
    assert (quota["gpus"], quota["per_user_gpus"]) == (4, 2)
    r = await api.client.get(f"/api/teams/{r.json()['id']}/quota",
                             headers=bearer(tokens["operator"]))
    assert (r.json()["gpus"], r.json()["per_user_gpus"]) == (4, 2)
    # teams made before keep theirs (none)
    r = await api.client.get(f"/api/teams/{people['lab']}/quota",
                             headers=bearer(tokens["lab-member"]))
    assert r.status_code == 200 and r.json()["gpus"] is None


# -- who may set quotas: a table ---------------------------------------------------

#: (who, team) -> the status of PATCH /api/teams/{team}/quota.
SETTERS = {
    ("operator", "lab"): 200, ("operator", "core"): 200, ("operator", "third"): 200,
    ("core-admin", "lab"): 200,  # an admin of the operators' team is an operator
    ("core-member", "core"): 403,  # a member of the operators' team is not
    ("core-member", "lab"): 403,  # the owner of lab
    ("lab-admin", "lab"): 403, ("lab-member", "lab"): 403,
    ("lab-admin", "third"): 404, ("stranger", "lab"): 404,  # another team: not even seen
    ("stranger", "third"): 403,
}


@pytest.mark.parametrize(("who", "team"), sorted(SETTERS))
async def test_who_may_set_quotas(people: dict, who: str, team: str) -> None:
    api, team_id = people["api"], people[team]
    before = api.services.store.quotas.get(team_id)
    r = await api.client.patch(f"/api/teams/{team_id}/quota", json={"gpus": 1},
                               headers=bearer(people["tokens"][who]))
    assert r.status_code == SETTERS[who, team], r.text
    if r.status_code == 200:
        assert r.json() == {"team": team_id, "gpus": 1, "per_user_gpus": None,
                            "updated_at": api.clock.now}
        assert api.services.store.quotas.get(team_id).gpus == 1
    else:
        assert r.json()["error"]["code"] == {403: "FORBIDDEN", 404: "NOT_FOUND"}[r.status_code]
        assert api.services.store.quotas.get(team_id) == before


async def test_who_may_read_a_quota(people: dict) -> None:
    api, tokens, lab = people["api"], people["tokens"], people["lab"]
    for who, status in [("operator", 200), ("core-admin", 200), ("core-member", 200),
                        ("lab-admin", 200), ("lab-member", 200), ("stranger", 404)]:
        r = await api.client.get(f"/api/teams/{lab}/quota", headers=bearer(tokens[who]))
        assert r.status_code == status, (who, r.text)
    r = await api.client.get("/api/teams/no-such-team/quota", headers=bearer(tokens["operator"]))
    assert r.status_code == 404


async def test_patch_keeps_what_it_leaves_out_and_null_clears(people: dict) -> None:
    api, lab = people["api"], people["lab"]
    operator = bearer(people["tokens"]["operator"])
    path = f"/api/teams/{lab}/quota"
    r = await api.client.patch(path, json={"gpus": 8, "per_user_gpus": 2}, headers=operator)
    assert (r.json()["gpus"], r.json()["per_user_gpus"]) == (8, 2)
    r = await api.client.patch(path, json={"per_user_gpus": 3}, headers=operator)
    assert (r.json()["gpus"], r.json()["per_user_gpus"]) == (8, 3)
    r = await api.client.patch(path, json={"gpus": None}, headers=operator)
    assert (r.json()["gpus"], r.json()["per_user_gpus"]) == (None, 3)
    for body, field in [({"gpus": -1}, "gpus"), ({"gpus": "many"}, "gpus"),
                        ({"per_user_gpus": 10**7}, "per_user_gpus"), ({"cpus": 1}, "cpus")]:
        r = await api.client.patch(path, json=body, headers=operator)
        assert r.status_code == 422 and r.json()["error"]["field"] == field, body
    # shown with the team to its members
    r = await api.client.get("/api/teams", headers=bearer(people["tokens"]["lab-member"]))
    [team] = r.json()["teams"]
    assert team["quota"] == {"team": lab, "gpus": None, "per_user_gpus": 3,
                             "updated_at": api.clock.now}
    r = await api.client.get(f"/api/teams/{lab}", headers=bearer(people["tokens"]["lab-admin"]))
    assert r.status_code == 200 and r.json()["role"] == "admin"
    assert r.json()["quota"]["per_user_gpus"] == 3
    r = await api.client.get(f"/api/teams/{lab}", headers=bearer(people["tokens"]["stranger"]))
    assert r.status_code == 404


# -- enforced at job creation --------------------------------------------------------

async def test_a_team_at_quota_gets_409_and_the_admins_job_is_placed(people: dict) -> None:
    """The issue's run: the member's team may not take every free GPU (16 here)."""
    api, tokens, lab = people["api"], people["tokens"], people["lab"]
    r = await api.client.patch(f"/api/teams/{lab}/quota", json={"gpus": 12},
                               headers=bearer(tokens["operator"]))
    assert r.status_code == 200
    owner = bearer(tokens["core-member"])
    r = await api.client.post("/api/jobs", headers=owner, json=_container(8, team_id=lab))
    assert r.status_code == 201, r.text
    r = await api.client.post("/api/jobs", headers=bearer(tokens["lab-member"]),
                              json=_container(4, team_id=lab))
    assert r.status_code == 201, r.text
    assert api.world is not None
    jobs_before = {job.id for job in api.world.orch.list_jobs()}
    records_before = api.services.store.jobs.page(lab).items
    r = await api.client.post("/api/jobs", headers=owner, json=_container(1, team_id=lab))
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "QUOTA_EXCEEDED" and error["field"] == "gpus"
    message = error["message"]
    assert "quota of 12" in message and "hold or may hold 12 GPUs" in message
    assert "asks for 1" in message and "cosmicac teams quota set" in message
    # not created: neither in wrk-ork nor in app-node's records
    assert {job.id for job in api.world.orch.list_jobs()} == jobs_before
    assert api.services.store.jobs.page(lab).items == records_before
    # the admin's 1-GPU job gets a GPU at once
    r = await api.client.post("/api/jobs", headers=bearer(tokens["operator"]),
                              json=_container(1))
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "starting" and r.json()["team"] == people["core"]


async def test_inference_replicas_all_count(people: dict) -> None:
    api, tokens, lab = people["api"], people["tokens"], people["lab"]
    await api.client.patch(f"/api/teams/{lab}/quota", json={"gpus": 5},
                           headers=bearer(tokens["operator"]))
    body = {"name": "llm", "type": "inference", "image": IMAGE, "gpus": 2, "replicas": 3,
            "runtime": "vllm", "model": "demo", "team_id": lab}
    r = await api.client.post("/api/jobs", headers=bearer(tokens["lab-member"]), json=body)
    assert r.status_code == 409 and "asks for 6" in r.json()["error"]["message"]
    r = await api.client.post("/api/jobs", headers=bearer(tokens["lab-member"]),
                              json={**body, "replicas": 2})
    assert r.status_code == 201, r.text


async def test_the_per_user_quota(people: dict) -> None:
    api, tokens, lab = people["api"], people["tokens"], people["lab"]
    await api.client.patch(f"/api/teams/{lab}/quota", json={"per_user_gpus": 2},
                           headers=bearer(tokens["operator"]))
    for who in ("lab-admin", "lab-member"):
        r = await api.client.post("/api/jobs", headers=bearer(tokens[who]),
                                  json=_container(2, team_id=lab))
        assert r.status_code == 201, r.text
    r = await api.client.post("/api/jobs", headers=bearer(tokens["lab-member"]),
                              json=_container(1, team_id=lab))
    assert r.status_code == 409
    message = r.json()["error"]["message"]
    assert "per-user GPU quota of 2" in message and "your jobs" in message
    # deleting one's own job frees one's share
    [mine] = [j for j in api.services.store.jobs.page(lab).items
              if j.created_by == api.services.store.users.by_email("lm@example.com").id]
    r = await api.client.delete(f"/api/jobs/{mine.id}", headers=bearer(tokens["lab-member"]))
    assert r.status_code == 202
    api.world.job_id = mine.id
    api.say(0, "deleted")
    r = await api.client.post("/api/jobs", headers=bearer(tokens["lab-member"]),
                              json=_container(1, team_id=lab))
    assert r.status_code == 201, r.text


async def test_two_creates_racing_at_the_quota_edge_one_passes(people: dict) -> None:
    api, tokens, lab = people["api"], people["tokens"], people["lab"]
    await api.client.patch(f"/api/teams/{lab}/quota", json={"gpus": 4},
                           headers=bearer(tokens["operator"]))
    r = await api.client.post("/api/jobs", headers=bearer(tokens["lab-admin"]),
                              json=_container(2, team_id=lab))
    assert r.status_code == 201
    statuses: list[int] = []

    async def create(who: str) -> None:
        r = await api.client.post("/api/jobs", headers=bearer(tokens[who]),
                                  json=_container(2, team_id=lab))
        statuses.append(r.status_code)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "lab-member")
            nursery.start_soon(create, "core-member")
    assert sorted(statuses) == [201, 409]
    assert api.world is not None
    assert sum(job.spec.gpus for job in api.world.orch.list_jobs() if job.spec.team == lab) == 4
    assert len(api.services.store.jobs.page(lab).items) == 2


# -- the store -----------------------------------------------------------------------

def test_a_version_1_store_gains_the_quota_table(tmp_path) -> None:
    path = tmp_path / "app.sqlite"
    store = Store.open(path)
    user = store.users.create(email="a@x", name="a", password_hash="h", now=1.0)
    team = store.teams.create(name="t", owner=user.id, now=1.0)
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE team_quotas")
        conn.execute("PRAGMA user_version = 1")
    store = Store.open(path)
    try:
        assert store.quotas.get(team.id).gpus is None
        assert store.quotas.set(team.id, {"gpus": 3}, now=2.0).gpus == 3
        (version,) = store.db.sqlite.execute("PRAGMA user_version").fetchone()
        assert version == SCHEMA_VERSION == 2
        store.teams.delete(team.id)  # its quota goes with it
        assert store.quotas.of_teams([team.id]) == {}
    finally:
        store.close()
