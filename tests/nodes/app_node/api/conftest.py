"""An app-node API on real parts in tmp_path: the store file, a shared-database
replica, an outbox folder, an embedded limiter, a fake wall clock; cheap scrypt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from crdt import Database, FsyncPolicy
from nodes.app_node.api import create_app
from nodes.app_node.auth import ScryptParams
from nodes.app_node.email import OutboxSender
from nodes.app_node.ratelimit import EmbeddedLimiter, Limits, Rate
from nodes.app_node.services import AppServices
from nodes.app_node.store import Store
from p2p.keys import KeyPair

PASSWORD = "correct horse battery"
CHEAP = ScryptParams(ln=4, r=8, p=1)
GENEROUS = Limits(per_token=Rate(per_second=1000.0, burst=10_000),
                  per_ip=Rate(per_second=1000.0, burst=10_000))


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Api:
    client: httpx.AsyncClient
    services: AppServices
    clock: FakeClock
    outbox: Path

    async def signup(self) -> str:
        r = await self.client.post("/api/auth/signup", json={
            "email": "admin@example.com", "name": "Ada", "password": PASSWORD,
            "team_name": "core"})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    async def user(self, email: str, team: str, role: str, admin_token: str) -> str:
        """A user created straight in the store, made ``role`` of ``team``; their token."""
        from nodes.app_node.auth import hash_password
        store = self.services.store
        user = store.create_user(email=email, name=email.split("@")[0],
                                 password_hash=hash_password(PASSWORD, params=CHEAP),
                                 now=self.clock.now)
        store.add_member(team, user.id, role)
        r = await self.client.post("/api/auth/login", json={"email": email,
                                                            "password": PASSWORD})
        assert r.status_code == 200, r.text
        return r.json()["token"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def make_api(tmp_path: Path, limits: Limits = GENEROUS) -> AsyncIterator[Api]:
    clock = FakeClock()
    store = Store.open(tmp_path / "app.sqlite")
    database = await Database.open(tmp_path / "db", KeyPair.generate(),
                                   fsync=FsyncPolicy.NEVER)
    outbox = tmp_path / "outbox"
    services = AppServices(store=store, database=database, ork=None,
                           email=OutboxSender(outbox, clock_ns=lambda: int(clock.now * 1e9)),
                           limiter=EmbeddedLimiter(), limits=limits,
                           public_url="https://cosmic.example", clock=clock)
    app = create_app(services, password_params=CHEAP)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        try:
            yield Api(client, services, clock, outbox)
        finally:
            await database.aclose()
            store.close()


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async for value in make_api(tmp_path):
        yield value
