"""Job status changes as server-sent events, through app-node on the lean server
(``p2p.httpserver``, as the daemon serves it) on 127.0.0.1 (httpx's ASGI
transport would buffer a stream whole) to a real in-process wrk-ork: one job's
stream (its document first, ``running`` after the worker says active, ``gone``
after delete, keep-alives, ``lagged`` when it falls behind), the team's stream
(``ready``, ``status``, ``gone``, ``lagged`` after a resync, the end when the
client goes), 404 for another team's member, and the OpenAPI rows."""

from __future__ import annotations

import pytest
import trio

from contracts.model import JobStatus
from contracts.ork import JobEvent
from nodes.app_node.api import _events
from nodes.app_node.api._app import openapi

from ....p2p.helpers import wait_until
from .apis import Api, bearer
from .support import _create, events, served


async def test_a_job_stream_runs_from_document_to_gone(ork_api: Api,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    api = ork_api
    monkeypatch.setattr(_events, "KEEPALIVE_S", 0.05)
    owner = await api.signup()
    job = await _create(api, owner)
    hub = api.services.events
    assert hub is not None
    with trio.fail_after(60):
        await wait_until(lambda: hub.watching)
        async with served(api) as client, \
                events(client, f"/jobs/{job['id']}/events", owner) as stream:
            kind, first = await stream.next()
            got = await api.client.get(f"/api/jobs/{job['id']}", headers=bearer(owner))
            assert kind == "job" and first == got.json()
            await trio.sleep(0.2)  # keep-alives while nothing changes
            api.say(0, "active", job=job["id"])
            kind, now = await stream.next()
            assert stream.comments >= 1
            assert kind == "job" and now["status"] == "running"
            assert now["replicas"][0]["status"] == "running"

            r = await api.client.delete(f"/api/jobs/{job['id']}", headers=bearer(owner))
            assert r.status_code == 202
            assert (await stream.next()) == ("job", r.json()["job"])  # deleting
            api.say(0, "deleted", job=job["id"])
            assert (await stream.next()) == ("gone", {"id": job["id"]})
            assert await stream.ended()
        await wait_until(lambda: hub.subscribers == 0)
    assert api.services.store.jobs.get(job["id"]).deleted_at is not None


async def test_another_team_gets_404_and_a_lagging_stream_ends(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    job = await _create(api, owner)
    r = await api.client.post("/api/teams", headers=bearer(owner), json={"name": "other"})
    stranger = await api.user("s@example.com", r.json()["id"], "owner", owner)
    hub = api.services.events
    assert hub is not None
    with trio.fail_after(60):
        for path in (f"/api/jobs/{job['id']}/events", "/api/jobs/no-such-job/events"):
            r = await api.client.get(path, headers=bearer(stranger))
            assert r.status_code == 404 and r.json()["error"]["field"] == "job"
        r = await api.client.get("/api/jobs/events", headers=bearer(stranger),
                                 params={"team_id": job["team"]})
        assert r.status_code == 404
        r = await api.client.get(f"/api/jobs/{job['id']}/events")
        assert r.status_code == 401

        async with served(api) as client, \
                events(client, f"/jobs/{job['id']}/events", owner) as stream:
            assert (await stream.next())[0] == "job"
            flood = JobEvent(job_id=job["id"], team=job["team"], status=JobStatus.STARTING,
                             previous=JobStatus.QUEUED, reason="", at=1.0)
            for _ in range(hub.capacity + 2):  # faster than any reader (one may be taken): dropped
                hub.publish(flood)
            assert hub.dropped == 1
            kind, data = await stream.next()
            while kind == "job":  # what it had queued, re-read, then the news
                kind, data = await stream.next()
            assert (kind, data) == ("lagged", {"id": job["id"]})
            assert await stream.ended()


async def test_the_team_stream(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    hub = api.services.events
    assert hub is not None
    with trio.fail_after(60):
        await wait_until(lambda: hub.watching)
        async with served(api) as client, events(client, "/jobs/events", owner) as stream:
            kind, ready = await stream.next()
            assert kind == "ready"
            job = await _create(api, owner)
            assert ready == {"team": job["team"]}
            kind, change = await stream.next()
            assert kind == "status" and change["id"] == job["id"]
            assert change["team"] == job["team"]
            api.say(0, "active", job=job["id"])
            while change["status"] != "running":
                kind, change = await stream.next()
                assert kind == "status"
            r = await api.client.delete(f"/api/jobs/{job['id']}", headers=bearer(owner))
            assert r.status_code == 202
            api.say(0, "deleted", job=job["id"])
            while kind != "gone":
                kind, change = await stream.next()
            assert change == {"id": job["id"], "team": job["team"]}
            hub.resync()  # a new watch of wrk-ork: changes may have been missed
            assert (await stream.next()) == ("lagged", {"team": job["team"]})
            assert await stream.ended()
            # A client that goes away ends its stream (and its subscription).
            async with events(client, "/jobs/events", owner) as stream:
                assert (await stream.next())[0] == "ready"
                assert hub.subscribers == 1
        await wait_until(lambda: hub.subscribers == 0)


async def test_the_team_stream_announces_a_job_only_once_app_node_has_its_record(
        ork_api: Api, monkeypatch) -> None:
    """wrk-ork's first events of a new job can come before the create route has
    written app-node's record; a status announced then would be a job that
    ``GET /api/jobs/{job}`` denies (the web UI's live list broke on it under load)."""
    api = ork_api
    owner = await api.signup()
    job = await _create(api, owner)
    hub = api.services.events
    assert hub is not None
    known = api.services.store.jobs.get(job["id"])
    monkeypatch.setattr(_events, "RECORD_WAIT_S", 0.5)

    def announce(job_id: str) -> None:
        hub.publish(JobEvent(job_id=job_id, team=job["team"], status=JobStatus.QUEUED,
                             previous=JobStatus.CREATING, reason="", at=1.0))

    with trio.fail_after(60):
        await wait_until(lambda: hub.watching)
        async with served(api) as client, events(client, "/jobs/events", owner) as stream:
            assert (await stream.next())[0] == "ready"
            announce("j-never-recorded")  # its creation undone: never announced
            announce("j-recorded-late")
            await trio.sleep(0.8)  # the first given up; the second still waits
            api.services.store.jobs.add(id="j-recorded-late", team=job["team"],
                                        created_by=known.created_by, spec=known.spec, now=1.0)
            kind, change = await stream.next()
            assert (kind, change["id"]) == ("status", "j-recorded-late")


def test_openapi_lists_the_streams() -> None:
    paths = openapi()["paths"]
    job = paths["/api/jobs/{job}/events"]["get"]["responses"]["200"]["content"]
    assert job["text/event-stream"]["schema"] == {"$ref": "#/components/schemas/JobOut"}
    team = paths["/api/jobs/events"]["get"]
    assert "text/event-stream" in team["responses"]["200"]["content"]
    assert team["parameters"][0]["name"] == "team_id"
