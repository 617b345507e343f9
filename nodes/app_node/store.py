"""app-node's own SQLite file: users, teams, memberships, invitations, tokens,
API key records and job records.

Theory of operation
-------------------
Every change is one transaction (``BEGIN IMMEDIATE`` … ``COMMIT``): a method
either did all it says or nothing, so ``create_first_admin`` never leaves a
user without a team and ``accept_invitation`` never marks an invitation used
without the membership. The checks a change depends on (no users yet, the last
owner, an invitation's expiry) run inside the same transaction as the writes,
so two API requests racing cannot both pass them.

The store is blocking and knows no clock: app-node calls it through
``trio.to_thread.run_sync`` and passes ``now`` (POSIX seconds). One lock
serialises the threads on the single connection. The file is WAL-journaled
with ``synchronous=FULL`` (a call that returned is on disk); its schema
version is ``PRAGMA user_version``, and a file from a newer app-node is
refused rather than misread.

Invariant: every team has at least one owner. ``change_role``,
``remove_member`` and ``delete_user`` refuse with :class:`LastOwner` instead
of breaking it; a team is created together with its owner.

Tables::

    users(id PK, email UNIQUE NOCASE, name, password_hash, created_at, disabled,
          cli_public_key, active_team → teams ON DELETE SET NULL)
    teams(id PK, name UNIQUE NOCASE, created_at)
    memberships(user → users, team → teams, role; PK(user, team))   (cascade)
    invitations(id PK, team → teams, email, role, token_hash UNIQUE, invited_by,
                created_at, expires_at, accepted_at, accepted_by)
    tokens(token_hash PK, user → users, kind, created_at, expires_at, revoked_at)
    api_keys(id PK, team → teams, name, prefix, created_by, created_at, revoked_at)
    jobs(seq PK AUTOINCREMENT, id UNIQUE, team → teams, created_by, name,
         spec JSON, created_at, deleted_at)
    team_quotas(team PK → teams, gpus|NULL, per_user_gpus|NULL, updated_at|NULL)
                                                                   (cascade; v2)

Listings of jobs and users are keyset-paginated (:class:`Page`): the cursor is
the last row's position, so rows added while a client pages never shift it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from contracts.model import key_hex
from nodes.kit.sqlite import NotThisStore, Schema, SchemaTooNew, connect, immediate, migrate
from p2p.files import private_file

from ._rows import (
    _USER,
    MAX_PAGE,
    _cursor,
    _limit,
    _new_id,
    _page,
    _user,
)
from ._store_quotas import _QUOTAS_SCHEMA, QuotasMixin
from ._store_records import RecordsMixin
from .errors import Conflict, Invalid, LastOwner, NotFound, StoreError
from .model import (
    Membership,
    Page,
    Role,
    Team,
    TeamQuota,
    TokenKind,
    User,
)
from .model import check_text as _text
from .model import normal_email as _email
from .model import parse_role as _role

__all__ = ["MAX_PAGE", "SCHEMA_VERSION", "Page", "Store"]

#: The largest page a listing returns; bounds one request's work.

_SCHEMA = """
CREATE TABLE teams (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE COLLATE NOCASE,
    created_at REAL NOT NULL
);
CREATE TABLE users (
    id TEXT PRIMARY KEY,
    email TEXT NOT NULL UNIQUE COLLATE NOCASE,
    name TEXT NOT NULL,
    password_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    disabled INTEGER NOT NULL DEFAULT 0,
    cli_public_key TEXT,
    active_team TEXT REFERENCES teams(id) ON DELETE SET NULL
);
CREATE TABLE memberships (
    user TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    team TEXT NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    PRIMARY KEY (user, team)
);
CREATE INDEX memberships_team ON memberships(team, role);
CREATE TABLE invitations (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    email TEXT NOT NULL,
    role TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    invited_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    accepted_at REAL,
    accepted_by TEXT
);
CREATE INDEX invitations_team ON invitations(team, created_at);
CREATE TABLE tokens (
    token_hash TEXT PRIMARY KEY,
    user TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    kind TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX tokens_user ON tokens(user);
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    prefix TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX api_keys_team ON api_keys(team, created_at);
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    team TEXT NOT NULL REFERENCES teams(id),
    created_by TEXT NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    created_at REAL NOT NULL,
    deleted_at REAL
);
CREATE INDEX jobs_team ON jobs(team, seq);
""" + _QUOTAS_SCHEMA

_LADDER = Schema(create=_SCHEMA, upgrades=(
    _QUOTAS_SCHEMA,  # version 2 keeps the teams' GPU quotas (none yet: unlimited)
))
#: The newest schema: older files climb ``_LADDER`` when opened.
SCHEMA_VERSION = _LADDER.version

class Store(RecordsMixin, QuotasMixin):
    """The SQLite file (or an in-memory database) behind one app-node.

    Use :meth:`open`. Every method is blocking and thread-safe (one lock);
    every change is atomic. Refusals raise :class:`~nodes.app_node.errors.AppNodeError`.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path | None) -> None:
        self._conn = conn
        self._lock = threading.RLock()
        self.path = path

    @classmethod
    def open(cls, path: Path | str | None) -> Store:
        """Open (creating and migrating if needed) the store at ``path``; ``None``: in memory.

        Raises:
            StoreError: the file is not an app-node store this version can read.
        """
        path = None if path is None else Path(path)
        where = ":memory:" if path is None else str(path)
        try:
            if path is not None:
                private_file(path)  # password hashes; -wal/-shm inherit its mode
            conn = connect(path, synchronous="FULL", foreign_keys=True)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open app-node's store {where}: {exc}; "
                             "check the path and its permissions") from exc
        try:
            migrate(conn, _LADDER)
        except SchemaTooNew as exc:
            conn.close()
            raise StoreError(f"{path} has schema {exc.found}, newer than this app-node's "
                             f"{exc.supported}; run the newer app-node or restore a backup"
                             ) from None
        except NotThisStore:
            conn.close()
            raise StoreError(f"{path} is an SQLite file but not app-node's store "
                             "(it has tables and no schema version); choose another path"
                             ) from None
        except sqlite3.Error as exc:
            conn.close()
            raise StoreError(f"cannot open app-node's store {where}: {exc}; "
                             "check the path and its permissions, or restore a backup") from exc
        return cls(conn, path)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One atomic change: everything inside commits together or not at all."""
        with self._lock:
            try:
                with immediate(self._conn):
                    yield self._conn
            except sqlite3.Error as exc:
                raise StoreError(f"writing {self.path or 'the store'} failed ({exc}); nothing "
                                 "was changed; check the disk and the file's permissions") from exc

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._conn
            except (ValidationError, ValueError) as exc:
                raise StoreError(f"a row in {self.path} cannot be read ({exc}); "
                                 "restore a backup of the store") from exc
            except sqlite3.Error as exc:
                raise StoreError(f"reading {self.path or 'the store'} failed ({exc}); "
                                 "check the disk and the file's permissions") from exc

    def _one(self, sql: str, args: tuple) -> tuple | None:
        return self._conn.execute(sql, args).fetchone()

    # -- users ------------------------------------------------------------------------

    def has_users(self) -> bool:
        with self._read() as db:
            return db.execute("SELECT 1 FROM users LIMIT 1").fetchone() is not None

    def create_first_admin(self, *, email: str, name: str, password_hash: str,
                           team_name: str, now: float) -> tuple[User, Team]:
        """Sign-up of the first admin: the user, a team they own (their active team).

        Raises:
            Conflict: a user exists already (sign-up is closed; log in instead).
        """
        with self._write():
            if self._one("SELECT 1 FROM users LIMIT 1", ()) is not None:
                raise Conflict("the first admin exists already; log in, or ask an admin "
                               "for an invitation")
            user = self._insert_user(email, name, password_hash, now)
            team = self._insert_team(team_name, user.id, now)
        return self.get_user(user.id), team

    def create_user(self, *, email: str, name: str, password_hash: str, now: float) -> User:
        """Raises: Conflict (the email is taken), Invalid."""
        with self._write():
            return self._insert_user(email, name, password_hash, now)

    def _insert_user(self, email: str, name: str, password_hash: str, now: float) -> User:
        email = _email(email)
        name = _text("name", name, 100)
        if not password_hash:
            raise Invalid("password_hash", "password_hash is empty")
        if self._one("SELECT 1 FROM users WHERE email = ?", (email,)) is not None:
            raise Conflict(f"a user with email {email} exists already; log in or reset "
                           "the password")
        user = User(id=_new_id(), email=email, name=name, password_hash=password_hash,
                    created_at=now)
        self._conn.execute(f"INSERT INTO users ({_USER}) VALUES (?,?,?,?,?,?,?,?)",
                           (user.id, user.email, user.name, user.password_hash,
                            user.created_at, 0, None, None))
        return user

    def get_user(self, user_id: str) -> User:
        """Raises: NotFound."""
        with self._read():
            row = self._one(f"SELECT {_USER} FROM users WHERE id = ?", (user_id,))
        if row is None:
            raise NotFound(f"no user {user_id}")
        return _user(row)

    def get_user_by_email(self, email: str) -> User:
        """Case-insensitive. Raises: NotFound."""
        with self._read():
            row = self._one(f"SELECT {_USER} FROM users WHERE email = ?",
                            (email.strip().lower(),))
        if row is None:
            raise NotFound(f"no user with email {email.strip()}")
        return _user(row)

    def list_users(self, *, limit: int = 100, cursor: str | None = None) -> Page[User]:
        """All users, oldest first, ``limit`` at a time."""
        limit, after = _limit(limit), _cursor(cursor)
        with self._read() as db:
            rows = db.execute(
                f"SELECT rowid, {_USER} FROM users WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (after or 0, limit + 1)).fetchall()
        return _page(rows, limit, _user)

    def update_user(self, user_id: str, *, name: str | None = None,
                    email: str | None = None, disabled: bool | None = None) -> User:
        """Change the given fields. Raises: NotFound, Conflict (email taken), Invalid."""
        with self._write() as db:
            user = self._user_row(user_id)
            if name is not None:
                db.execute("UPDATE users SET name = ? WHERE id = ?",
                           (_text("name", name, 100), user_id))
            if email is not None:
                email = _email(email)
                if self._one("SELECT 1 FROM users WHERE email = ? AND id != ?",
                              (email, user_id)) is not None:
                    raise Conflict(f"a user with email {email} exists already")
                db.execute("UPDATE users SET email = ? WHERE id = ?", (email, user.id))
            if disabled is not None:
                db.execute("UPDATE users SET disabled = ? WHERE id = ?",
                           (int(disabled), user_id))
        return self.get_user(user_id)

    def delete_user(self, user_id: str) -> None:
        """Delete the user, their memberships and tokens (their jobs' records stay).

        Raises:
            NotFound; LastOwner: they are the only owner of a team (hand it over first).
        """
        with self._write() as db:
            self._user_row(user_id)
            for (team,) in db.execute(
                    "SELECT team FROM memberships WHERE user = ? AND role = 'owner'",
                    (user_id,)).fetchall():
                self._check_not_last_owner(team, user_id)
            db.execute("DELETE FROM users WHERE id = ?", (user_id,))

    def set_password(self, user_id: str, password_hash: str, *, now: float) -> User:
        """Replace the password hash and revoke every token of the user (log out everywhere).

        Raises: NotFound, Invalid.
        """
        if not password_hash:
            raise Invalid("password_hash", "password_hash is empty")
        with self._write() as db:
            self._user_row(user_id)
            db.execute("UPDATE users SET password_hash = ? WHERE id = ?",
                       (password_hash, user_id))
            db.execute("UPDATE tokens SET revoked_at = ? WHERE user = ? AND revoked_at IS NULL",
                       (now, user_id))
        return self.get_user(user_id)

    def reset_password(self, token_hash: str, password_hash: str, *, now: float) -> User:
        """Use a reset token: check it, set the password, revoke all the user's tokens.

        Raises: NotFound (no such reset token), Expired (expired, used or revoked), Invalid.
        """
        if not password_hash:
            raise Invalid("password_hash", "password_hash is empty")
        with self._write() as db:
            token = self._valid_token(token_hash, TokenKind.RESET, now)
            db.execute("UPDATE users SET password_hash = ? WHERE id = ?",
                       (password_hash, token.user))
            db.execute("UPDATE tokens SET revoked_at = ? WHERE user = ? AND revoked_at IS NULL",
                       (now, token.user))
        return self.get_user(token.user)

    def set_cli_key(self, user_id: str, public_key: str | None) -> User:
        """Record the public key (64 hex) the user's CLI registered; None forgets it.

        Raises: NotFound, Invalid.
        """
        if public_key is not None:
            try:
                public_key = key_hex(public_key)
            except ValueError as exc:
                raise Invalid("cli_public_key", f"cli_public_key {exc}") from None
        with self._write() as db:
            self._user_row(user_id)
            db.execute("UPDATE users SET cli_public_key = ? WHERE id = ?",
                       (public_key, user_id))
        return self.get_user(user_id)

    def set_active_team(self, user_id: str, team_id: str | None) -> User:
        """Choose the team new jobs and keys belong to.

        Raises: NotFound (user, or they are not a member of the team).
        """
        with self._write() as db:
            self._user_row(user_id)
            if team_id is not None and self._one(
                    "SELECT 1 FROM memberships WHERE user = ? AND team = ?",
                    (user_id, team_id)) is None:
                raise NotFound(f"user {user_id} is not a member of team {team_id}; "
                               "accept an invitation first")
            db.execute("UPDATE users SET active_team = ? WHERE id = ?", (team_id, user_id))
        return self.get_user(user_id)

    def _user_row(self, user_id: str) -> User:
        row = self._one(f"SELECT {_USER} FROM users WHERE id = ?", (user_id,))
        if row is None:
            raise NotFound(f"no user {user_id}")
        return _user(row)

    # -- teams ------------------------------------------------------------------------

    def create_team(self, *, name: str, owner: str, now: float,
                    quota: TeamQuota | None = None) -> Team:
        """A team with ``owner`` as its first owner (made their active team if they had none),
        with ``quota`` (None: unlimited) set in the same transaction.

        Raises: NotFound (owner), Conflict (the name is taken), Invalid.
        """
        with self._write():
            self._user_row(owner)
            team = self._insert_team(name, owner, now)
            if quota is not None:
                self._put_quota(team.id, quota)
            return team

    def _insert_team(self, name: str, owner: str, now: float) -> Team:
        name = _text("name", name, 64)
        if self._one("SELECT 1 FROM teams WHERE name = ?", (name,)) is not None:
            raise Conflict(f"a team named {name!r} exists already; choose another name")
        team = Team(id=_new_id(), name=name, created_at=now)
        self._conn.execute("INSERT INTO teams (id, name, created_at) VALUES (?,?,?)",
                           (team.id, team.name, team.created_at))
        self._conn.execute("INSERT INTO memberships (user, team, role) VALUES (?,?,?)",
                           (owner, team.id, Role.OWNER.value))
        self._conn.execute(
            "UPDATE users SET active_team = ? WHERE id = ? AND active_team IS NULL",
            (team.id, owner))
        return team

    def get_team(self, team_id: str) -> Team:
        """Raises: NotFound."""
        with self._read():
            row = self._one("SELECT id, name, created_at FROM teams WHERE id = ?", (team_id,))
        if row is None:
            raise NotFound(f"no team {team_id}")
        return Team(*row)

    def list_teams(self) -> list[Team]:
        """Every team, by name."""
        with self._read() as db:
            return [Team(*row) for row in db.execute(
                "SELECT id, name, created_at FROM teams ORDER BY name")]

    def rename_team(self, team_id: str, name: str) -> Team:
        """Raises: NotFound, Conflict (the name is taken), Invalid."""
        with self._write() as db:
            self._team_row(team_id)
            name = _text("name", name, 64)
            if self._one("SELECT 1 FROM teams WHERE name = ? AND id != ?",
                          (name, team_id)) is not None:
                raise Conflict(f"a team named {name!r} exists already; choose another name")
            db.execute("UPDATE teams SET name = ? WHERE id = ?", (name, team_id))
        return self.get_team(team_id)

    def delete_team(self, team_id: str) -> None:
        """Delete the team with its memberships, invitations and revoked key records.

        Raises:
            NotFound; Conflict: it still has live jobs or unrevoked API keys (delete
            and revoke them first, so nothing keeps running or billing unowned).
        """
        with self._write() as db:
            self._team_row(team_id)
            if self._one("SELECT 1 FROM jobs WHERE team = ? AND deleted_at IS NULL",
                         (team_id,)) is not None:
                raise Conflict("the team still has jobs; delete them first")
            if self._one("SELECT 1 FROM api_keys WHERE team = ? AND revoked_at IS NULL",
                         (team_id,)) is not None:
                raise Conflict("the team still has API keys; revoke them first")
            db.execute("DELETE FROM jobs WHERE team = ?", (team_id,))
            db.execute("DELETE FROM teams WHERE id = ?", (team_id,))

    def _team_row(self, team_id: str) -> Team:
        row = self._one("SELECT id, name, created_at FROM teams WHERE id = ?", (team_id,))
        if row is None:
            raise NotFound(f"no team {team_id}")
        return Team(*row)

    # -- memberships ----------------------------------------------------------------

    def role_of(self, user_id: str, team_id: str) -> Role | None:
        """The user's role in the team; None: not a member (the API answers 403/404)."""
        with self._read():
            row = self._one("SELECT role FROM memberships WHERE user = ? AND team = ?",
                            (user_id, team_id))
        return None if row is None else Role(row[0])

    def add_member(self, team_id: str, user_id: str, role: Role | str) -> Membership:
        """Raises: NotFound (team or user), Conflict (already a member), Invalid (role)."""
        role = _role(role)
        with self._write():
            return self._insert_member(team_id, user_id, role)

    def _insert_member(self, team_id: str, user_id: str, role: Role) -> Membership:
        self._team_row(team_id)
        self._user_row(user_id)
        if self._one("SELECT 1 FROM memberships WHERE user = ? AND team = ?",
                     (user_id, team_id)) is not None:
            raise Conflict(f"user {user_id} is a member of team {team_id} already; "
                           "change their role instead")
        self._conn.execute("INSERT INTO memberships (user, team, role) VALUES (?,?,?)",
                           (user_id, team_id, role.value))
        self._conn.execute(
            "UPDATE users SET active_team = ? WHERE id = ? AND active_team IS NULL",
            (team_id, user_id))
        return Membership(user=user_id, team=team_id, role=role)

    def change_role(self, team_id: str, user_id: str, role: Role | str) -> Membership:
        """Raises: NotFound (not a member), LastOwner (demoting the only owner), Invalid."""
        role = _role(role)
        with self._write() as db:
            current = self._member_role(team_id, user_id)
            if current is Role.OWNER and role is not Role.OWNER:
                self._check_not_last_owner(team_id, user_id)
            db.execute("UPDATE memberships SET role = ? WHERE user = ? AND team = ?",
                       (role.value, user_id, team_id))
        return Membership(user=user_id, team=team_id, role=role)

    def remove_member(self, team_id: str, user_id: str) -> None:
        """Raises: NotFound (not a member), LastOwner (the only owner)."""
        with self._write() as db:
            if self._member_role(team_id, user_id) is Role.OWNER:
                self._check_not_last_owner(team_id, user_id)
            db.execute("DELETE FROM memberships WHERE user = ? AND team = ?",
                       (user_id, team_id))
            db.execute("UPDATE users SET active_team = NULL WHERE id = ? AND active_team = ?",
                       (user_id, team_id))

    def list_members(self, team_id: str) -> list[tuple[User, Role]]:
        """The team's members with their roles, by email. Raises: NotFound (team)."""
        with self._read() as db:
            self._team_row(team_id)
            rows = db.execute(
                f"SELECT m.role, {', '.join('u.' + c.strip() for c in _USER.split(','))} "
                "FROM memberships m JOIN users u ON u.id = m.user WHERE m.team = ? "
                "ORDER BY u.email", (team_id,)).fetchall()
            return [(_user(row[1:]), Role(row[0])) for row in rows]

    def teams_of(self, user_id: str) -> list[tuple[Team, Role]]:
        """The user's teams with their role in each, by name."""
        with self._read() as db:
            rows = db.execute(
                "SELECT t.id, t.name, t.created_at, m.role FROM memberships m "
                "JOIN teams t ON t.id = m.team WHERE m.user = ? ORDER BY t.name",
                (user_id,)).fetchall()
            return [(Team(*row[:3]), Role(row[3])) for row in rows]

    def shell_keys_by_team(self) -> dict[str, tuple[str, ...]]:
        """Every team's shell keys: its members' CLI keys (sorted, unique), leaving
        out disabled users; a team whose members have none maps to ``()``."""
        with self._read() as db:
            rows = db.execute(
                "SELECT t.id, u.cli_public_key FROM teams t "
                "LEFT JOIN memberships m ON m.team = t.id "
                "LEFT JOIN users u ON u.id = m.user AND u.disabled = 0 "
                "AND u.cli_public_key IS NOT NULL").fetchall()
        keys: dict[str, set[str]] = {}
        for team, key in rows:
            found = keys.setdefault(team, set())
            if key:
                found.add(key.lower())
        return {team: tuple(sorted(found)) for team, found in keys.items()}

    def _member_role(self, team_id: str, user_id: str) -> Role:
        row = self._one("SELECT role FROM memberships WHERE user = ? AND team = ?",
                        (user_id, team_id))
        if row is None:
            raise NotFound(f"user {user_id} is not a member of team {team_id}")
        return Role(row[0])

    def _check_not_last_owner(self, team_id: str, user_id: str) -> None:
        (others,) = self._one(
            "SELECT COUNT(*) FROM memberships WHERE team = ? AND role = 'owner' AND user != ?",
            (team_id, user_id))
        if others == 0:
            raise LastOwner(f"user {user_id} is the last owner of team {team_id}; "
                            "make another member an owner first")
