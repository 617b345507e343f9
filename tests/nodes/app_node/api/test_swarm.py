"""``GET /api/swarm``: the bootstrap and relays a user's CLI joins the swarm with;
``cli_bootstrap`` overrides what app-node itself uses; a session is needed."""

from __future__ import annotations

from nodes.app_node.api._swarm import swarm_advert
from nodes.app_node.services import SwarmAdvert
from nodes.app_node.settings import AppNodeSettings

from .apis import Api, bearer

RELAY = "ab" * 32


async def test_a_session_reads_the_advertised_bootstrap_and_relays(api: Api) -> None:
    token = await api.signup()
    api.services.swarm = SwarmAdvert(bootstrap=("198.51.100.1:49737", "[::1]:49738"),
                                     relays=(RELAY,),
                                     relay_addresses=((RELAY, ("198.51.100.2:49736",)),))
    r = await api.client.get("/api/swarm", headers=bearer(token))
    assert r.status_code == 200, r.text
    assert r.json() == {"bootstrap": ["198.51.100.1:49737", "[::1]:49738"], "relays": [RELAY],
                        "relay_addresses": {RELAY: ["198.51.100.2:49736"]}}


async def test_without_an_advert_the_lists_are_empty(api: Api) -> None:
    token = await api.signup()
    r = await api.client.get("/api/swarm", headers=bearer(token))
    assert r.status_code == 200
    assert r.json() == {"bootstrap": [], "relays": [], "relay_addresses": {}}


async def test_no_session_is_401(api: Api) -> None:
    r = await api.client.get("/api/swarm")
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"


async def test_the_route_is_in_the_published_schema(api: Api) -> None:
    r = await api.client.get("/api/openapi.json")
    assert "get" in r.json()["paths"]["/api/swarm"]


def test_cli_bootstrap_overrides_the_bootstrap_app_node_uses(tmp_path) -> None:
    settings = AppNodeSettings(storage=tmp_path, bootstrap="10.0.0.5:49737",
                               relays=RELAY)
    assert swarm_advert(settings) == SwarmAdvert(("10.0.0.5:49737",), (RELAY,))
    # A relay's address is advertised (a CLI pairs through it with no DHT); an
    # address of a key that is not one of the relays is not.
    other = "cd" * 32
    placed = AppNodeSettings(storage=tmp_path, relays=RELAY, relay_addresses={
        RELAY: ["198.51.100.2:49736", "[2001:db8::2]:49736"], other: ["10.9.9.9:1"]})
    assert swarm_advert(placed).relay_addresses == (
        (RELAY, ("198.51.100.2:49736", "[2001:db8::2]:49736")),)
    public = settings.model_copy(update={"cli_bootstrap": (("203.0.113.9", 49737),
                                                            ("::1", 5))})
    assert swarm_advert(public).bootstrap == ("203.0.113.9:49737", "[::1]:5")


def test_cli_bootstrap_reads_from_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COSMICAC_APP_NODE__CLI_BOOTSTRAP", "203.0.113.7:1,203.0.113.8:2")
    settings = AppNodeSettings(storage=tmp_path)
    assert settings.cli_bootstrap == (("203.0.113.7", 1), ("203.0.113.8", 2))
    assert swarm_advert(settings).bootstrap == ("203.0.113.7:1", "203.0.113.8:2")
