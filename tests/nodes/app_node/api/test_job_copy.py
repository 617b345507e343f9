"""app-node's copy of wrk-ork's jobs (``job_projection.py``) end to end, on a real
in-process wrk-ork: it converges through create, change and delete, rebuilds after
a gap and after wrk-ork restarts; listings and job pages read it and call wrk-ork
for nothing; a user's write shows in their next read; another team's seat and a
stranger see nothing through it; unsynced, the routes ask wrk-ork as before."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import pytest
import trio

from contracts.model import JobStatus

from ....p2p.helpers import wait_until
from .apis import Api, bearer
from .support import BOX, _inference


class CountingOrk:
    """Counts the calls made through the API's ``OrkClient``, by method name."""

    def __init__(self, api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        ork = api.services.ork
        assert ork is not None
        call = ork.call

        async def counted(method: Any, params: Any, **kwargs: Any) -> Any:
            self.calls[method.name] += 1
            return await call(method, params, **kwargs)

        monkeypatch.setattr(ork, "call", counted)


def copy_of(api: Api) -> dict[str, Any]:
    jobs = api.services.jobs
    assert jobs is not None
    return dict(jobs._jobs)


def wrk_orks(api: Api) -> dict[str, Any]:
    assert api.world is not None
    return {view.id: view for view in api.world.orch.list_jobs()}


async def _team(api: Api, token: str) -> str:
    return (await api.client.get("/api/me", headers=bearer(token))).json()["active_team"]


async def test_the_copy_converges_through_create_change_and_delete(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    ids = []
    for body in (BOX, _inference(), {**BOX, "name": "big", "gpus": 8},
                 {**BOX, "name": "waits", "gpus": 8}):
        r = await api.client.post("/api/jobs", headers=bearer(owner), json=body)
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    assert api.world is not None
    api.world.job_id = ids[1]
    api.say(0, "active")          # one replica up: the job's status does not move
    api.say(1, "failed", message="oom")
    api.world.job_id = ids[0]
    api.say(0, "active")
    r = await api.client.delete(f"/api/jobs/{ids[2]}", headers=bearer(owner))
    assert r.status_code == 202
    api.world.job_id = ids[2]
    api.say(0, "deleted")         # its GPUs are free: the Pending job is placed
    await api.settled()
    assert copy_of(api) == wrk_orks(api)
    assert set(copy_of(api)) == {ids[0], ids[1], ids[3]}
    replicas = copy_of(api)[ids[1]].replicas
    assert [(r.status.value, r.message) for r in replicas] == [("active", ""),
                                                              ("failed", "oom")]
    assert copy_of(api)[ids[3]].status is JobStatus.STARTING


async def test_listing_and_job_pages_read_the_copy_not_wrk_ork(
        ork_api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    api = ork_api
    owner = await api.signup()
    ids = [(await api.client.post("/api/jobs", headers=bearer(owner),
                                  json={**BOX, "name": f"j{i}"})).json()["id"]
           for i in range(3)]
    ork = CountingOrk(api, monkeypatch)
    for _ in range(5):
        r = await api.client.get("/api/jobs", headers=bearer(owner))
        assert r.status_code == 200
        assert [j["id"] for j in r.json()["jobs"]] == ids[::-1]
        r = await api.client.get(f"/api/jobs/{ids[0]}", headers=bearer(owner))
        assert r.status_code == 200 and r.json()["status"] == "starting"
    assert ork.calls == Counter()
    # A job wrk-ork removed behind app-node's back: asked once, its record marked
    # deleted, and no more calls after.
    assert api.world is not None and api.ork_service is not None
    api.world.orch.delete_job(ids[1], api.world.now)
    api.world.job_id = ids[1]
    api.say(0, "deleted")
    await api.settled()
    r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert [j["id"] for j in r.json()["jobs"]] == [ids[2], ids[0]]
    assert ork.calls == Counter({"jobs.list": 1})
    assert api.services.store.jobs.get(ids[1]).deleted_at is not None
    r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert ork.calls == Counter({"jobs.list": 1})


async def test_a_users_writes_show_in_their_next_read(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    team = await _team(api, owner)
    jobs = api.services.jobs
    assert jobs is not None
    r = await api.client.post("/api/jobs", headers=bearer(owner), json=_inference())
    job = r.json()["id"]
    assert jobs.get(job, team) is not None  # in the copy before the create answered
    r = await api.client.post(f"/api/jobs/{job}/restart", headers=bearer(owner))
    assert r.status_code == 200
    assert jobs.get(job, team).status is JobStatus.RESTARTING  # type: ignore[union-attr]
    r = await api.client.get(f"/api/jobs/{job}", headers=bearer(owner))
    assert r.json()["status"] == "restarting"
    r = await api.client.delete(f"/api/jobs/{job}", headers=bearer(owner))
    assert r.status_code == 202
    r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert [(j["id"], j["status"]) for j in r.json()["jobs"]] == [(job, "deleting")]
    assert jobs.statistics().write_waits_expired == 0


async def test_another_teams_seat_and_a_stranger_see_nothing_through_the_copy(
        ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    team = await _team(api, owner)
    job = (await api.client.post("/api/jobs", headers=bearer(owner), json=BOX)).json()["id"]
    store = api.services.store
    other = store.teams.create(name="other", owner=store.users.by_email(
        "admin@example.com").id, now=api.clock.now).id
    rival = await api.account("rival@example.com", team=other, role="owner")
    store.users.set_active_team(store.users.by_email("rival@example.com").id, other)
    stranger = await api.account("stranger@example.com")
    assert api.services.jobs is not None and api.services.jobs.get(job, team) is not None
    for token in (rival, stranger):
        r = await api.client.get(f"/api/jobs/{job}", headers=bearer(token))
        assert r.status_code == 404, r.text  # as a job that does not exist
        assert "status" not in r.text
        r = await api.client.get(f"/api/jobs?team_id={team}", headers=bearer(token))
        assert r.status_code == 404 and job not in r.text
    r = await api.client.get("/api/jobs", headers=bearer(rival))
    assert r.status_code == 200 and r.json()["jobs"] == []
    r = await api.client.get("/api/jobs", headers=bearer("not-a-token"))
    assert r.status_code == 401


async def test_a_gap_in_the_watch_rebuilds_the_copy(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    job = (await api.client.post("/api/jobs", headers=bearer(owner), json=BOX)).json()["id"]
    jobs = api.services.jobs
    assert jobs is not None and api.ork_service is not None and api.world is not None
    before = jobs.statistics()
    api.ork_service.revision += 3  # three changes lost on the way
    api.world.job_id = job
    api.say(0, "active")
    await wait_until(lambda: jobs.statistics().syncs == before.syncs + 1 and jobs.synced)
    assert jobs.statistics().gaps == before.gaps + 1
    await api.settled()
    assert copy_of(api) == wrk_orks(api)
    r = await api.client.get(f"/api/jobs/{job}", headers=bearer(owner))
    assert r.json()["status"] == "running"


async def test_the_copy_follows_wrk_ork_through_a_restart(
        ork_api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    api = ork_api
    owner = await api.signup()
    ids = [(await api.client.post("/api/jobs", headers=bearer(owner),
                                  json={**BOX, "name": f"j{i}"})).json()["id"]
           for i in range(2)]
    jobs = api.services.jobs
    assert jobs is not None and api.world is not None and api.ork_scope is not None
    assert api.restart_ork is not None
    syncs = jobs.statistics().syncs
    api.ork_scope.cancel()  # wrk-ork goes away
    await wait_until(lambda: not jobs.synced)
    # Unsynced, the routes ask wrk-ork as before: unreachable is 503.
    client = api.services.ork
    with monkeypatch.context() as patch:
        patch.setattr(client, "call", functools.partial(type(client).call, client,
                                                        timeout_s=0.5))
        r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert r.status_code == 503 and r.json()["error"]["code"] == "ORK_UNAVAILABLE"
    # While it is down its jobs change (as they would from its own store on restart).
    api.world.orch.delete_job(ids[0], api.world.now)
    api.world.job_id = ids[1]
    api.world.say(0, "active")
    await api.restart_ork()
    await wait_until(lambda: jobs.synced and jobs.statistics().syncs == syncs + 1)
    assert copy_of(api) == wrk_orks(api)
    assert jobs.revision == 0  # the new wrk-ork counts from 0
    ork = CountingOrk(api, monkeypatch)
    r = await api.client.get(f"/api/jobs/{ids[1]}", headers=bearer(owner))
    assert r.json()["status"] == "running"
    assert ork.calls == Counter()
    # And it follows the new wrk-ork's changes.
    api.world.orch.restart_job(ids[1], api.world.now)
    api.ork_service.pump()  # type: ignore[union-attr]
    await api.settled()
    r = await api.client.get(f"/api/jobs/{ids[1]}", headers=bearer(owner))
    assert r.json()["status"] == "restarting"


async def test_unsynced_routes_ask_wrk_ork_as_before(ork_api: Api,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    api = ork_api
    owner = await api.signup()
    job = (await api.client.post("/api/jobs", headers=bearer(owner), json=BOX)).json()["id"]
    jobs = api.services.jobs
    assert jobs is not None
    # As with a wrk-ork too old for views: the copy never syncs.
    monkeypatch.setattr(type(jobs), "synced", property(lambda self: False,
                                                        lambda self, value: None),
                        raising=False)
    ork = CountingOrk(api, monkeypatch)
    r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert [j["id"] for j in r.json()["jobs"]] == [job]
    r = await api.client.get(f"/api/jobs/{job}", headers=bearer(owner))
    assert r.status_code == 200
    assert ork.calls == Counter({"jobs.list": 1, "jobs.get": 1})
    with trio.fail_after(5):  # nothing to wait for: the routes read wrk-ork
        r = await api.client.post(f"/api/jobs/{job}/restart", headers=bearer(owner))
    assert r.status_code == 200
