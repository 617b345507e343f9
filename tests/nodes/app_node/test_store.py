"""app-node's store: every method's happy path and refusals, atomicity, and the file's
lifecycle (migration from empty, reopening, a newer schema refused)."""

from __future__ import annotations

import sqlite3

import pytest

from contracts.model import JobSpec, JobType
from nodes.app_node.errors import (
    AppNodeError,
    Conflict,
    Expired,
    Invalid,
    LastOwner,
    NotFound,
    StoreError,
    WrongAccount,
)
from nodes.app_node.model import Role, TokenKind
from nodes.app_node.store import SCHEMA_VERSION, Store

KEY = "ab" * 32
T0 = 1_000_000.0


@pytest.fixture
def store():
    store = Store.open(None)
    yield store
    store.close()


def admin(store: Store):
    return store.users.create_first_admin(email="Admin@Example.com", name="Ada", password_hash="h0",
                                          team_name="Core", now=T0)


def spec(team: str, name: str = "job", **kw) -> JobSpec:
    return JobSpec(name=name, team=team, type=JobType.CONTAINER,
                   image="docker://registry.local/cuda:12", gpus=1, **kw)


def test_error_codes_are_stable():
    codes = {cls: cls.code for cls in (NotFound, Conflict, Invalid, LastOwner, Expired,
                                       StoreError)}
    assert codes == {NotFound: "NOT_FOUND", Conflict: "CONFLICT", Invalid: "INVALID",
                     LastOwner: "LAST_OWNER", Expired: "EXPIRED", StoreError: "STORE"}
    assert all(issubclass(cls, AppNodeError) for cls in codes)
    assert Invalid("email", "bad").field == "email"


# -- first admin and users ------------------------------------------------------------


def test_first_admin_gets_a_team_they_own_as_active_team(store):
    assert not store.users.any()
    user, team = admin(store)
    assert store.users.any()
    assert user.email == "admin@example.com" and user.active_team == team.id
    assert store.teams.role_of(user.id, team.id) is Role.OWNER
    assert store.teams.of_user(user.id) == [(team, Role.OWNER)]
    assert store.teams.members(team.id) == [(user, Role.OWNER)]


def test_first_admin_only_once(store):
    admin(store)
    with pytest.raises(Conflict):
        store.users.create_first_admin(email="b@x", name="B", password_hash="h", team_name="T2",
                                       now=T0)
    assert len(store.users.page().items) == 1 and len(store.teams.all()) == 1


def test_first_admin_is_atomic(store):
    with pytest.raises(Invalid) as info:
        store.users.create_first_admin(email="a@x", name="A", password_hash="h",
                                       team_name="\x00bad", now=T0)
    assert info.value.field == "name"
    assert not store.users.any() and store.teams.all() == []


def test_users_crud(store):
    user = store.users.create(email=" Bob@X.org ", name="Bob", password_hash="h", now=T0)
    assert store.users.get(user.id) == user
    assert store.users.by_email("BOB@x.ORG") == user
    assert not user.disabled and user.cli_public_key is None and user.active_team is None
    changed = store.users.update(user.id, name="Robert", email="rob@x.org", disabled=True)
    assert (changed.name, changed.email, changed.disabled) == ("Robert", "rob@x.org", True)
    store.users.delete(user.id)
    with pytest.raises(NotFound):
        store.users.get(user.id)
    with pytest.raises(NotFound):
        store.users.by_email("rob@x.org")


def test_user_refusals(store):
    store.users.create(email="a@x", name="A", password_hash="h", now=T0)
    b = store.users.create(email="b@x", name="B", password_hash="h", now=T0)
    with pytest.raises(Conflict):
        store.users.create(email="A@X", name="A2", password_hash="h", now=T0)
    with pytest.raises(Conflict):
        store.users.update(b.id, email="a@X")
    for kwargs, field in [({"email": "no-at-sign"}, "email"), ({"name": " "}, "name"),
                          ({"password_hash": ""}, "password_hash")]:
        args = {"email": "c@x", "name": "C", "password_hash": "h"} | kwargs
        with pytest.raises(Invalid) as info:
            store.users.create(**args, now=T0)
        assert info.value.field == field
    for call in (lambda: store.users.get("nope"), lambda: store.users.update("nope", name="x"),
                 lambda: store.users.delete("nope"),
                 lambda: store.users.set_password("nope", "h", now=T0),
                 lambda: store.users.set_cli_key("nope", KEY)):
        with pytest.raises(NotFound):
            call()


def test_set_password_revokes_every_token(store):
    user, _ = admin(store)
    store.tokens.add(token_hash="s1", user=user.id, kind=TokenKind.SESSION, now=T0,
                     expires_at=T0 + 60)
    assert store.users.set_password(user.id, "h1", now=T0 + 1).password_hash == "h1"
    with pytest.raises(Expired):
        store.tokens.valid("s1", now=T0 + 2)
    with pytest.raises(Invalid):
        store.users.set_password(user.id, "", now=T0)


def test_set_cli_key_canonicalises_and_forgets(store):
    user, _ = admin(store)
    assert store.users.set_cli_key(user.id, KEY.upper()).cli_public_key == KEY
    assert store.users.set_cli_key(user.id, None).cli_public_key is None
    with pytest.raises(Invalid) as info:
        store.users.set_cli_key(user.id, "abc")
    assert info.value.field == "cli_public_key"


def test_active_team_must_be_one_of_the_users_teams(store):
    user, team = admin(store)
    other = store.teams.create(name="Other", owner=user.id, now=T0)
    assert store.users.get(user.id).active_team == team.id
    assert store.users.set_active_team(user.id, other.id).active_team == other.id
    stranger = store.users.create(email="s@x", name="S", password_hash="h", now=T0)
    with pytest.raises(NotFound):
        store.users.set_active_team(stranger.id, team.id)
    assert store.users.set_active_team(user.id, None).active_team is None


def test_delete_user_refused_for_a_last_owner(store):
    user, team = admin(store)
    with pytest.raises(LastOwner):
        store.users.delete(user.id)
    second = store.users.create(email="s@x", name="S", password_hash="h", now=T0)
    store.teams.add_member(team.id, second.id, Role.OWNER)
    store.users.delete(user.id)
    assert store.teams.members(team.id) == [(store.users.get(second.id), Role.OWNER)]


# -- teams and memberships --------------------------------------------------------------


def test_teams_crud(store):
    user, core = admin(store)
    team = store.teams.create(name="Research", owner=user.id, now=T0)
    assert store.teams.get(team.id) == team
    assert [t.name for t in store.teams.all()] == ["Core", "Research"]
    assert store.teams.rename(team.id, "Lab").name == "Lab"
    store.teams.delete(team.id)
    with pytest.raises(NotFound):
        store.teams.get(team.id)
    assert store.teams.of_user(user.id) == [(core, Role.OWNER)]


def test_team_refusals(store):
    user, _ = admin(store)
    lab = store.teams.create(name="Lab", owner=user.id, now=T0)
    with pytest.raises(Conflict):
        store.teams.create(name="core", owner=user.id, now=T0)
    with pytest.raises(Conflict):
        store.teams.rename(lab.id, "CORE")
    with pytest.raises(NotFound):
        store.teams.create(name="X", owner="nobody", now=T0)
    with pytest.raises(Invalid):
        store.teams.create(name="", owner=user.id, now=T0)
    for call in (lambda: store.teams.get("nope"), lambda: store.teams.rename("nope", "Y"),
                 lambda: store.teams.delete("nope")):
        with pytest.raises(NotFound):
            call()
    store.jobs.add(id="j1", team=lab.id, created_by=user.id, spec=spec(lab.id), now=T0)
    with pytest.raises(Conflict):
        store.teams.delete(lab.id)
    store.jobs.mark_deleted("j1", now=T0)
    store.api_keys.add(id="k1", team=lab.id, name="ci", prefix="sk-ab", created_by=user.id,
                       now=T0)
    with pytest.raises(Conflict):
        store.teams.delete(lab.id)
    store.api_keys.revoke("k1", now=T0)
    store.teams.delete(lab.id)
    with pytest.raises(NotFound):
        store.jobs.get("j1")


def test_memberships(store):
    owner, team = admin(store)
    bob = store.users.create(email="bob@x", name="Bob", password_hash="h", now=T0)
    assert store.teams.role_of(bob.id, team.id) is None
    assert store.teams.add_member(team.id, bob.id, "member").role is Role.MEMBER
    assert store.users.get(bob.id).active_team == team.id
    assert store.teams.change_role(team.id, bob.id, Role.ADMIN).role is Role.ADMIN
    assert store.teams.role_of(bob.id, team.id) is Role.ADMIN
    store.teams.change_role(team.id, bob.id, Role.OWNER)
    store.teams.change_role(team.id, owner.id, Role.MEMBER)
    store.teams.remove_member(team.id, owner.id)
    assert store.teams.role_of(owner.id, team.id) is None
    assert store.users.get(owner.id).active_team is None


def test_membership_refusals(store):
    owner, team = admin(store)
    bob = store.users.create(email="bob@x", name="Bob", password_hash="h", now=T0)
    store.teams.add_member(team.id, bob.id, Role.ADMIN)
    with pytest.raises(Conflict):
        store.teams.add_member(team.id, bob.id, Role.MEMBER)
    with pytest.raises(Invalid):
        store.teams.add_member(team.id, bob.id, "boss")
    with pytest.raises(NotFound):
        store.teams.add_member("nope", bob.id, Role.MEMBER)
    with pytest.raises(NotFound):
        store.teams.add_member(team.id, "nope", Role.MEMBER)
    with pytest.raises(LastOwner):
        store.teams.change_role(team.id, owner.id, Role.ADMIN)
    with pytest.raises(LastOwner):
        store.teams.remove_member(team.id, owner.id)
    assert store.teams.role_of(owner.id, team.id) is Role.OWNER
    stranger = store.users.create(email="s@x", name="S", password_hash="h", now=T0)
    with pytest.raises(NotFound):
        store.teams.change_role(team.id, stranger.id, Role.ADMIN)
    with pytest.raises(NotFound):
        store.teams.remove_member(team.id, stranger.id)
    with pytest.raises(NotFound):
        store.teams.members("nope")


# -- invitations ------------------------------------------------------------------------


def invite(store, team, owner, token="t1", email="New@X", role=Role.MEMBER, ttl=60.0):
    return store.invitations.create(team=team.id, email=email, role=role, token_hash=token,
                                    invited_by=owner.id, now=T0, expires_at=T0 + ttl)


def test_invitation_accepted_once(store):
    owner, team = admin(store)
    invitation = invite(store, team, owner, role=Role.ADMIN)
    assert invitation.email == "new@x"
    assert store.invitations.get(invitation.id) == invitation
    assert store.invitations.of_team(team.id, pending_at=T0) == [invitation]
    new = store.users.create(email="new@x", name="N", password_hash="h", now=T0)
    membership = store.invitations.accept("t1", new.id, now=T0 + 1)
    assert membership.role is Role.ADMIN and store.teams.role_of(new.id, team.id) is Role.ADMIN
    accepted = store.invitations.get(invitation.id)
    assert (accepted.accepted_at, accepted.accepted_by) == (T0 + 1, new.id)
    assert store.invitations.of_team(team.id, pending_at=T0 + 1) == []
    assert store.invitations.of_team(team.id) == [accepted]
    with pytest.raises(Expired):
        store.invitations.accept("t1", new.id, now=T0 + 2)
    with pytest.raises(Conflict):
        store.invitations.revoke(invitation.id)


def test_invitation_refusals(store):
    owner, team = admin(store)
    new = store.users.create(email="new@x", name="N", password_hash="h", now=T0)
    invite(store, team, owner, token="short", ttl=10)
    with pytest.raises(Expired):
        store.invitations.accept("short", new.id, now=T0 + 10)
    with pytest.raises(NotFound):
        store.invitations.accept("unknown", new.id, now=T0)
    with pytest.raises(Conflict):
        invite(store, team, owner, token="short")
    with pytest.raises(Invalid) as info:
        invite(store, team, owner, token="t2", ttl=0)
    assert info.value.field == "expires_at"
    with pytest.raises(Invalid):
        invite(store, team, owner, token="t2", email="nope")
    with pytest.raises(Invalid):
        invite(store, team, owner, token="")
    with pytest.raises(NotFound):
        store.invitations.create(team="nope", email="a@x", role="member", token_hash="t3",
                                 invited_by=owner.id, now=T0, expires_at=T0 + 1)
    revoked = invite(store, team, owner, token="t4")
    store.invitations.revoke(revoked.id)
    with pytest.raises(NotFound):
        store.invitations.accept("t4", new.id, now=T0)
    with pytest.raises(NotFound):
        store.invitations.revoke(revoked.id)
    with pytest.raises(NotFound):
        store.invitations.get(revoked.id)


def test_invitation_only_for_the_invited_address(store):
    owner, team = admin(store)
    new = store.users.create(email="new@x", name="N", password_hash="h", now=T0)
    invite(store, team, owner)
    with pytest.raises(WrongAccount):
        store.invitations.accept("t1", owner.id, now=T0, email=owner.email)
    assert store.teams.role_of(new.id, team.id) is None
    membership = store.invitations.accept("t1", new.id, now=T0, email=" NEW@x ")
    assert membership.user == new.id
    with pytest.raises(Expired):  # used: said before the address is compared
        store.invitations.accept("t1", owner.id, now=T0, email=owner.email)


def test_accepting_is_atomic(store):
    """A member already: the invitation stays unused, nothing changes."""
    owner, team = admin(store)
    invitation = invite(store, team, owner)
    with pytest.raises(Conflict):
        store.invitations.accept("t1", owner.id, now=T0)
    assert store.invitations.get(invitation.id).accepted_at is None
    assert store.teams.role_of(owner.id, team.id) is Role.OWNER
    with pytest.raises(NotFound):
        store.invitations.accept("t1", "no-user", now=T0)
    assert store.invitations.get(invitation.id).accepted_at is None


# -- tokens -----------------------------------------------------------------------------


def test_tokens(store):
    user, _ = admin(store)
    token = store.tokens.add(token_hash="s1", user=user.id, kind="session", now=T0,
                             expires_at=T0 + 60)
    assert store.tokens.valid("s1", now=T0 + 59) == token
    with pytest.raises(Expired):
        store.tokens.valid("s1", now=T0 + 60)
    with pytest.raises(NotFound):
        store.tokens.valid("s1", now=T0, kind=TokenKind.RESET)
    store.tokens.revoke("s1", now=T0 + 1)
    store.tokens.revoke("s1", now=T0 + 5)
    with pytest.raises(Expired):
        store.tokens.valid("s1", now=T0 + 2)
    for name in ("a", "b"):
        store.tokens.add(token_hash=name, user=user.id, kind=TokenKind.SESSION, now=T0,
                         expires_at=T0 + 60)
    assert store.tokens.revoke_all_of(user.id, now=T0) == 2
    assert store.tokens.revoke_all_of(user.id, now=T0) == 0


def test_token_refusals(store):
    user, _ = admin(store)
    store.tokens.add(token_hash="s1", user=user.id, kind="session", now=T0, expires_at=T0 + 1)
    with pytest.raises(Conflict):
        store.tokens.add(token_hash="s1", user=user.id, kind="session", now=T0,
                         expires_at=T0 + 1)
    with pytest.raises(NotFound):
        store.tokens.add(token_hash="s2", user="nope", kind="session", now=T0,
                         expires_at=T0 + 1)
    with pytest.raises(Invalid):
        store.tokens.add(token_hash="s2", user=user.id, kind="api", now=T0, expires_at=T0 + 1)
    with pytest.raises(Invalid):
        store.tokens.add(token_hash="s2", user=user.id, kind="session", now=T0, expires_at=T0)
    with pytest.raises(NotFound):
        store.tokens.valid("s2", now=T0)
    with pytest.raises(NotFound):
        store.tokens.revoke("s2", now=T0)
    store.users.update(user.id, disabled=True)
    with pytest.raises(Expired):
        store.tokens.valid("s1", now=T0)


def test_reset_password_uses_the_token_once_and_logs_out_everywhere(store):
    user, _ = admin(store)
    store.tokens.add(token_hash="s", user=user.id, kind="session", now=T0, expires_at=T0 + 60)
    store.tokens.add(token_hash="r", user=user.id, kind="reset", now=T0, expires_at=T0 + 60)
    with pytest.raises(NotFound):
        store.users.reset_password("s", "new", now=T0)
    assert store.users.reset_password("r", "new", now=T0 + 1).password_hash == "new"
    with pytest.raises(Expired):
        store.tokens.valid("s", now=T0 + 1)
    with pytest.raises(Expired):
        store.users.reset_password("r", "newer", now=T0 + 2)
    assert store.users.get(user.id).password_hash == "new"
    with pytest.raises(Invalid):
        store.users.reset_password("r", "", now=T0)


# -- API keys and jobs --------------------------------------------------------------------


def test_api_keys(store):
    user, team = admin(store)
    a = store.api_keys.add(id="k1", team=team.id, name="ci", prefix="sk-1234",
                           created_by=user.id, now=T0)
    b = store.api_keys.add(id="k2", team=team.id, name="bench", prefix="sk-5678",
                           created_by=user.id, now=T0 + 1)
    assert store.api_keys.of_team(team.id) == [a, b]
    revoked = store.api_keys.revoke("k1", now=T0 + 2)
    assert revoked.revoked_at == T0 + 2
    assert store.api_keys.revoke("k1", now=T0 + 9).revoked_at == T0 + 2
    assert store.api_keys.of_team(team.id, include_revoked=False) == [b]
    assert store.api_keys.get("k1") == revoked
    with pytest.raises(Conflict):
        store.api_keys.add(id="k1", team=team.id, name="x", prefix="p", created_by=user.id,
                           now=T0)
    with pytest.raises(NotFound):
        store.api_keys.add(id="k3", team="nope", name="x", prefix="p", created_by=user.id,
                           now=T0)
    with pytest.raises(Invalid):
        store.api_keys.add(id="k3", team=team.id, name="", prefix="p", created_by=user.id,
                           now=T0)
    with pytest.raises(NotFound):
        store.api_keys.revoke("nope", now=T0)
    with pytest.raises(NotFound):
        store.api_keys.get("nope")


def test_jobs(store):
    user, team = admin(store)
    job = store.jobs.add(id="j1", team=team.id, created_by=user.id,
                         spec=spec(team.id, "train", authorized_keys=(KEY,)), now=T0)
    assert store.jobs.get("j1") == job and job.name == "train"
    assert store.jobs.page(team.id).items == (job,)
    deleted = store.jobs.mark_deleted("j1", now=T0 + 1)
    assert deleted.deleted_at == T0 + 1
    assert store.jobs.mark_deleted("j1", now=T0 + 2).deleted_at == T0 + 1
    assert store.jobs.page(team.id).items == ()
    assert store.jobs.page(team.id, include_deleted=True).items == (deleted,)
    assert store.jobs.get("j1").spec == job.spec


def test_job_refusals(store):
    user, team = admin(store)
    store.jobs.add(id="j1", team=team.id, created_by=user.id, spec=spec(team.id), now=T0)
    with pytest.raises(Conflict):
        store.jobs.add(id="j1", team=team.id, created_by=user.id, spec=spec(team.id), now=T0)
    with pytest.raises(Invalid) as info:
        store.jobs.add(id="j2", team=team.id, created_by=user.id, spec=spec("other"), now=T0)
    assert info.value.field == "team"
    with pytest.raises(NotFound):
        store.jobs.add(id="j2", team="other", created_by=user.id, spec=spec("other"), now=T0)
    with pytest.raises(Invalid):
        store.jobs.add(id="bad id", team=team.id, created_by=user.id, spec=spec(team.id),
                       now=T0)
    for call in (lambda: store.jobs.get("nope"), lambda: store.jobs.mark_deleted("nope", now=T0)):
        with pytest.raises(NotFound):
            call()
    for kwargs in ({"limit": 0}, {"limit": 10_000}, {"cursor": "x"}):
        with pytest.raises(Invalid):
            store.jobs.page(team.id, **kwargs)


# -- the file ---------------------------------------------------------------------------


def test_migration_from_an_empty_file_and_reopening_keeps_everything(tmp_path):
    path = tmp_path / "app.sqlite"
    path.touch()
    store = Store.open(path)
    user, team = admin(store)
    store.users.set_cli_key(user.id, KEY)
    invitation = invite(store, team, user)
    store.tokens.add(token_hash="s", user=user.id, kind="session", now=T0, expires_at=T0 + 9)
    key = store.api_keys.add(id="k1", team=team.id, name="ci", prefix="sk", created_by=user.id,
                             now=T0)
    job = store.jobs.add(id="j1", team=team.id, created_by=user.id, spec=spec(team.id), now=T0)
    user = store.users.get(user.id)
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()
    again = Store.open(path)
    assert again.users.get(user.id) == user
    assert again.teams.members(team.id) == [(user, Role.OWNER)]
    assert again.invitations.get(invitation.id) == invitation
    assert again.tokens.valid("s", now=T0).user == user.id
    assert again.api_keys.of_team(team.id) == [key]
    assert again.jobs.page(team.id).items == (job,)
    again.close()


def test_a_newer_schema_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "app.sqlite"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match=r"newer than this app-node's.*run the newer app-node"):
        Store.open(path)


def test_a_foreign_or_broken_file_is_refused(tmp_path):
    foreign = tmp_path / "other.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE x (y)")
    conn.close()
    with pytest.raises(StoreError, match="not app-node's store"):
        Store.open(foreign)
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(StoreError, match="cannot open"):
        Store.open(garbage)
    with pytest.raises(StoreError):
        Store.open(tmp_path / "missing-dir" / "app.sqlite")


def test_a_corrupt_row_is_a_store_error(tmp_path):
    path = tmp_path / "app.sqlite"
    store = Store.open(path)
    user, team = admin(store)
    store.jobs.add(id="j1", team=team.id, created_by=user.id, spec=spec(team.id), now=T0)
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE jobs SET spec = '{\"name\": 1}'")
    conn.commit()
    conn.close()
    store = Store.open(path)
    with pytest.raises(StoreError, match="restore a backup"):
        store.jobs.get("j1")
    store.close()


class _FailOn:
    """The store's connection, failing the first statement that starts with ``prefix``
    (as a full disk would)."""

    def __init__(self, conn: sqlite3.Connection, prefix: str) -> None:
        self._conn, self._prefix = conn, prefix

    def execute(self, sql: str, *args):
        if sql.startswith(self._prefix):
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


def test_a_failure_mid_way_leaves_nothing(store):
    conn = store.db.sqlite
    store.db.sqlite = _FailOn(conn, "INSERT INTO memberships")
    with pytest.raises(StoreError, match="nothing was changed"):
        admin(store)
    store.db.sqlite = conn
    assert not store.users.any() and store.teams.all() == []
    user, team = admin(store)
    invitation = invite(store, team, user)
    new = store.users.create(email="new@x", name="N", password_hash="h", now=T0)
    store.db.sqlite = _FailOn(conn, "UPDATE invitations")
    with pytest.raises(StoreError):
        store.invitations.accept("t1", new.id, now=T0)
    store.db.sqlite = conn
    assert store.teams.role_of(new.id, team.id) is None
    assert store.users.get(new.id).active_team is None
    assert store.invitations.get(invitation.id).accepted_at is None
    store.tokens.add(token_hash="s", user=new.id, kind="session", now=T0, expires_at=T0 + 9)
    store.db.sqlite = _FailOn(conn, "UPDATE tokens")
    with pytest.raises(StoreError):
        store.users.set_password(new.id, "changed", now=T0)
    store.db.sqlite = conn
    assert store.users.get(new.id).password_hash == "h"
    assert store.tokens.valid("s", now=T0).user == new.id
