"""Model masters: in the shared database, listed by anyone, changed by operators only."""

from __future__ import annotations

from crdt import PutModelMaster

from .apis import EVERYONE_CREATES, Api, bearer


async def _team(api: Api, token: str) -> str:
    return (await api.client.get("/api/me", headers=bearer(token))).json()["active_team"]


async def test_add_list_replace_remove(api: Api) -> None:
    operator = await api.signup()
    r = await api.client.get("/api/models", headers=bearer(operator))
    assert r.status_code == 200 and r.json() == {"models": []}
    body = {"name": "meta-llama/Llama-3.1-8B", "runtime": "vllm",
            "defaults": {"gpus": 2, "replicas": 1, "image": "docker://reg.example/vllm:0.6",
                         "served_name": "llama-8b"}}
    r = await api.client.post("/api/models", json=body, headers=bearer(operator))
    assert r.status_code == 201, r.text
    assert r.json() == {**body, "defaults": body["defaults"]}
    # it is the shared database's: every replica sees it
    master = await api.services.database.model_master("meta-llama/Llama-3.1-8B")
    assert master is not None and master.runtime == "vllm"
    assert master.defaults == body["defaults"]

    # posting the name again replaces it (200), keeping only the defaults given
    r = await api.client.post("/api/models", json={"name": "meta-llama/Llama-3.1-8B",
                                                   "runtime": "vllm", "defaults": {"gpus": 4}},
                              headers=bearer(operator))
    assert r.status_code == 200 and r.json()["defaults"] == {"gpus": 4}
    r = await api.client.post("/api/models", json={"name": "demo", "runtime": "local"},
                              headers=bearer(operator))
    assert r.status_code == 201 and r.json()["defaults"] == {}
    r = await api.client.get("/api/models", headers=bearer(operator))
    assert [(m["name"], m["runtime"]) for m in r.json()["models"]] == [
        ("demo", "local"), ("meta-llama/Llama-3.1-8B", "vllm")]

    # a name with a slash is one path parameter
    r = await api.client.delete("/api/models/meta-llama/Llama-3.1-8B",
                                headers=bearer(operator))
    assert r.status_code == 204
    assert await api.services.database.model_master("meta-llama/Llama-3.1-8B") is None
    r = await api.client.delete("/api/models/meta-llama/Llama-3.1-8B",
                                headers=bearer(operator))
    assert r.status_code == 404 and r.json()["error"]["field"] == "name"
    r = await api.client.get("/api/models", headers=bearer(operator))
    assert [m["name"] for m in r.json()["models"]] == ["demo"]


async def test_who_may_change_them(api: Api) -> None:
    operator = await api.signup()
    core = await _team(api, operator)
    member = await api.user("m@example.com", core, "member", operator)
    admin = await api.user("a@example.com", core, "admin", operator)
    api.services.teams = EVERYONE_CREATES  # the member makes a team of their own
    # owning another team does not make an operator
    r = await api.client.post("/api/teams", json={"name": "other"}, headers=bearer(member))
    other = r.json()["id"]
    outsider = await api.user("o@example.com", other, "admin", member)
    await api.services.database.append([PutModelMaster("demo", "local", {"gpus": 1})])
    body = {"name": "x", "runtime": "local"}

    for token in (member, outsider):
        r = await api.client.get("/api/models", headers=bearer(token))
        assert r.status_code == 200 and r.json()["models"][0]["name"] == "demo"
        r = await api.client.post("/api/models", json=body, headers=bearer(token))
        assert r.status_code == 403 and r.json()["error"]["code"] == "FORBIDDEN"
        r = await api.client.delete("/api/models/demo", headers=bearer(token))
        assert r.status_code == 403
    # an admin of the operators' team is an operator
    r = await api.client.post("/api/models", json=body, headers=bearer(admin))
    assert r.status_code == 201
    r = await api.client.delete("/api/models/x", headers=bearer(admin))
    assert r.status_code == 204
    # no session: 401
    assert (await api.client.get("/api/models")).status_code == 401
    assert (await api.client.post("/api/models", json=body)).status_code == 401


async def test_validation_names_the_field(api: Api) -> None:
    operator = await api.signup()
    cases = [
        ({"name": "-bad", "runtime": "local"}, "name"),
        ({"name": "has space", "runtime": "local"}, "name"),
        ({"name": "x" * 201, "runtime": "local"}, "name"),
        ({"name": "ok", "runtime": "tensorrt"}, "runtime"),
        ({"name": "ok"}, "runtime"),
        ({"name": "ok", "runtime": "vllm", "defaults": {"gpus": 0}}, "defaults.gpus"),
        ({"name": "ok", "runtime": "vllm", "defaults": {"gpus": 65}}, "defaults.gpus"),
        ({"name": "ok", "runtime": "vllm", "defaults": {"replicas": 0}}, "defaults.replicas"),
        ({"name": "ok", "runtime": "vllm", "defaults": {"image": "ubuntu"}}, "defaults.image"),
        ({"name": "ok", "runtime": "vllm", "defaults": {"served_name": "a b"}},
         "defaults.served_name"),
        ({"name": "ok", "runtime": "vllm", "defaults": {"location": "-x"}},
         "defaults.location"),
        ({"name": "ok", "runtime": "vllm", "defaults": {"max_tokens": 5}},
         "defaults.max_tokens"),
        ({"name": "ok", "runtime": "vllm", "defaults": []}, "defaults"),
        ({"name": "ok", "runtime": "vllm", "extra": 1}, "extra"),
    ]
    for body, field in cases:
        r = await api.client.post("/api/models", json=body, headers=bearer(operator))
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error"]["field"] == field, (body, r.json())
    r = await api.client.delete("/api/models/-bad", headers=bearer(operator))
    assert r.status_code == 422 and r.json()["error"]["field"] == "name"
    assert await api.services.database.model_masters() == []


async def test_a_masters_server_settings_are_checked_against_its_runtime(api: Api) -> None:
    operator = await api.signup()
    cases = [
        ({"name": "ok", "runtime": "vllm",
          "defaults": {"model_settings": {"args": ["--tensor-parallel-size", "2"]}}},
         "defaults.model_settings.args"),
        ({"name": "ok", "runtime": "parakeet",
          "defaults": {"model_settings": {"args": ["--device=cpu"]}}},
         "defaults.model_settings.args"),
        ({"name": "ok", "runtime": "vllm",
          "defaults": {"model_settings": {"hub_token_secret": "hf_AbCdEf123"}}},
         "defaults.model_settings.hub_token_secret"),
        ({"name": "ok", "runtime": "vllm",
          "defaults": {"model_settings": {"env": {"9X": "1"}}}},
         "defaults.model_settings.env"),
    ]
    for body, field in cases:
        r = await api.client.post("/api/models", json=body, headers=bearer(operator))
        assert r.status_code == 422, (body, r.text)
        assert r.json()["error"]["field"] == field, (body, r.json())
    # An operator may set what a job may not: the hub's endpoint, a token Secret.
    good = {"name": "ok", "runtime": "vllm", "defaults": {"model_settings": {
        "env": {"HF_ENDPOINT": "https://hub.internal"}, "hub_token_secret": "hf-token"}}}
    r = await api.client.post("/api/models", json=good, headers=bearer(operator))
    assert r.status_code == 201, r.text
    assert r.json()["defaults"]["model_settings"]["hub_token_secret"] == "hf-token"
