"""When a dependency fails: the email backend (502, no invitation left), a crash (JSON 500)."""

from __future__ import annotations

import httpx

from nodes.app_node.api import create_app
from nodes.app_node.email import EmailMessage, EmailRejected, SendResult

from .apis import CHEAP, Api, bearer


class RefusingSender:
    async def send(self, message: EmailMessage) -> SendResult:
        raise EmailRejected("the relay refuses mail", backend="test")


class BrokenDatabase:
    async def append(self, ops: object) -> None:
        raise RuntimeError("disk on fire")


async def test_email_refused_leaves_no_invitation(api: Api) -> None:
    owner = await api.signup()
    team = (await api.client.get("/api/me", headers=bearer(owner))).json()["active_team"]
    api.services.email = RefusingSender()
    r = await api.client.post(f"/api/teams/{team}/invitations",
                              json={"email": "n@example.com"}, headers=bearer(owner))
    assert r.status_code == 502 and r.json()["error"]["code"] == "EMAIL_FAILED"
    assert api.services.store.invitations.of_team(team) == []


async def test_crash_is_a_json_500(api: Api) -> None:
    owner = await api.signup()
    api.services.database = BrokenDatabase()  # type: ignore[assignment]
    app = create_app(api.services, password_params=CHEAP)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        r = await client.post("/api/apikeys", json={"name": "k"}, headers=bearer(owner))
    assert r.status_code == 500 and r.json()["error"]["code"] == "INTERNAL"
