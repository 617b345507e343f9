"""The worker's own state: what each replica should be, and which operations it applied.

One SQLite file (``<storage>/worker.sqlite``, WAL, ``synchronous=FULL``).
An operation from wrk-ork is *applied* when its intent is written here (in
the same transaction as its op id); only then is it acked on the queue. The
reconcilers then drive the backend towards the recorded intent, and after a
crash they resume from it: so a worker killed mid-operation loses nothing,
and an operation delivered twice finds its op id and changes nothing.

Rows:

- ``replicas``: one per (job, replica): the job's spec and placement, the
  generation wanted and the one the backend has reached, ``run`` or
  ``delete``, the relays frozen at creation (seeds/relay.txt: only jobs
  created after a worker restart get new relay keys), the SHA-256 of each
  VMI's report token, and the last state reported to wrk-ork.
- ``applied_ops``: op ids already applied.
- ``shell_keys``: per team, the newest shell keys wrk-ork sent;
  an older version never replaces a newer one.

Secrets: the report tokens themselves are never written here. The
worker mints them when it creates or restarts a replica's VMIs, hands them to
the backend (into each VMI's own config), and keeps their digests, which is all
:meth:`~.agents.AgentTable.hello` needs; a copy of this file proves no VMI.
Schema 1 kept the tokens themselves: opening such a file hashes them in place,
then rewrites the file (``VACUUM``) and empties the WAL, so no page holds the
old text (``secure_delete`` is on for every later write). The file and its
``-wal`` and ``-shm`` are 0600 whatever the umask (SQLite gives the companions
the main file's mode).

Blocking calls: the daemon runs them through ``trio.to_thread``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from contracts.model import JobSpec, ReplicaPlacement, ReplicaState
from contracts.shell_access import ShellKeys
from nodes.kit.sqlite import Schema, SchemaTooNew, connect, immediate, migrate

from .backend import token_digest

__all__ = ["ReplicaRecord", "StoreError", "WorkerStore"]

#: The file and its companions: readable by the worker's user only.
FILE_MODE = 0o600
_COMPANIONS = ("", "-wal", "-shm", "-journal")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS replicas (
    job_id TEXT NOT NULL,
    replica INTEGER NOT NULL,
    spec TEXT NOT NULL,
    placement TEXT NOT NULL,
    generation INTEGER NOT NULL,
    done_generation INTEGER NOT NULL DEFAULT -1,
    desired TEXT NOT NULL CHECK (desired IN ('run', 'delete')),
    removed INTEGER NOT NULL DEFAULT 0,
    relays TEXT NOT NULL,
    tokens TEXT NOT NULL,  -- schema 2: the tokens' SHA-256 (hex), never the tokens
    reported_state TEXT,
    reported_message TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    PRIMARY KEY (job_id, replica)
);
CREATE TABLE IF NOT EXISTS applied_ops (op_id TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS shell_keys (
    team TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    keys TEXT NOT NULL
);
"""


class StoreError(Exception):
    """The worker's state file is unusable (named, with why)."""


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica as the worker keeps it."""

    job_id: str
    replica: int
    spec: JobSpec
    placement: ReplicaPlacement
    #: The generation wrk-ork asked for.
    generation: int
    #: The generation the backend has created or restarted to; -1: none yet.
    done_generation: int
    #: ``run`` or ``delete``.
    desired: str
    #: The backend removed everything (after a delete).
    removed: bool
    relays: tuple[str, ...]
    #: The SHA-256 (hex) of each VMI's (node rank's) report token; empty until
    #: the worker first creates the VMIs (it mints the tokens then).
    token_hashes: tuple[str, ...]
    reported_state: ReplicaState | None
    reported_message: str
    created_at: float

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.replica)

    @property
    def settled(self) -> bool:
        """Nothing left for the backend to do."""
        if self.desired == "delete":
            return self.removed
        return self.done_generation >= self.generation


class WorkerStore:
    """The SQLite file of one worker. Thread-safe: one connection, one lock."""

    def __init__(self, connection: sqlite3.Connection, path: str) -> None:
        self._db = connection
        self._lock = threading.Lock()
        self.path = path

    @classmethod
    def open(cls, path: Path | str | None) -> WorkerStore:
        """Open (or create) the state file; None keeps it in memory (tests).

        Raises:
            StoreError: not a worker state file, or a newer schema.
        """
        name = ":memory:" if path is None else str(path)
        try:
            if path is not None:
                _private(name)
            db = connect(path, synchronous="FULL", secure_delete=True)
            try:
                # Every table, in any file: shell_keys came without a schema bump.
                db.executescript(_SCHEMA)
                found = migrate(db, _LADDER, version=_META_VERSION)
            except BaseException:
                db.close()
                raise
            if found == 1:
                _forget_tokens(db)
            if path is not None:
                _private(name)
        except SchemaTooNew as exc:
            raise StoreError(f"{name} has schema {exc.found}, newer than this worker's "
                             f"{exc.supported}: upgrade the worker") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot use worker state {name}: {exc}") from None
        except OSError as exc:
            raise StoreError(f"cannot use worker state {name}: {exc.strerror or exc}") from None
        return cls(db, name)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- reads -------------------------------------------------------------

    def replicas(self, *, include_removed: bool = False) -> list[ReplicaRecord]:
        query = "SELECT * FROM replicas"
        if not include_removed:
            query += " WHERE removed = 0"
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created_at, job_id, replica").fetchall()
        return [_record(row) for row in rows]

    def replica(self, job_id: str, replica: int) -> ReplicaRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM replicas WHERE job_id=? AND replica=?",
                                   (job_id, replica)).fetchone()
        return None if row is None else _record(row)

    def applied(self, op_id: str) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM applied_ops WHERE op_id=?",
                                    (op_id,)).fetchone() is not None

    # -- writes: each is one transaction with the op id it applies ----------

    def apply_create(self, op_id: str, record: ReplicaRecord, now: float) -> bool:
        """Record a new replica; False if the op (or the replica) is known."""
        with self._lock, immediate(self._db):
            if self._seen(op_id, now):
                return False
            exists = self._db.execute("SELECT 1 FROM replicas WHERE job_id=? AND replica=?",
                                      record.key).fetchone()
            if exists is not None:
                return False
            self._db.execute(
                "INSERT INTO replicas (job_id, replica, spec, placement, generation, "
                "done_generation, desired, removed, relays, tokens, reported_state, "
                "reported_message, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (record.job_id, record.replica, record.spec.model_dump_json(),
                 record.placement.model_dump_json(), record.generation, -1, "run", 0,
                 json.dumps(list(record.relays)), json.dumps(list(record.token_hashes)), None, "",
                 record.created_at))
            return True

    def apply_restart(self, op_id: str, job_id: str, replica: int, generation: int,
                      now: float) -> bool:
        """Ask for ``generation``; False if the op is known or nothing changes."""
        with self._lock, immediate(self._db):
            if self._seen(op_id, now):
                return False
            cursor = self._db.execute(
                "UPDATE replicas SET generation=? WHERE job_id=? AND replica=? "
                "AND desired='run' AND generation < ?", (generation, job_id, replica, generation))
            return cursor.rowcount == 1

    def apply_delete(self, op_id: str, job_id: str, replica: int, now: float) -> bool:
        with self._lock, immediate(self._db):
            if self._seen(op_id, now):
                return False
            cursor = self._db.execute(
                "UPDATE replicas SET desired='delete' WHERE job_id=? AND replica=? "
                "AND desired='run'", (job_id, replica))
            return cursor.rowcount == 1

    def skip(self, op_id: str, now: float) -> None:
        """Remember an op that cannot be applied (unknown replica), so it stays skipped."""
        with self._lock, immediate(self._db):
            self._seen(op_id, now)

    def set_token_hashes(self, job_id: str, replica: int, generation: int,
                         hashes: tuple[str, ...]) -> bool:
        """Keep the digests of the tokens just minted for ``generation``; False if
        the replica is gone or asks for another generation now."""
        with self._lock, immediate(self._db):
            cursor = self._db.execute(
                "UPDATE replicas SET tokens=? WHERE job_id=? AND replica=? AND generation=?",
                (json.dumps(list(hashes)), job_id, replica, generation))
            return cursor.rowcount == 1

    def mark_done(self, job_id: str, replica: int, generation: int) -> None:
        with self._lock, immediate(self._db):
            self._db.execute("UPDATE replicas SET done_generation=MAX(done_generation, ?) "
                             "WHERE job_id=? AND replica=?", (generation, job_id, replica))

    def mark_removed(self, job_id: str, replica: int) -> None:
        with self._lock, immediate(self._db):
            self._db.execute("UPDATE replicas SET removed=1 WHERE job_id=? AND replica=?",
                             (job_id, replica))

    def mark_reported(self, job_id: str, replica: int, state: ReplicaState,
                      message: str) -> None:
        with self._lock, immediate(self._db):
            self._db.execute("UPDATE replicas SET reported_state=?, reported_message=? "
                             "WHERE job_id=? AND replica=?",
                             (state.value, message, job_id, replica))

    def set_shell_keys(self, keys: ShellKeys) -> bool:
        """Keep the team's shell keys; False (nothing written) unless newer."""
        with self._lock, immediate(self._db):
            cursor = self._db.execute(
                "INSERT INTO shell_keys VALUES (?,?,?) ON CONFLICT(team) DO UPDATE SET "
                "version=excluded.version, keys=excluded.keys "
                "WHERE excluded.version > shell_keys.version",
                (keys.team, keys.version, json.dumps(list(keys.keys))))
            return cursor.rowcount == 1

    def shell_keys(self) -> dict[str, ShellKeys]:
        """Every team's newest shell keys."""
        with self._lock:
            rows = self._db.execute("SELECT team, version, keys FROM shell_keys").fetchall()
        return {team: ShellKeys(team=team, version=version, keys=tuple(json.loads(keys)))
                for team, version, keys in rows}

    def _seen(self, op_id: str, now: float) -> bool:
        try:
            self._db.execute("INSERT INTO applied_ops VALUES (?, ?)", (op_id, now))
        except sqlite3.IntegrityError:
            return True
        return False


def _record(row: tuple) -> ReplicaRecord:
    (job_id, replica, spec, placement, generation, done_generation, desired, removed,
     relays, tokens, reported_state, reported_message, created_at) = row
    return ReplicaRecord(
        job_id=job_id, replica=replica, spec=JobSpec.model_validate_json(spec),
        placement=ReplicaPlacement.model_validate_json(placement), generation=generation,
        done_generation=done_generation, desired=desired, removed=bool(removed),
        relays=tuple(json.loads(relays)), token_hashes=tuple(json.loads(tokens)),
        reported_state=ReplicaState(reported_state) if reported_state else None,
        reported_message=reported_message, created_at=created_at)


def _private(name: str) -> None:
    """The state file (created empty if missing) and its companions: 0600."""
    fd = os.open(name, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    for suffix in _COMPANIONS[1:]:
        try:
            os.chmod(name + suffix, FILE_MODE)
        except FileNotFoundError:
            pass


def _hash_tokens_in_place(db: sqlite3.Connection) -> None:
    """Schema 1 → 2: replace each kept report token by its SHA-256."""
    for key, tokens in db.execute("SELECT rowid, tokens FROM replicas").fetchall():
        hashes = [token_digest(token) for token in json.loads(tokens)]
        db.execute("UPDATE replicas SET tokens=? WHERE rowid=?", (json.dumps(hashes), key))


def _forget_tokens(db: sqlite3.Connection) -> None:
    """After :func:`_hash_tokens_in_place`: rewrite the file and empty the WAL so that
    no page, free or logged, holds a token."""
    db.execute("VACUUM")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


class _MetaVersion:
    """The worker keeps its schema version in ``meta``, not ``user_version``."""

    def read(self, conn: sqlite3.Connection) -> int:
        try:
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        except sqlite3.OperationalError:  # no meta table: a fresh file
            return 0
        return 0 if row is None else int(row[0])

    def write(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(version),))


_META_VERSION = _MetaVersion()
#: ``adopt_unversioned``: the tables exist before the version is read (``open``).
_LADDER = Schema(create=_SCHEMA, upgrades=(_hash_tokens_in_place,), adopt_unversioned=True)
SCHEMA_VERSION = _LADDER.version
