"""``GET /api/jobs`` from the store's kept answers (``store/_read_cache.py``): a
repeated listing reads no SQLite (no trip to a worker thread), and a logout, a
member removed or a user disabled counts from the very next request."""

from __future__ import annotations

import pytest

from nodes.app_node.store import Connection

from .apis import Api, bearer
from .support import _create


@pytest.fixture
def sqlite_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the store read SQLite (every read goes through Connection.read)."""
    count = [0]
    read = Connection.read

    def counted(self: Connection):
        count[0] += 1
        return read(self)

    monkeypatch.setattr(Connection, "read", counted)
    return count


async def _list(api: Api, token: str, query: str = "") -> tuple[int, list[str]]:
    r = await api.client.get(f"/api/jobs{query}", headers=bearer(token))
    return r.status_code, [job["id"] for job in r.json().get("jobs", ())]


async def test_listings_from_kept_answers_see_every_change_at_once(
        ork_api: Api, sqlite_reads: list[int]) -> None:
    api = ork_api
    owner = await api.signup()
    job = await _create(api, owner)
    team = job["team"]
    member = await api.user("m@example.com", team, "member", owner)
    await api.settled()
    assert await _list(api, member) == (200, [job["id"]])
    before = sqlite_reads[0]
    assert await _list(api, member) == (200, [job["id"]])
    assert sqlite_reads[0] == before  # all kept: the event loop answered alone

    other = await api.login("m@example.com")  # a second session of the member
    assert await _list(api, other, f"?team_id={team}") == (200, [job["id"]])
    assert (await api.client.post("/api/auth/logout", headers=bearer(member))).status_code \
        == 204
    assert (await _list(api, member))[0] == 401  # revoked: at once
    assert await _list(api, other, f"?team_id={team}") == (200, [job["id"]])

    member_id = api.services.store.users.by_email("m@example.com").id
    r = await api.client.delete(f"/api/teams/{team}/members/{member_id}",
                                headers=bearer(owner))
    assert r.status_code == 204, r.text
    assert (await _list(api, other, f"?team_id={team}"))[0] == 404  # not a member: at once

    assert await _list(api, owner) == (200, [job["id"]])
    api.services.store.users.update(
        api.services.store.users.by_email("admin@example.com").id, disabled=True)
    assert (await _list(api, owner))[0] == 401
