"""The daemons' SQLite files: how one is opened, versioned and written.

Every daemon store (wrk-ork's, the worker's, app-node's and its health
history) is one SQLite connection used from worker threads, one at a time:

- :func:`connect` opens it in autocommit mode (transactions are explicit) with
  the WAL journal (readers never block the one writer; a commit is one append)
  and the ``synchronous`` level the store chose: ``FULL`` where a call that
  returned must be on disk, ``NORMAL`` where the last rows may be lost at no cost;
- :func:`immediate` is one atomic write: ``BEGIN IMMEDIATE`` takes the write lock
  up front (so the checks a change depends on run under it), ``COMMIT`` at the
  end, ``ROLLBACK`` on any exception;
- :func:`migrate` brings a file to the code's :class:`Schema`: a fresh one is
  created at the newest version in one transaction, an older one climbs the
  ladder of upgrades, each step in a transaction of its own with the version it
  reaches, so a crash mid-way resumes from the last finished step. A file newer
  than the code is refused (:class:`SchemaTooNew`) rather than misread, and an
  unversioned file with tables in it is not taken for a fresh one
  (:class:`NotThisStore`).

Blocking: every function here blocks; daemons call them through ``trio.to_thread``.
File permissions are the stores' business (``p2p.files.private_file`` before
:func:`connect`: SQLite gives ``-wal`` and ``-shm`` the main file's mode).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

__all__ = ["USER_VERSION", "NotThisStore", "Schema", "SchemaError", "SchemaTooNew", "Step",
           "Version", "connect", "immediate", "migrate"]

#: One migration step: SQL statements separated by ``;`` (no triggers), or a function
#: of the connection (for a step that rewrites rows). It runs inside a transaction.
Step = str | Callable[[sqlite3.Connection], None]


class SchemaError(Exception):
    """The file's schema is not one this code can use; ``code`` says why."""

    code = "schema"


class SchemaTooNew(SchemaError):
    """The file was written by a newer version of the daemon."""

    code = "schema_too_new"

    def __init__(self, found: int, supported: int) -> None:
        super().__init__(f"schema {found} is newer than this code's {supported}")
        self.found = found
        self.supported = supported


class NotThisStore(SchemaError):
    """An SQLite file with tables and no schema version: somebody else's."""

    code = "not_this_store"

    def __init__(self) -> None:
        super().__init__("the file has tables and no schema version")


@dataclass(frozen=True)
class Schema:
    """What a store's file looks like, version by version."""

    #: Makes a fresh file at the newest version, in one go.
    create: Step
    #: ``upgrades[n - 1]`` takes a file from version ``n`` to ``n + 1``.
    upgrades: Sequence[Step] = ()
    #: An unversioned file with tables is this store's first version from before it
    #: was versioned (``create`` must then be idempotent: ``IF NOT EXISTS``).
    adopt_unversioned: bool = False

    @property
    def version(self) -> int:
        """The newest version: 1 + the number of upgrades."""
        return 1 + len(self.upgrades)


class Version(Protocol):
    """Where a file keeps its schema version (0: none yet)."""

    def read(self, conn: sqlite3.Connection) -> int: ...

    def write(self, conn: sqlite3.Connection, version: int) -> None: ...


class _UserVersion:
    """``PRAGMA user_version``: SQLite's own integer in the file header."""

    def read(self, conn: sqlite3.Connection) -> int:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        return int(version)

    def write(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute(f"PRAGMA user_version = {int(version)}")


USER_VERSION: Version = _UserVersion()


def connect(path: Path | str | None, *, synchronous: Literal["FULL", "NORMAL"] = "FULL",
            foreign_keys: bool = False, secure_delete: bool = False) -> sqlite3.Connection:
    """Open the file at ``path`` (``None``: a database in memory, for tests) for use
    from one thread at a time, whichever it is.

    ``foreign_keys`` enforces the schema's references; ``secure_delete`` overwrites
    deleted content (a store that once held secrets).

    Raises:
        sqlite3.Error: the file cannot be opened or is not a database.
    """
    conn = sqlite3.connect(":memory:" if path is None else str(path),
                           isolation_level=None, check_same_thread=False)
    try:
        if foreign_keys:
            conn.execute("PRAGMA foreign_keys = ON")
        if secure_delete:
            conn.execute("PRAGMA secure_delete = ON")
        if path is not None:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One atomic write: everything inside commits together or not at all.

    Raises:
        sqlite3.Error: the write lock, a statement or the commit failed (nothing
            was written).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def migrate(conn: sqlite3.Connection, schema: Schema, *,
            version: Version = USER_VERSION) -> int:
    """Bring the file to ``schema.version``; returns the version it had (0: fresh).

    Raises:
        SchemaTooNew: the file is newer than ``schema``.
        NotThisStore: it has tables and no version (unless ``schema.adopt_unversioned``).
        sqlite3.Error: a step failed (its transaction, and only it, is rolled back).
    """
    found = version.read(conn)
    if found > schema.version:
        raise SchemaTooNew(found, schema.version)
    if found == 0:
        tables = conn.execute(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if tables and not schema.adopt_unversioned:
            raise NotThisStore()
        with immediate(conn):
            _apply(conn, schema.create)
            version.write(conn, schema.version)
        return found
    for at in range(found, schema.version):
        with immediate(conn):
            _apply(conn, schema.upgrades[at - 1])
            version.write(conn, at + 1)
    return found


def _apply(conn: sqlite3.Connection, step: Step) -> None:
    if callable(step):
        step(conn)
        return
    # Statement by statement: executescript() would commit the open transaction.
    for statement in step.split(";"):
        if statement.strip():
            conn.execute(statement)
