"""The store's kept answers (``store/_read_cache.py``): served with no SQLite read
while nothing changed, never after a change began (a revoked token, a changed
role, a disabled user, a new job), never past a token's expiry, and never
what a read inside an unfinished change saw."""

from __future__ import annotations

import pytest

from nodes.app_node.errors import Expired
from nodes.app_node.model import Role
from nodes.app_node.store import KEPT_PAGE, NotCached, Store, cache_only

from .test_store import spec

NOW = 1_800_000_000.0


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "app-node.sqlite")
    yield s
    s.close()


def _owner_and_token(store: Store) -> tuple[str, str, str]:
    user, team = store.users.create_first_admin(email="a@example.com", name="A",
                                                password_hash="x", team_name="t", now=NOW)
    store.tokens.add(token_hash="h" * 64, user=user.id, kind="session", now=NOW,
                     expires_at=NOW + 100)
    return user.id, team.id, "h" * 64


def _kept_reads(store: Store, user_id: str, team_id: str, token_hash: str, now: float = NOW):
    """The listing's reads, from kept answers only (NotCached if one is missing)."""
    with cache_only():
        return (store.tokens.valid(token_hash, now=now), store.users.get(user_id),
                store.teams.role_of(user_id, team_id), store.jobs.page(team_id, limit=KEPT_PAGE))


def _read(store: Store, user_id: str, team_id: str, token_hash: str, now: float = NOW):
    return (store.tokens.valid(token_hash, now=now), store.users.get(user_id),
            store.teams.role_of(user_id, team_id), store.jobs.page(team_id, limit=KEPT_PAGE))


def test_kept_answers_are_the_stores_until_a_change_begins(store: Store) -> None:
    user_id, team_id, token_hash = _owner_and_token(store)
    with pytest.raises(NotCached):  # nothing read yet
        _kept_reads(store, user_id, team_id, token_hash)
    read = _read(store, user_id, team_id, token_hash)
    assert _kept_reads(store, user_id, team_id, token_hash) == read
    assert read[2] is Role.OWNER

    store.jobs.add(id="job-1", team=team_id, created_by=user_id, spec=spec(team_id), now=NOW)
    with pytest.raises(NotCached):
        _kept_reads(store, user_id, team_id, token_hash)
    assert [j.id for j in _read(store, user_id, team_id, token_hash)[3].items] == ["job-1"]

    store.tokens.revoke(token_hash, now=NOW)
    with pytest.raises(NotCached):
        _kept_reads(store, user_id, team_id, token_hash)
    with pytest.raises(Expired):
        store.tokens.valid(token_hash, now=NOW)


def test_a_role_change_and_a_disabled_user_count_at_once(store: Store) -> None:
    _owner_id, team_id, _ = _owner_and_token(store)
    member = store.users.create(email="m@example.com", name="M", password_hash="x", now=NOW)
    store.teams.add_member(team_id, member.id, "member")
    store.tokens.add(token_hash="m" * 64, user=member.id, kind="session", now=NOW,
                     expires_at=NOW + 100)
    assert _read(store, member.id, team_id, "m" * 64)[2] is Role.MEMBER
    store.teams.change_role(team_id, member.id, "admin")
    assert store.teams.role_of(member.id, team_id) is Role.ADMIN
    store.teams.remove_member(team_id, member.id)
    assert _read(store, member.id, team_id, "m" * 64)[2] is None
    assert _kept_reads(store, member.id, team_id, "m" * 64)[2] is None  # kept: not a member
    store.users.update(member.id, disabled=True)
    with pytest.raises(Expired):
        store.tokens.valid("m" * 64, now=NOW)


def test_an_expired_token_is_not_served_from_the_cache(store: Store) -> None:
    user_id, team_id, token_hash = _owner_and_token(store)
    _read(store, user_id, team_id, token_hash)
    with pytest.raises(NotCached):
        _kept_reads(store, user_id, team_id, token_hash, now=NOW + 100)
    with pytest.raises(Expired):
        store.tokens.valid(token_hash, now=NOW + 100)


def test_reads_inside_a_change_are_not_kept_and_cache_only_writes_nothing(store: Store) -> None:
    user_id, _team_id, token_hash = _owner_and_token(store)
    with pytest.raises(RuntimeError), store.db.write():
        store.users.get(user_id)  # inside the change: what it sees may not commit
        raise RuntimeError("the change fails")
    with pytest.raises(NotCached), cache_only():
        store.users.get(user_id)
    with pytest.raises(NotCached), cache_only():
        store.tokens.revoke(token_hash, now=NOW)
    assert store.tokens.valid(token_hash, now=NOW).revoked_at is None


def test_other_pages_are_not_kept(store: Store) -> None:
    _user_id, team_id, _ = _owner_and_token(store)
    store.jobs.page(team_id, limit=10)
    store.jobs.page(team_id, limit=KEPT_PAGE, cursor="5")
    with pytest.raises(NotCached), cache_only():
        store.jobs.page(team_id, limit=10)
    with pytest.raises(NotCached), cache_only():
        store.jobs.page(team_id, limit=KEPT_PAGE, cursor="5")
