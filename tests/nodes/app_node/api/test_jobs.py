"""Jobs and replicas through app-node to a real in-process wrk-ork: create (container
jobs carry the members' CLI keys), list with live status, get, restart, delete,
replica routes; 422 naming fields, 409 for a served name in use, another team's
job 404, wrk-ork absent or unreachable 503."""

from __future__ import annotations

import functools

import pytest

from p2p.rpc import RpcError

from ....p2p.helpers import wait_until
from .apis import PASSWORD, Api, bearer
from .support import _inference

IMAGE = "docker://registry.local/jobs/app:1"
KEY_A, KEY_B = "aa" * 32, "bb" * 32


async def _team(api: Api, token: str) -> str:
    return (await api.client.get("/api/me", headers=bearer(token))).json()["active_team"]


def _set_key(api: Api, email: str, key: str) -> None:
    store = api.services.store
    store.users.set_cli_key(store.users.by_email(email).id, key)


async def test_container_job_carries_the_members_cli_keys(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    team = await _team(api, owner)
    member = await api.user("m@example.com", team, "member", owner)
    _set_key(api, "admin@example.com", KEY_A)
    _set_key(api, "m@example.com", KEY_B)
    await api.user("nokey@example.com", team, "member", owner)
    r = await api.client.post("/api/jobs", headers=bearer(member), json={
        "name": "shell", "type": "container", "image": IMAGE, "gpus": 2})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["team"] == team and job["type"] == "container"
    assert job["spec"]["authorized_keys"] == [KEY_A, KEY_B]
    assert job["status"] in {"queued", "starting"} and len(job["replicas"]) == 1
    record = api.services.store.jobs.get(job["id"])
    assert record.spec.authorized_keys == (KEY_A, KEY_B)
    assert api.world is not None
    assert api.world.orch.get_job(job["id"]).spec.authorized_keys == (KEY_A, KEY_B)

    api.world.job_id = job["id"]
    api.say(0, "active")
    await api.settled()  # the worker's report reaches app-node through the watch
    r = await api.client.get(f"/api/jobs/{job['id']}", headers=bearer(owner))
    assert r.status_code == 200 and r.json()["status"] == "running"
    assert r.json()["replicas"][0]["status"] == "running"
    assert r.json()["replicas"][0]["nodes"]


async def test_inference_list_restart_replicas_delete(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    r = await api.client.post("/api/jobs", headers=bearer(owner), json=_inference())
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["spec"]["authorized_keys"] == [] and len(job["replicas"]) == 2
    assert job["spec"]["runtime"] == "vllm" and job["created_by"]
    r = await api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "box", "type": "container", "image": IMAGE, "gpus": 1})
    other = r.json()["id"]

    r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert r.status_code == 200, r.text
    assert [j["id"] for j in r.json()["jobs"]] == [other, job["id"]]
    assert all(j["status"] for j in r.json()["jobs"])

    r = await api.client.post(f"/api/jobs/{job['id']}/replicas/1/restart",
                              headers=bearer(owner))
    assert r.status_code == 200, r.text
    r = await api.client.post(f"/api/jobs/{job['id']}/replicas/9/restart",
                              headers=bearer(owner))
    assert r.status_code == 404, r.text
    r = await api.client.delete(f"/api/jobs/{job['id']}/replicas/0", headers=bearer(owner))
    assert r.status_code == 200, r.text
    r = await api.client.post(f"/api/jobs/{job['id']}/replicas/1/restart",
                              headers=bearer(owner))
    assert r.status_code == 409 and r.json()["error"]["code"] == "INVALID_STATE"
    r = await api.client.post(f"/api/jobs/{other}/restart", headers=bearer(owner))
    assert r.status_code == 200, r.text
    r = await api.client.post(f"/api/jobs/{job['id']}/replicas/x/restart",
                              headers=bearer(owner))
    assert r.status_code == 422 and r.json()["error"]["field"] == "replica"

    r = await api.client.delete(f"/api/jobs/{other}", headers=bearer(owner))
    assert r.status_code in (200, 202), r.text
    if not r.json()["gone"]:
        assert r.json()["job"]["status"] == "deleting"
        assert api.world is not None
        api.world.job_id = other
        api.say(0, "deleted")
        await api.settled()
    r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert [j["id"] for j in r.json()["jobs"]] == [job["id"]]
    assert api.services.store.jobs.get(other).deleted_at is not None
    r = await api.client.get(f"/api/jobs/{other}", headers=bearer(owner))
    assert r.status_code == 404


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "s", "type": "container", "image": IMAGE, "gpus": 0}, "gpus"),
    ({"name": "s", "type": "container", "image": IMAGE, "gpus": 1, "model": "m"}, "model"),
    ({"name": "s", "type": "container", "gpus": 1}, "image"),
    ({"name": "s", "type": "container", "image": "nginx", "gpus": 1}, "image"),
    ({"name": "s", "type": "inference", "image": IMAGE, "gpus": 1, "model": "m"}, "runtime"),
    ({"name": "s", "type": "vm", "image": IMAGE, "gpus": 1}, "type"),
])
async def test_invalid_bodies_name_the_field(ork_api: Api, body: dict, field: str) -> None:
    owner = await ork_api.signup()
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field


async def test_served_name_in_use_is_409(ork_api: Api) -> None:
    owner = await ork_api.signup()
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner),
                                  json=_inference(served_name="chat"))
    assert r.status_code == 201, r.text
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner),
                                  json=_inference(served_name="chat"))
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "CONFLICT"
    assert r.json()["error"]["field"] == "served_name"


async def test_another_teams_job_is_404(ork_api: Api) -> None:
    api = ork_api
    owner = await api.signup()
    r = await api.client.post("/api/jobs", headers=bearer(owner), json=_inference())
    job = r.json()["id"]
    r = await api.client.post("/api/teams", json={"name": "other"}, headers=bearer(owner))
    outsider = await api.user("o@example.com", r.json()["id"], "member", owner)
    for method, path in [("GET", f"/api/jobs/{job}"), ("POST", f"/api/jobs/{job}/restart"),
                         ("DELETE", f"/api/jobs/{job}"),
                         ("DELETE", f"/api/jobs/{job}/replicas/0")]:
        r = await api.client.request(method, path, headers=bearer(outsider))
        assert r.status_code == 404, (method, path, r.text)
    r = await api.client.get("/api/jobs", headers=bearer(outsider))
    assert r.json()["jobs"] == []
    team = await _team(api, owner)
    r = await api.client.get(f"/api/jobs?team_id={team}", headers=bearer(outsider))
    assert r.status_code == 404


async def test_ork_not_configured_is_503(api: Api) -> None:
    owner = await api.signup()
    r = await api.client.post("/api/jobs", headers=bearer(owner), json=_inference())
    assert r.status_code == 503 and r.json()["error"]["code"] == "ORK_UNAVAILABLE"
    # No job to show: nothing to ask wrk-ork, so no 503 for an empty list.
    r = await api.client.get("/api/jobs", headers=bearer(owner))
    assert r.status_code == 200 and r.json()["jobs"] == []


async def test_ork_unreachable_is_503(ork_api: Api, monkeypatch) -> None:
    api = ork_api
    owner = await api.signup()
    assert api.ork_scope is not None and api.services.ork is not None
    api.ork_scope.cancel()
    client = api.services.ork
    monkeypatch.setattr(client, "call", functools.partial(type(client).call, client,
                                                          timeout_s=0.5))
    await wait_until(lambda: not client.connected, limit_s=30)
    r = await api.client.post("/api/jobs", headers=bearer(owner), json=_inference())
    assert r.status_code == 503, r.text
    assert "not reachable" in r.json()["error"]["message"]


class _RefusingOrk:
    """An ork client whose every call fails with one wrk-ork code."""

    def __init__(self, code: str, data=None) -> None:
        self.error = RpcError(code, f"refused: {code}", data=data)

    async def call(self, method, params):
        raise self.error


@pytest.mark.parametrize(("code", "data", "status", "field"), [
    ("FORBIDDEN", None, 503, None),
    ("BAD_REQUEST", None, 422, None),
    ("INVALID_PARAMS", [{"field": "spec.gpus", "error": "too many"}], 422, "gpus"),
    ("STORE", None, 502, None),
])
async def test_wrk_ork_codes_map_to_statuses(api: Api, code, data, status, field) -> None:
    owner = await api.signup()
    api.services.ork = _RefusingOrk(code, data)  # type: ignore[assignment]
    r = await api.client.post("/api/jobs", headers=bearer(owner), json=_inference())
    assert r.status_code == status, r.text
    assert r.json()["error"].get("field") == field
    if code == "FORBIDDEN":
        assert "misconfiguration" in r.json()["error"]["message"]


async def test_a_job_the_store_cannot_record_is_deleted_in_wrk_ork(ork_api: Api,
                                                                    monkeypatch) -> None:
    api = ork_api
    owner = await api.signup()
    from nodes.app_node.errors import Conflict

    def refuse(**kwargs):
        raise Conflict("the store refuses")
    monkeypatch.setattr(api.services.store.jobs, "add", refuse)
    r = await api.client.post("/api/jobs", headers=bearer(owner), json=_inference())
    assert r.status_code == 409, r.text
    assert api.world is not None
    assert [j.status.value for j in api.world.orch.list_jobs(None)] in ([], ["deleting"])


async def test_openapi_lists_the_job_and_rack_routes(api: Api) -> None:
    paths = (await api.client.get("/api/openapi.json")).json()["paths"]
    assert {"post", "get"} <= set(paths["/api/jobs"])
    assert "delete" in paths["/api/jobs/{job}/replicas/{replica}"]
    assert {"get", "post"} <= set(paths["/api/racks"]) and "post" in paths["/api/nodes/reserve"]


async def test_a_job_without_image_gets_the_deployments_default_image(ork_api: Api) -> None:
    owner = await ork_api.signup()
    default = "docker://registry.example/base/cuda:12"
    ork_api.services.default_image = default
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "box", "type": "container", "gpus": 1})
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["image"] == default
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "own", "type": "container", "gpus": 1, "image": IMAGE})
    assert r.status_code == 201 and r.json()["spec"]["image"] == IMAGE  # named beats default


def test_default_image_must_be_a_registry_image(tmp_path) -> None:
    from pydantic import ValidationError

    from nodes.app_node.settings import AppNodeSettings

    with pytest.raises(ValidationError, match="not a registry image"):
        AppNodeSettings(storage=tmp_path, default_image="nginx")


async def test_an_inference_job_takes_what_it_leaves_out_from_its_model_master(
        ork_api: Api) -> None:
    owner = await ork_api.signup()
    r = await ork_api.client.post("/api/models", headers=bearer(owner), json={
        "name": "llama-8b", "runtime": "vllm",
        "defaults": {"gpus": 2, "replicas": 2, "served_name": "llama"}})
    assert r.status_code == 201, r.text
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "m", "type": "inference", "model": "llama-8b", "image": IMAGE})
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert (spec["runtime"], spec["gpus"], spec["replicas"], spec["served_name"]) == \
        ("vllm", 2, 2, "llama")
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "n", "type": "inference", "model": "llama-8b", "image": IMAGE, "gpus": 1,
        "replicas": 1, "served_name": "mine"})
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert (spec["gpus"], spec["replicas"], spec["served_name"]) == (1, 1, "mine")
    # No master, no runtime: still the runtime's 422.
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "o", "type": "inference", "model": "unknown", "image": IMAGE})
    assert r.status_code == 422 and r.json()["error"]["field"] == "runtime"


async def test_a_job_gets_its_masters_server_settings_and_lays_its_own_over_them(
        ork_api: Api) -> None:
    owner = await ork_api.signup()
    settings = {"args": ["--max-model-len", "8192"], "env": {"HF_HUB_OFFLINE": "1"},
                "hub_token_secret": "hf-token"}
    r = await ork_api.client.post("/api/models", headers=bearer(owner), json={
        "name": "llama-8b", "runtime": "vllm", "defaults": {"model_settings": settings}})
    assert r.status_code == 201, r.text
    own = {"args": ["--max-model-len", "4096"], "env": {"VLLM_LOGGING_LEVEL": "DEBUG"}}
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "m", "type": "inference", "model": "llama-8b", "image": IMAGE,
        "runtime_settings": own})
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["model_settings"] == settings  # copied: a later change leaves the job be
    assert spec["runtime_settings"] == own
    # What the web UI's Duplicate sends back (the job's own settings) is taken again.
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "m2", "type": "inference", "model": "llama-8b", "image": IMAGE,
        "served_name": "llama-2", "runtime_settings": spec["runtime_settings"]})
    assert r.status_code == 201, r.text


async def test_server_settings_a_job_may_not_have_are_refused_naming_the_field(
        ork_api: Api) -> None:
    owner = await ork_api.signup()
    inference = {"name": "m", "type": "inference", "runtime": "vllm", "model": "x",
                 "image": IMAGE}
    cases = [
        ({**inference, "runtime_settings": {"env": {"HF_ENDPOINT": "https://evil.example"}}},
         "runtime_settings.env"),
        ({**inference, "runtime_settings": {"env": {"LD_PRELOAD": "/tmp/x.so"}}},
         "runtime_settings.env"),
        ({**inference, "runtime_settings": {"args": ["--port", "1"]}}, "runtime_settings.args"),
        ({**inference, "runtime_settings": {"args": ["--served-model-name=other"]}},
         "runtime_settings.args"),
        ({**inference, "runtime_settings": {"hub_token_secret": "someone-elses"}},
         "runtime_settings.hub_token_secret"),
        ({"name": "c", "type": "container", "gpus": 1, "image": IMAGE,
          "runtime_settings": {"args": ["--x"]}}, "runtime_settings"),
    ]
    for body, field in cases:
        r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json=body)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error"]["field"] == field, (body, r.json())


async def test_a_member_gets_the_isolated_networks_gateway_and_their_own_tunnel_address(
        ork_api: Api) -> None:
    from contracts.gateway import GatewayView
    from p2p.keys import KeyPair
    from runtime.wireguard import assign_addresses, wg_key

    assert ork_api.world is not None
    ork_api.world.report = ork_api.world.report.model_copy(update={"isolated_networks": True})
    ork_api.world.hear()
    ada, bob = KeyPair.generate(), KeyPair.generate()
    owner = await ork_api.signup()
    r = await ork_api.client.post("/api/auth/login", json={
        "email": "admin@example.com", "password": PASSWORD, "cli_public_key": ada.hex})
    owner = r.json()["token"]
    team = (await ork_api.client.get("/api/me", headers=bearer(owner))).json()["active_team"]
    member = await ork_api.user("bob@example.com", team, "member", owner)
    r = await ork_api.client.post("/api/auth/login", json={
        "email": "bob@example.com", "password": PASSWORD, "cli_public_key": bob.hex})
    member = r.json()["token"]
    outsider = await ork_api.account("eve@example.com")
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "private", "type": "container", "image": IMAGE, "gpus": 1,
        "isolated_network": True})
    assert r.status_code == 201, r.text
    job = r.json()["id"]
    assert r.json()["spec"]["isolated_network"] is True
    path = f"/api/jobs/{job}/wireguard"
    r = await ork_api.client.get(path, headers=bearer(member))
    assert r.status_code == 409 and "not up yet" in r.json()["error"]["message"]

    gateway = GatewayView(public_key=wg_key(b"\x05" * 32), endpoint="gw.example.net:30000",
                          tunnel_subnet="10.250.0.0/24", networks=("10.88.0.0/24",))
    ork_api.say(0, "active", job=job, gateway=gateway)
    await ork_api.settled()
    addresses = assign_addresses("10.250.0.0/24", [ada.public_key, bob.public_key])
    r = await ork_api.client.get(path, headers=bearer(member))  # wrk-ork's view has it now
    assert r.json() == {"job": job, "cli_public_key": bob.hex,
                        "gateway_public_key": gateway.public_key,
                        "endpoint": "gw.example.net:30000",
                        "address": str(addresses[bob.public_key]),
                        "tunnel_subnet": "10.250.0.0/24", "networks": ["10.88.0.0/24"]}
    r = await ork_api.client.get(path, headers=bearer(owner))
    assert r.json()["address"] == str(addresses[ada.public_key])
    # Another team's seat, and no seat: as if the job did not exist.
    assert (await ork_api.client.get(path, headers=bearer(outsider))).status_code == 404
    assert (await ork_api.client.get(path)).status_code == 401


async def test_only_a_container_job_takes_an_isolated_network_and_only_where_offered(
        ork_api: Api) -> None:
    owner = await ork_api.signup()
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "m", "type": "inference", "runtime": "vllm", "model": "x", "image": IMAGE,
        "isolated_network": True})
    assert r.status_code == 422 and r.json()["error"]["field"] == "isolated_network"
    # The world's rack offers none: wrk-ork refuses to place it, naming why.
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "c", "type": "container", "image": IMAGE, "gpus": 1,
        "isolated_network": True})
    assert r.status_code in (201, 409, 422), r.text
    text = r.text if r.status_code != 201 else r.json()["reason"]
    assert "WireGuard gateways" in text, (r.json()["status"], r.json()["reason"])
    r = await ork_api.client.post("/api/jobs", headers=bearer(owner), json={
        "name": "plain", "type": "container", "image": IMAGE, "gpus": 1})
    job = r.json()["id"]
    r = await ork_api.client.get(f"/api/jobs/{job}/wireguard", headers=bearer(owner))
    assert r.status_code == 409 and "no isolated network" in r.json()["error"]["message"]
