"""Where the health rows are kept: one interface, SQLite by default, Redis when configured.

:class:`HealthStore` is what the prober writes and the routes read; both
backends keep whole rows (:class:`~._model.HealthRow` as JSON) indexed by
service and time, and forget rows older than what :meth:`HealthStore.prune`
is given (the prober prunes to ``retention_s`` about every ten minutes).

Why its own SQLite file (``<storage>/health.sqlite``) and not app-node's store:
app-node's store holds users, teams and sessions and fsyncs every commit; a
row a service every 15 s would contend with sign-ups and logins for its one
writer and grow what operators back up, for data that may be lost at no cost.
Here the journal is WAL with ``synchronous=NORMAL`` (a power cut may lose the
last rows, never corrupt the file), and the file can be deleted any time.

Every call runs in a worker thread, one at a time (one connection; SQLite
must never block the trio loop). Failures are :class:`HealthStoreError`: the
prober logs and goes on, the routes answer 503.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import trio

from nodes.kit.sqlite import Schema, SchemaError, connect, immediate, migrate
from p2p.files import private_file

from ._model import MAX_ROWS, HealthRow

__all__ = ["HealthStore", "HealthStoreError", "SqliteHealthStore"]


class HealthStoreError(Exception):
    """The health store failed (a file, or Redis unreachable); the message says which."""


class HealthStore(Protocol):
    """The health history's storage; every method may raise :class:`HealthStoreError`."""

    async def add(self, rows: Sequence[HealthRow]) -> None:
        """Keep ``rows``."""

    async def latest(self) -> dict[str, HealthRow]:
        """Each service's newest row."""

    async def history(self, since: float, until: float, *, service: str | None = None,
                      limit: int = MAX_ROWS) -> list[HealthRow]:
        """Rows with ``since <= at <= until`` (of ``service``, or every one), oldest
        first; beyond ``limit`` only the newest ``limit``."""

    async def prune(self, before: float) -> int:
        """Forget rows older than ``before``; how many."""

    async def aclose(self) -> None:
        """Release the file or connections (idempotent)."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS health_rows (
    at REAL NOT NULL,
    service TEXT NOT NULL,
    row TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS health_rows_service_at ON health_rows (service, at);
CREATE INDEX IF NOT EXISTS health_rows_at ON health_rows (at);
"""
#: Files from before the schema was versioned have the same tables, and are adopted.
_LADDER = Schema(create=_SCHEMA, adopt_unversioned=True)


class SqliteHealthStore:
    """The rows in one SQLite file (``:memory:`` for tests that need no file).

    Use :meth:`open`.
    """

    def __init__(self, conn: sqlite3.Connection, path: Path | str) -> None:
        self._conn = conn
        self.path = path
        self._lock = threading.Lock()  # one connection, used from worker threads
        self._threads = trio.CapacityLimiter(1)
        self._closed = False

    @classmethod
    def open(cls, path: Path | str) -> SqliteHealthStore:
        """Open (creating) the file; blocking: call it in a thread.

        Raises:
            HealthStoreError: it cannot be opened or is not such a store.
        """
        try:
            private_file(path)
            conn = connect(path, synchronous="NORMAL")
            try:
                migrate(conn, _LADDER)
            except BaseException:
                conn.close()
                raise
        except (sqlite3.Error, SchemaError) as exc:
            raise HealthStoreError(f"cannot open the health history {path}: {exc}; "
                                   "delete the file (it holds only history)") from exc
        return cls(conn, path)

    async def _run(self, what: str, fn, *args):
        def locked():
            with self._lock:
                if self._closed:
                    raise HealthStoreError("the health store is closed")
                return fn(*args)
        try:
            return await trio.to_thread.run_sync(locked, limiter=self._threads)
        except sqlite3.Error as exc:
            raise HealthStoreError(f"health history {self.path}: {what} failed: {exc}") \
                from exc

    async def add(self, rows: Sequence[HealthRow]) -> None:
        values = [(row.at, row.service, row.model_dump_json()) for row in rows]

        def insert() -> None:
            with immediate(self._conn):
                self._conn.executemany("INSERT INTO health_rows VALUES (?,?,?)", values)

        if values:
            await self._run("adding rows", insert)

    async def latest(self) -> dict[str, HealthRow]:
        def read() -> list[tuple[str]]:
            # SQLite gives a bare column the values of the row holding MAX().
            return self._conn.execute(
                "SELECT row, MAX(at) FROM health_rows GROUP BY service").fetchall()

        return {row.service: row for row in
                (HealthRow.model_validate_json(raw) for raw, _ in await self._run("reading",
                                                                                  read))}

    async def history(self, since: float, until: float, *, service: str | None = None,
                      limit: int = MAX_ROWS) -> list[HealthRow]:
        where, args = "at >= ? AND at <= ?", [since, until]
        if service is not None:
            where += " AND service = ?"
            args.append(service)

        def read() -> list[tuple[str]]:
            return self._conn.execute(
                f"SELECT row FROM health_rows WHERE {where} ORDER BY at DESC, rowid DESC "
                "LIMIT ?", (*args, max(limit, 0))).fetchall()

        rows = [HealthRow.model_validate_json(raw) for (raw,) in
                await self._run("reading", read)]
        rows.reverse()
        return rows

    async def prune(self, before: float) -> int:
        def delete() -> int:
            with immediate(self._conn):
                return self._conn.execute("DELETE FROM health_rows WHERE at < ?",
                                          (before,)).rowcount

        return await self._run("pruning", delete)

    async def aclose(self) -> None:
        def close() -> None:
            with self._lock:
                if not self._closed:
                    self._closed = True
                    self._conn.close()

        await trio.to_thread.run_sync(close, limiter=self._threads)
