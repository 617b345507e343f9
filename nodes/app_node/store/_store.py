"""app-node's own SQLite file: users, teams, memberships, invitations, tokens,
API key records, job records and quotas.

Theory of operation
-------------------
A :class:`Store` is one connection to the file (:class:`Connection`) and one
repository per aggregate, all sharing that connection: ``store.users``
(accounts), ``store.teams`` (teams and their memberships), ``store.invitations``,
``store.tokens`` (sessions and password resets), ``store.api_keys`` (records
of the shared database's keys), ``store.jobs`` (records of wrk-ork's jobs)
and ``store.quotas`` (teams' GPU quotas). A change that spans aggregates is
made by the repository of the one it is about (the first admin and their
team by ``users``, accepting an invitation by ``invitations``), through the
same connection and so in the same transaction.

Every change is one transaction (``BEGIN IMMEDIATE`` … ``COMMIT``): a method
either did all it says or nothing, so ``users.create_first_admin`` never
leaves a user without a team and ``invitations.accept`` never marks an
invitation used without the membership. The checks a change depends on (no users yet, the last
owner, an invitation's expiry) run inside the same transaction as the writes,
so two API requests racing cannot both pass them.

The store is blocking and knows no clock: app-node calls it through
``trio.to_thread.run_sync`` and passes ``now`` (POSIX seconds). One lock
serialises the threads on the single connection. The file is WAL-journaled
with ``synchronous=FULL`` (a call that returned is on disk); its schema
version is ``PRAGMA user_version``, and a file from a newer app-node is
refused rather than misread.

Invariant: every team has at least one owner. ``teams.change_role``,
``teams.remove_member`` and ``users.delete`` refuse with :class:`LastOwner`
instead of breaking it; a team is created together with its owner.

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

Listings of jobs and users (``jobs.page``, ``users.page``) are keyset-paginated
(:class:`Page`): the cursor is the last row's position, so rows added while a
client pages never shift it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nodes.kit.sqlite import NotThisStore, Schema, SchemaTooNew, connect, migrate
from p2p.files import private_file

from ..errors import StoreError
from ._api_keys import ApiKeys
from ._connection import Connection
from ._invitations import Invitations
from ._job_records import JobRecords
from ._quotas import QUOTAS_SCHEMA, Quotas
from ._teams import Teams
from ._tokens import Tokens
from ._users import Users

__all__ = ["SCHEMA_VERSION", "Store"]

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
""" + QUOTAS_SCHEMA

_LADDER = Schema(create=_SCHEMA, upgrades=(
    QUOTAS_SCHEMA,  # version 2 keeps the teams' GPU quotas (none yet: unlimited)
))
#: The newest schema: older files climb ``_LADDER`` when opened.
SCHEMA_VERSION = _LADDER.version


class Store:
    """The SQLite file (or an in-memory database) behind one app-node: one
    connection and a repository per aggregate.

    Use :meth:`open`. Every repository method is blocking and thread-safe (one
    lock); every change is atomic. Refusals raise
    :class:`~nodes.app_node.errors.AppNodeError`.
    """

    def __init__(self, db: Connection) -> None:
        #: The connection every repository shares.
        self.db = db
        self.path = db.path
        self.users = Users(db)
        self.teams = Teams(db)
        self.invitations = Invitations(db)
        self.tokens = Tokens(db)
        self.api_keys = ApiKeys(db)
        self.jobs = JobRecords(db)
        self.quotas = Quotas(db)

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
        return cls(Connection(conn, path))

    def close(self) -> None:
        self.db.close()
