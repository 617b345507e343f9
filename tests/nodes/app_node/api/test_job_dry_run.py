"""``POST /api/jobs?dry_run=true``: a create's every check and answer, then what
wrk-ork would do (``jobs.preview``), and nothing recorded anywhere.

Each refusal is compared with the same request without ``dry_run`` (status, code and
field equal), from the seats that matter: another team's member, a stranger in no
team, over a quota. A wrk-ork older than ``jobs.preview`` is this one with the
method taken out of its router (it answers ``UNKNOWN_METHOD``) or also out of its
access table (it answers ``FORBIDDEN``, as an older wrk-ork's table does for a
method it does not list)."""

from __future__ import annotations

from types import MappingProxyType

import httpx
import pytest

from contracts.ork import PREVIEW_JOB

from .apis import IMAGE, Api, Tenants, bearer
from .support import BOX, _inference

DRY = "/api/jobs?dry_run=true"


def _answer(r: httpx.Response) -> tuple[int, str | None, str | None]:
    error = r.json().get("error") if r.status_code >= 400 else None
    return r.status_code, error and error["code"], error and error.get("field")


async def _nothing_recorded(api: Api, token: str, jobs_before: int = 0) -> None:
    assert api.world is not None
    assert len(api.world.orch.list_jobs()) == jobs_before
    assert api.world.orch.outbox() == [] or jobs_before
    r = await api.client.get("/api/jobs", headers=bearer(token))
    assert r.status_code == 200 and len(r.json()["jobs"]) == jobs_before


async def test_a_dry_run_answers_the_would_be_job_and_where_it_would_run(
        ork_api: Api) -> None:
    api = ork_api
    token = await api.signup()
    body = _inference(served_name="chat")
    r = await api.client.post(DRY, headers=bearer(token), json=body)
    assert r.status_code == 200, r.text
    preview = r.json()
    assert (preview["name"], preview["type"], preview["status"]) == ("llm", "inference",
                                                                     "starting")
    assert preview["spec"]["served_name"] == "chat" and preview["spec"]["location"] == "default"
    assert preview["rack"] is not None and preview["reason"] == ""
    assert [(p["index"], p["status"], len(p["nodes"]), p["gpus"])
            for p in preview["replicas"]] == [(0, "starting", 1, [1]), (1, "starting", 1, [1])]
    await _nothing_recorded(api, token)

    created = await api.client.post("/api/jobs", headers=bearer(token), json=body)
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["rack"] == preview["rack"] and job["spec"] == preview["spec"]
    assert [r["nodes"] for r in job["replicas"]] == [p["nodes"] for p in preview["replicas"]]
    # The same served name again: create's 409, from the dry run too.
    again = await api.client.post(DRY, headers=bearer(token), json=body)
    assert _answer(again) == (409, "CONFLICT", "served_name")


async def test_a_dry_run_says_why_the_job_would_wait_or_fail(ork_api: Api) -> None:
    api = ork_api
    token = await api.signup()
    for _ in range(2):  # both 8-GPU nodes taken
        r = await api.client.post("/api/jobs", headers=bearer(token), json={**BOX, "gpus": 8})
        assert r.status_code == 201, r.text
    waiting = (await api.client.post(DRY, headers=bearer(token), json=BOX)).json()
    assert waiting["status"] == "pending" and "no room now" in waiting["reason"]
    assert waiting["rack"] is None and waiting["replicas"][0]["nodes"] == []
    never = (await api.client.post(DRY, headers=bearer(token),
                                   json={**BOX, "location": "mars"})).json()
    assert never["status"] == "failed" and "location mars" in never["reason"]
    await _nothing_recorded(api, token, jobs_before=2)


@pytest.mark.parametrize("body", [
    {**BOX, "gpus": 0}, {**BOX, "image": "ubuntu"}, {**BOX, "colour": "red"},
    {**BOX, "type": "container", "model": "demo"}, {"name": "x"},
    {**BOX, "isolated_network": True, "type": "inference", "runtime": "vllm",
     "model": "demo"},
], ids=["gpus", "image", "unknown", "container-model", "no-type", "isolated"])
async def test_a_bad_body_gets_create_s_422_naming_the_field(ork_api: Api, body) -> None:
    api = ork_api
    token = await api.signup()
    dry = await api.client.post(DRY, headers=bearer(token), json=body)
    real = await api.client.post("/api/jobs", headers=bearer(token), json=body)
    assert _answer(dry) == _answer(real) and dry.status_code == 422
    assert _answer(dry)[2] is not None  # names the field
    bad = await api.client.post("/api/jobs?dry_run=maybe", headers=bearer(token), json=BOX)
    assert _answer(bad) == (422, "INVALID", "dry_run")
    await _nothing_recorded(api, token)


async def test_another_team_a_stranger_and_a_quota_get_create_s_answers(
        tenants: Tenants) -> None:
    t, api = tenants, tenants.api
    assert api.world is not None
    jobs_before = len(api.world.orch.list_jobs())
    body = {**BOX, "team_id": t.a["team"]}
    seats = {"another team's member": t.b_member, "another team's owner": t.b_owner,
             "a stranger": t.stranger, "a forged token": "cac_forged"}
    for seat, token in seats.items():
        dry = await api.client.post(DRY, headers=bearer(token), json=body)
        real = await api.client.post("/api/jobs", headers=bearer(token), json=body)
        assert dry.status_code in (401, 403, 404), (seat, dry.text)
        assert _answer(dry) == _answer(real), seat
        assert not any(secret in dry.text for secret in t.secrets - {t.a["team"]}), seat
    # Without team_id, the stranger has no team at all: the same 422 both ways.
    dry = await api.client.post(DRY, headers=bearer(t.stranger), json=BOX)
    real = await api.client.post("/api/jobs", headers=bearer(t.stranger), json=BOX)
    assert _answer(dry) == _answer(real) and dry.status_code == 422

    # Team A's jobs hold 3 GPUs; at a quota of 3 one more is over it, both ways.
    r = await api.client.patch(f"/api/teams/{t.a['team']}/quota", headers=bearer(t.operator),
                               json={"gpus": 3})
    assert r.status_code == 200, r.text
    dry = await api.client.post(DRY, headers=bearer(t.a_member), json=body)
    real = await api.client.post("/api/jobs", headers=bearer(t.a_member), json=body)
    assert _answer(dry) == _answer(real) == (409, "QUOTA_EXCEEDED", "gpus")
    assert dry.json()["error"]["message"] == real.json()["error"]["message"]
    # A member of team A may: the dry run answers, and still records nothing.
    r = await api.client.patch(f"/api/teams/{t.a['team']}/quota", headers=bearer(t.operator),
                               json={"gpus": 4})
    for _ in range(3):
        dry = await api.client.post(DRY, headers=bearer(t.a_member), json=body)
        assert dry.status_code == 200 and dry.json()["team"] == t.a["team"], dry.text
    assert len(api.world.orch.list_jobs()) == jobs_before


def _older(api: Api, *, unlisted: bool) -> None:
    """Make the running wrk-ork one that predates ``jobs.preview``: not routed (so
    ``UNKNOWN_METHOD``), and with ``unlisted`` not in its access table either
    (``FORBIDDEN``, before routing: what an older wrk-ork answers)."""
    service = api.ork_service
    assert service is not None
    service.router._routes.pop(PREVIEW_JOB.name)
    if unlisted:
        service.access.table = MappingProxyType(
            {k: v for k, v in service.access.table.items() if k != PREVIEW_JOB.name})


@pytest.mark.parametrize("unlisted", [False, True], ids=["unknown-method", "forbidden"])
async def test_an_older_wrk_ork_leaves_the_placement_unknown_after_every_check(
        ork_api: Api, unlisted: bool) -> None:
    api = ork_api
    token = await api.signup()
    _older(api, unlisted=unlisted)
    r = await api.client.post(DRY, headers=bearer(token), json={**BOX, "gpus": 2})
    assert r.status_code == 200, r.text
    preview = r.json()
    assert preview["status"] is None and "placement unknown" in preview["reason"]
    assert preview["spec"]["gpus"] == 2 and preview["spec"]["image"] == IMAGE
    assert [p["status"] for p in preview["replicas"]] == ["unknown"]
    # app-node's own checks still run.
    bad = await api.client.post(DRY, headers=bearer(token), json={**BOX, "gpus": 0})
    assert _answer(bad) == (422, "INVALID", "gpus")
    await _nothing_recorded(api, token)


async def test_a_wrk_ork_refusing_app_node_s_key_is_503_not_unknown(ork_api: Api) -> None:
    api = ork_api
    token = await api.signup()
    assert api.ork_service is not None
    api.ork_service.access._roles_of = lambda key: frozenset()  # app-node's key untrusted
    r = await api.client.post(DRY, headers=bearer(token), json=BOX)
    assert _answer(r) == (503, "ORK_UNAVAILABLE", None)
    assert "app_nodes" in r.json()["error"]["message"]
