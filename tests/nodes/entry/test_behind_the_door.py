"""End to end: app-node behind the entry point, clients on
distinct loopback addresses (127.0.0.2, 127.0.0.3). One client using up its
allowance used to refuse everyone's logins, since app-node saw every request
come from the door; now each client has its own, and a client talking to
app-node directly cannot pick another's with X-Forwarded-For."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from nodes.app_node.daemon import serve_app_node
from nodes.app_node.settings import ApiHttpSettings, AppNodeSettings
from nodes.entry import EntrySettings, serve_entry

pytestmark = pytest.mark.slow

PASSWORD = "correct horse battery staple"


def from_address(address: str, base_url: str) -> httpx.AsyncClient:
    # verify=False: plain HTTP, so no CA bundle to load (~20 ms of CPU per client).
    return httpx.AsyncClient(
        base_url=base_url,
        trust_env=False,
        timeout=30,
        transport=httpx.AsyncHTTPTransport(local_address=address, verify=False),
    )


async def _use_up(client: httpx.AsyncClient, **kwargs) -> None:
    """Requests until the client's allowance is spent (bounded)."""
    for _ in range(200):
        if (await client.get("/api/openapi.json", **kwargs)).status_code == 429:
            return
    raise AssertionError("never limited")


async def test_one_client_behind_the_door_cannot_spend_anothers_allowance(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    settings = AppNodeSettings(
        storage=tmp_path / "app-node",
        host="127.0.0.1",
        port=0,
        http=ApiHttpSettings(host="127.0.0.1", port=0),
        fsync=False,
        limits={"trusted_proxies": ["127.0.0.1"]},
        password_hash={"ln": 4},
    )  # scrypt at 16 KiB: tests only
    with trio.fail_after(60):
        node = await nursery.start(serve_app_node, settings)
        api_url = "http://{}:{}".format(*node.http_address)
        entry = await nursery.start(
            serve_entry, EntrySettings(port=0, api_url=api_url, inference_url="http://127.0.0.1:9")
        )
        async with (
            from_address("127.0.0.2", entry.url) as attacker,
            from_address("127.0.0.3", entry.url) as user,
            from_address("127.0.0.4", api_url) as direct,
        ):
            r = await user.post(
                "/api/auth/signup",
                json={
                    "email": "admin@example.com",
                    "name": "Ada",
                    "password": PASSWORD,
                    "team_name": "ops",
                },
            )
            assert r.status_code == 201, r.text
            await _use_up(attacker)
            r = await user.post(
                "/api/auth/login", json={"email": "admin@example.com", "password": PASSWORD}
            )
            assert r.status_code == 200, r.text  # the other user is not refused
            # straight to app-node (not a trusted proxy) claiming to be the user: the
            # header is ignored, the client spends its own allowance, not the user's
            await _use_up(direct, headers={"X-Forwarded-For": "127.0.0.3"})
            r = await user.get("/api/openapi.json")
            assert r.status_code == 200
    nursery.cancel_scope.cancel()
