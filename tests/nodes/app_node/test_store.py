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
    return store.create_first_admin(email="Admin@Example.com", name="Ada", password_hash="h0",
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
    assert not store.has_users()
    user, team = admin(store)
    assert store.has_users()
    assert user.email == "admin@example.com" and user.active_team == team.id
    assert store.role_of(user.id, team.id) is Role.OWNER
    assert store.teams_of(user.id) == [(team, Role.OWNER)]
    assert store.list_members(team.id) == [(user, Role.OWNER)]


def test_first_admin_only_once(store):
    admin(store)
    with pytest.raises(Conflict):
        store.create_first_admin(email="b@x", name="B", password_hash="h", team_name="T2",
                                 now=T0)
    assert len(store.list_users().items) == 1 and len(store.list_teams()) == 1


def test_first_admin_is_atomic(store):
    with pytest.raises(Invalid) as info:
        store.create_first_admin(email="a@x", name="A", password_hash="h",
                                 team_name="\x00bad", now=T0)
    assert info.value.field == "name"
    assert not store.has_users() and store.list_teams() == []


def test_users_crud(store):
    user = store.create_user(email=" Bob@X.org ", name="Bob", password_hash="h", now=T0)
    assert store.get_user(user.id) == user
    assert store.get_user_by_email("BOB@x.ORG") == user
    assert not user.disabled and user.cli_public_key is None and user.active_team is None
    changed = store.update_user(user.id, name="Robert", email="rob@x.org", disabled=True)
    assert (changed.name, changed.email, changed.disabled) == ("Robert", "rob@x.org", True)
    store.delete_user(user.id)
    with pytest.raises(NotFound):
        store.get_user(user.id)
    with pytest.raises(NotFound):
        store.get_user_by_email("rob@x.org")


def test_user_refusals(store):
    store.create_user(email="a@x", name="A", password_hash="h", now=T0)
    b = store.create_user(email="b@x", name="B", password_hash="h", now=T0)
    with pytest.raises(Conflict):
        store.create_user(email="A@X", name="A2", password_hash="h", now=T0)
    with pytest.raises(Conflict):
        store.update_user(b.id, email="a@X")
    for kwargs, field in [({"email": "no-at-sign"}, "email"), ({"name": " "}, "name"),
                          ({"password_hash": ""}, "password_hash")]:
        args = {"email": "c@x", "name": "C", "password_hash": "h"} | kwargs
        with pytest.raises(Invalid) as info:
            store.create_user(**args, now=T0)
        assert info.value.field == field
    for call in (lambda: store.get_user("nope"), lambda: store.update_user("nope", name="x"),
                 lambda: store.delete_user("nope"),
                 lambda: store.set_password("nope", "h", now=T0),
                 lambda: store.set_cli_key("nope", KEY)):
        with pytest.raises(NotFound):
            call()


def test_set_password_revokes_every_token(store):
    user, _ = admin(store)
    store.add_token(token_hash="s1", user=user.id, kind=TokenKind.SESSION, now=T0,
                    expires_at=T0 + 60)
    assert store.set_password(user.id, "h1", now=T0 + 1).password_hash == "h1"
    with pytest.raises(Expired):
        store.valid_token("s1", now=T0 + 2)
    with pytest.raises(Invalid):
        store.set_password(user.id, "", now=T0)


def test_set_cli_key_canonicalises_and_forgets(store):
    user, _ = admin(store)
    assert store.set_cli_key(user.id, KEY.upper()).cli_public_key == KEY
    assert store.set_cli_key(user.id, None).cli_public_key is None
    with pytest.raises(Invalid) as info:
        store.set_cli_key(user.id, "abc")
    assert info.value.field == "cli_public_key"


def test_active_team_must_be_one_of_the_users_teams(store):
    user, team = admin(store)
    other = store.create_team(name="Other", owner=user.id, now=T0)
    assert store.get_user(user.id).active_team == team.id
    assert store.set_active_team(user.id, other.id).active_team == other.id
    stranger = store.create_user(email="s@x", name="S", password_hash="h", now=T0)
    with pytest.raises(NotFound):
        store.set_active_team(stranger.id, team.id)
    assert store.set_active_team(user.id, None).active_team is None


def test_delete_user_refused_for_a_last_owner(store):
    user, team = admin(store)
    with pytest.raises(LastOwner):
        store.delete_user(user.id)
    second = store.create_user(email="s@x", name="S", password_hash="h", now=T0)
    store.add_member(team.id, second.id, Role.OWNER)
    store.delete_user(user.id)
    assert store.list_members(team.id) == [(store.get_user(second.id), Role.OWNER)]


# -- teams and memberships --------------------------------------------------------------


def test_teams_crud(store):
    user, core = admin(store)
    team = store.create_team(name="Research", owner=user.id, now=T0)
    assert store.get_team(team.id) == team
    assert [t.name for t in store.list_teams()] == ["Core", "Research"]
    assert store.rename_team(team.id, "Lab").name == "Lab"
    store.delete_team(team.id)
    with pytest.raises(NotFound):
        store.get_team(team.id)
    assert store.teams_of(user.id) == [(core, Role.OWNER)]


def test_team_refusals(store):
    user, _ = admin(store)
    lab = store.create_team(name="Lab", owner=user.id, now=T0)
    with pytest.raises(Conflict):
        store.create_team(name="core", owner=user.id, now=T0)
    with pytest.raises(Conflict):
        store.rename_team(lab.id, "CORE")
    with pytest.raises(NotFound):
        store.create_team(name="X", owner="nobody", now=T0)
    with pytest.raises(Invalid):
        store.create_team(name="", owner=user.id, now=T0)
    for call in (lambda: store.get_team("nope"), lambda: store.rename_team("nope", "Y"),
                 lambda: store.delete_team("nope")):
        with pytest.raises(NotFound):
            call()
    store.add_job(id="j1", team=lab.id, created_by=user.id, spec=spec(lab.id), now=T0)
    with pytest.raises(Conflict):
        store.delete_team(lab.id)
    store.mark_job_deleted("j1", now=T0)
    store.add_api_key(id="k1", team=lab.id, name="ci", prefix="sk-ab", created_by=user.id,
                      now=T0)
    with pytest.raises(Conflict):
        store.delete_team(lab.id)
    store.revoke_api_key("k1", now=T0)
    store.delete_team(lab.id)
    with pytest.raises(NotFound):
        store.get_job("j1")


def test_memberships(store):
    owner, team = admin(store)
    bob = store.create_user(email="bob@x", name="Bob", password_hash="h", now=T0)
    assert store.role_of(bob.id, team.id) is None
    assert store.add_member(team.id, bob.id, "member").role is Role.MEMBER
    assert store.get_user(bob.id).active_team == team.id
    assert store.change_role(team.id, bob.id, Role.ADMIN).role is Role.ADMIN
    assert store.role_of(bob.id, team.id) is Role.ADMIN
    store.change_role(team.id, bob.id, Role.OWNER)
    store.change_role(team.id, owner.id, Role.MEMBER)
    store.remove_member(team.id, owner.id)
    assert store.role_of(owner.id, team.id) is None
    assert store.get_user(owner.id).active_team is None


def test_membership_refusals(store):
    owner, team = admin(store)
    bob = store.create_user(email="bob@x", name="Bob", password_hash="h", now=T0)
    store.add_member(team.id, bob.id, Role.ADMIN)
    with pytest.raises(Conflict):
        store.add_member(team.id, bob.id, Role.MEMBER)
    with pytest.raises(Invalid):
        store.add_member(team.id, bob.id, "boss")
    with pytest.raises(NotFound):
        store.add_member("nope", bob.id, Role.MEMBER)
    with pytest.raises(NotFound):
        store.add_member(team.id, "nope", Role.MEMBER)
    with pytest.raises(LastOwner):
        store.change_role(team.id, owner.id, Role.ADMIN)
    with pytest.raises(LastOwner):
        store.remove_member(team.id, owner.id)
    assert store.role_of(owner.id, team.id) is Role.OWNER
    stranger = store.create_user(email="s@x", name="S", password_hash="h", now=T0)
    with pytest.raises(NotFound):
        store.change_role(team.id, stranger.id, Role.ADMIN)
    with pytest.raises(NotFound):
        store.remove_member(team.id, stranger.id)
    with pytest.raises(NotFound):
        store.list_members("nope")


# -- invitations ------------------------------------------------------------------------


def invite(store, team, owner, token="t1", email="New@X", role=Role.MEMBER, ttl=60.0):
    return store.create_invitation(team=team.id, email=email, role=role, token_hash=token,
                                   invited_by=owner.id, now=T0, expires_at=T0 + ttl)


def test_invitation_accepted_once(store):
    owner, team = admin(store)
    invitation = invite(store, team, owner, role=Role.ADMIN)
    assert invitation.email == "new@x"
    assert store.get_invitation(invitation.id) == invitation
    assert store.list_invitations(team.id, pending_at=T0) == [invitation]
    new = store.create_user(email="new@x", name="N", password_hash="h", now=T0)
    membership = store.accept_invitation("t1", new.id, now=T0 + 1)
    assert membership.role is Role.ADMIN and store.role_of(new.id, team.id) is Role.ADMIN
    accepted = store.get_invitation(invitation.id)
    assert (accepted.accepted_at, accepted.accepted_by) == (T0 + 1, new.id)
    assert store.list_invitations(team.id, pending_at=T0 + 1) == []
    assert store.list_invitations(team.id) == [accepted]
    with pytest.raises(Expired):
        store.accept_invitation("t1", new.id, now=T0 + 2)
    with pytest.raises(Conflict):
        store.revoke_invitation(invitation.id)


def test_invitation_refusals(store):
    owner, team = admin(store)
    new = store.create_user(email="new@x", name="N", password_hash="h", now=T0)
    invite(store, team, owner, token="short", ttl=10)
    with pytest.raises(Expired):
        store.accept_invitation("short", new.id, now=T0 + 10)
    with pytest.raises(NotFound):
        store.accept_invitation("unknown", new.id, now=T0)
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
        store.create_invitation(team="nope", email="a@x", role="member", token_hash="t3",
                                invited_by=owner.id, now=T0, expires_at=T0 + 1)
    revoked = invite(store, team, owner, token="t4")
    store.revoke_invitation(revoked.id)
    with pytest.raises(NotFound):
        store.accept_invitation("t4", new.id, now=T0)
    with pytest.raises(NotFound):
        store.revoke_invitation(revoked.id)
    with pytest.raises(NotFound):
        store.get_invitation(revoked.id)


def test_invitation_only_for_the_invited_address(store):
    owner, team = admin(store)
    new = store.create_user(email="new@x", name="N", password_hash="h", now=T0)
    invite(store, team, owner)
    with pytest.raises(WrongAccount):
        store.accept_invitation("t1", owner.id, now=T0, email=owner.email)
    assert store.role_of(new.id, team.id) is None
    membership = store.accept_invitation("t1", new.id, now=T0, email=" NEW@x ")
    assert membership.user == new.id
    with pytest.raises(Expired):  # used: said before the address is compared
        store.accept_invitation("t1", owner.id, now=T0, email=owner.email)


def test_accepting_is_atomic(store):
    """A member already: the invitation stays unused, nothing changes."""
    owner, team = admin(store)
    invitation = invite(store, team, owner)
    with pytest.raises(Conflict):
        store.accept_invitation("t1", owner.id, now=T0)
    assert store.get_invitation(invitation.id).accepted_at is None
    assert store.role_of(owner.id, team.id) is Role.OWNER
    with pytest.raises(NotFound):
        store.accept_invitation("t1", "no-user", now=T0)
    assert store.get_invitation(invitation.id).accepted_at is None


# -- tokens -----------------------------------------------------------------------------


def test_tokens(store):
    user, _ = admin(store)
    token = store.add_token(token_hash="s1", user=user.id, kind="session", now=T0,
                            expires_at=T0 + 60)
    assert store.valid_token("s1", now=T0 + 59) == token
    with pytest.raises(Expired):
        store.valid_token("s1", now=T0 + 60)
    with pytest.raises(NotFound):
        store.valid_token("s1", now=T0, kind=TokenKind.RESET)
    store.revoke_token("s1", now=T0 + 1)
    store.revoke_token("s1", now=T0 + 5)
    with pytest.raises(Expired):
        store.valid_token("s1", now=T0 + 2)
    for name in ("a", "b"):
        store.add_token(token_hash=name, user=user.id, kind=TokenKind.SESSION, now=T0,
                        expires_at=T0 + 60)
    assert store.revoke_user_tokens(user.id, now=T0) == 2
    assert store.revoke_user_tokens(user.id, now=T0) == 0


def test_token_refusals(store):
    user, _ = admin(store)
    store.add_token(token_hash="s1", user=user.id, kind="session", now=T0, expires_at=T0 + 1)
    with pytest.raises(Conflict):
        store.add_token(token_hash="s1", user=user.id, kind="session", now=T0,
                        expires_at=T0 + 1)
    with pytest.raises(NotFound):
        store.add_token(token_hash="s2", user="nope", kind="session", now=T0,
                        expires_at=T0 + 1)
    with pytest.raises(Invalid):
        store.add_token(token_hash="s2", user=user.id, kind="api", now=T0, expires_at=T0 + 1)
    with pytest.raises(Invalid):
        store.add_token(token_hash="s2", user=user.id, kind="session", now=T0, expires_at=T0)
    with pytest.raises(NotFound):
        store.valid_token("s2", now=T0)
    with pytest.raises(NotFound):
        store.revoke_token("s2", now=T0)
    store.update_user(user.id, disabled=True)
    with pytest.raises(Expired):
        store.valid_token("s1", now=T0)


def test_reset_password_uses_the_token_once_and_logs_out_everywhere(store):
    user, _ = admin(store)
    store.add_token(token_hash="s", user=user.id, kind="session", now=T0, expires_at=T0 + 60)
    store.add_token(token_hash="r", user=user.id, kind="reset", now=T0, expires_at=T0 + 60)
    with pytest.raises(NotFound):
        store.reset_password("s", "new", now=T0)
    assert store.reset_password("r", "new", now=T0 + 1).password_hash == "new"
    with pytest.raises(Expired):
        store.valid_token("s", now=T0 + 1)
    with pytest.raises(Expired):
        store.reset_password("r", "newer", now=T0 + 2)
    assert store.get_user(user.id).password_hash == "new"
    with pytest.raises(Invalid):
        store.reset_password("r", "", now=T0)


# -- API keys and jobs --------------------------------------------------------------------


def test_api_keys(store):
    user, team = admin(store)
    a = store.add_api_key(id="k1", team=team.id, name="ci", prefix="sk-1234",
                          created_by=user.id, now=T0)
    b = store.add_api_key(id="k2", team=team.id, name="bench", prefix="sk-5678",
                          created_by=user.id, now=T0 + 1)
    assert store.list_api_keys(team.id) == [a, b]
    revoked = store.revoke_api_key("k1", now=T0 + 2)
    assert revoked.revoked_at == T0 + 2
    assert store.revoke_api_key("k1", now=T0 + 9).revoked_at == T0 + 2
    assert store.list_api_keys(team.id, include_revoked=False) == [b]
    assert store.get_api_key("k1") == revoked
    with pytest.raises(Conflict):
        store.add_api_key(id="k1", team=team.id, name="x", prefix="p", created_by=user.id,
                          now=T0)
    with pytest.raises(NotFound):
        store.add_api_key(id="k3", team="nope", name="x", prefix="p", created_by=user.id,
                          now=T0)
    with pytest.raises(Invalid):
        store.add_api_key(id="k3", team=team.id, name="", prefix="p", created_by=user.id,
                          now=T0)
    with pytest.raises(NotFound):
        store.revoke_api_key("nope", now=T0)
    with pytest.raises(NotFound):
        store.get_api_key("nope")


def test_jobs(store):
    user, team = admin(store)
    job = store.add_job(id="j1", team=team.id, created_by=user.id,
                        spec=spec(team.id, "train", authorized_keys=(KEY,)), now=T0)
    assert store.get_job("j1") == job and job.name == "train"
    assert store.list_jobs(team.id).items == (job,)
    deleted = store.mark_job_deleted("j1", now=T0 + 1)
    assert deleted.deleted_at == T0 + 1
    assert store.mark_job_deleted("j1", now=T0 + 2).deleted_at == T0 + 1
    assert store.list_jobs(team.id).items == ()
    assert store.list_jobs(team.id, include_deleted=True).items == (deleted,)
    assert store.get_job("j1").spec == job.spec


def test_job_refusals(store):
    user, team = admin(store)
    store.add_job(id="j1", team=team.id, created_by=user.id, spec=spec(team.id), now=T0)
    with pytest.raises(Conflict):
        store.add_job(id="j1", team=team.id, created_by=user.id, spec=spec(team.id), now=T0)
    with pytest.raises(Invalid) as info:
        store.add_job(id="j2", team=team.id, created_by=user.id, spec=spec("other"), now=T0)
    assert info.value.field == "team"
    with pytest.raises(NotFound):
        store.add_job(id="j2", team="other", created_by=user.id, spec=spec("other"), now=T0)
    with pytest.raises(Invalid):
        store.add_job(id="bad id", team=team.id, created_by=user.id, spec=spec(team.id),
                      now=T0)
    for call in (lambda: store.get_job("nope"), lambda: store.mark_job_deleted("nope", now=T0)):
        with pytest.raises(NotFound):
            call()
    for kwargs in ({"limit": 0}, {"limit": 10_000}, {"cursor": "x"}):
        with pytest.raises(Invalid):
            store.list_jobs(team.id, **kwargs)


# -- the file ---------------------------------------------------------------------------


def test_migration_from_an_empty_file_and_reopening_keeps_everything(tmp_path):
    path = tmp_path / "app.sqlite"
    path.touch()
    store = Store.open(path)
    user, team = admin(store)
    store.set_cli_key(user.id, KEY)
    invitation = invite(store, team, user)
    store.add_token(token_hash="s", user=user.id, kind="session", now=T0, expires_at=T0 + 9)
    key = store.add_api_key(id="k1", team=team.id, name="ci", prefix="sk", created_by=user.id,
                            now=T0)
    job = store.add_job(id="j1", team=team.id, created_by=user.id, spec=spec(team.id), now=T0)
    user = store.get_user(user.id)
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()
    again = Store.open(path)
    assert again.get_user(user.id) == user
    assert again.list_members(team.id) == [(user, Role.OWNER)]
    assert again.get_invitation(invitation.id) == invitation
    assert again.valid_token("s", now=T0).user == user.id
    assert again.list_api_keys(team.id) == [key]
    assert again.list_jobs(team.id).items == (job,)
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
    store.add_job(id="j1", team=team.id, created_by=user.id, spec=spec(team.id), now=T0)
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE jobs SET spec = '{\"name\": 1}'")
    conn.commit()
    conn.close()
    store = Store.open(path)
    with pytest.raises(StoreError, match="restore a backup"):
        store.get_job("j1")
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
    conn = store._conn
    store._conn = _FailOn(conn, "INSERT INTO memberships")
    with pytest.raises(StoreError, match="nothing was changed"):
        admin(store)
    store._conn = conn
    assert not store.has_users() and store.list_teams() == []
    user, team = admin(store)
    invitation = invite(store, team, user)
    new = store.create_user(email="new@x", name="N", password_hash="h", now=T0)
    store._conn = _FailOn(conn, "UPDATE invitations")
    with pytest.raises(StoreError):
        store.accept_invitation("t1", new.id, now=T0)
    store._conn = conn
    assert store.role_of(new.id, team.id) is None
    assert store.get_user(new.id).active_team is None
    assert store.get_invitation(invitation.id).accepted_at is None
    store.add_token(token_hash="s", user=new.id, kind="session", now=T0, expires_at=T0 + 9)
    store._conn = _FailOn(conn, "UPDATE tokens")
    with pytest.raises(StoreError):
        store.set_password(new.id, "changed", now=T0)
    store._conn = conn
    assert store.get_user(new.id).password_hash == "h"
    assert store.valid_token("s", now=T0).user == new.id
