"""The view: an SQLite database computed from every applied entry's operations.

The view is a *pure function of the set of applied entries*: two replicas that
applied the same entries hold the same rows, whatever order the entries came
in and however they were split into :meth:`View.apply` calls. Nothing depends
on arrival order because every table's rule is commutative, associative and
keyed by something every replica agrees on:

``api_keys``
    Each key's fields are a last-writer-wins register over its ``key_put``
    ops, ordered by the entry's *stamp* ``(clock, writer, index)`` — the same
    total order on every replica (:func:`~._entries.order_key`), so "keep the
    larger stamp" is a max, and max commutes. Revocation is a separate,
    grow-only flag: any ``key_revoke`` sets ``revoked = 1`` and no op ever
    clears it (an OR commutes), whatever the stamps say — a revoke concurrent
    with, or even causally before, a put still wins, because a leaked key must
    stay dead. ``revoked_ms`` is the minimum over revokes. A revoke that
    arrives before any put leaves a tombstone row with NULL fields, so the
    later put cannot resurrect the key.
``model_masters``
    One last-writer-wins register per name over ``model_put`` and
    ``model_delete``: a delete is a tombstone carrying its stamp, so a put with
    a larger stamp revives the model and one with a smaller stamp does not.
``token_usage``
    Sums of exact integers per (key, model, day): addition commutes. Counts
    are integers (audio in milliseconds, never float seconds) because float
    addition is not associative and would differ by arrival order. Sums
    saturate at 2**63 - 1 instead of overflowing into SQLite REAL;
    min(a + b, cap) over non-negative numbers is still associative.
``key_last_used``
    The maximum ``at_ms`` per key: max commutes.

Several ops of one entry may touch the same row; they share the entry's stamp,
and the later op in the entry wins. An entry is always applied whole, in one
call, so that tie-break is the same everywhere. Invalid ops (see
:func:`~._ops.validate_op`, a pure function of the op) are skipped on every
replica alike; admin ops are not the view's business.

The view is a cache: it can always be rebuilt from the logs (:meth:`View.reset`
and re-apply, or delete the files). That is why it runs with
``synchronous=NORMAL`` in WAL mode — a crash may lose the last transactions but
never corrupts the file, and ``applied`` is written in the same transaction as
the rows, so the view says exactly which entry prefixes it holds.

Blocking; wrap calls in ``trio.to_thread.run_sync``. One thread at a time.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import sqlite3
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from p2p.files import private_file

from ._entries import Entry, EntryId
from ._errors import BadEntry, CrdtError
from ._ops import ADMIN_OPS, hash_secret, validate_op

__all__ = ["FORMAT_VERSION", "TABLE_COLUMNS", "ApiKey", "ModelMaster", "Usage", "View",
           "ViewMismatch"]

#: Version of the view's schema and rules; a change means "rebuild from the logs".
FORMAT_VERSION = 1
_MAX_INT = 2**63 - 1
_KEY_BYTES = 32

if sqlite3.sqlite_version_info < (3, 24, 0):  # pragma: no cover - build-time environment
    # upserts need 3.24, row-value comparison 3.15
    raise ImportError(f"crdt view needs SQLite >= 3.24, found {sqlite3.sqlite_version}")


class ViewMismatch(CrdtError):
    """The view file cannot be used as it is; delete it (:meth:`View.delete`) and rebuild.

    ``code``: ``OTHER_DB`` (built for another database), ``BAD_FORMAT`` (another
    format version, or not a view at all) or ``UNREADABLE`` (not an SQLite file,
    or damaged).
    """

    code = "VIEW_MISMATCH"


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as the view holds it (a row of ``api_keys``). The secret is never stored."""

    id: str
    team: str
    name: str
    #: ``hash_secret(secret)``: BLAKE2b-256, personalised.
    secret_hash: bytes
    scopes: tuple[str, ...]
    created_ms: int
    #: Once any replica revoked it, for good.
    revoked: bool
    #: The earliest revocation time (ms), or None.
    revoked_ms: int | None


@dataclass(frozen=True, slots=True)
class ModelMaster:
    """A model master (a row of ``model_masters`` that is not deleted)."""

    name: str
    runtime: str
    #: The JSON map it was put with.
    defaults: dict[str, Any] = field(hash=False)


@dataclass(frozen=True, slots=True)
class Usage:
    """One key's usage of one model on one UTC day: exact integer sums over every replica."""

    key_id: str
    model: str
    #: ``YYYY-MM-DD`` (UTC).
    day: str
    prompt: int
    completion: int
    total: int
    audio_ms: int
    requests: int


_SCHEMA = """
CREATE TABLE meta (k TEXT PRIMARY KEY, v) WITHOUT ROWID;
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    team TEXT,
    name TEXT,
    secret_hash BLOB,
    scopes TEXT,
    created_ms INTEGER,
    put_clock INTEGER,
    put_writer BLOB,
    put_index INTEGER,
    revoked INTEGER NOT NULL DEFAULT 0,
    revoked_ms INTEGER
) WITHOUT ROWID;
CREATE INDEX api_keys_by_hash ON api_keys (secret_hash);
CREATE INDEX api_keys_by_team ON api_keys (team, id);
CREATE TABLE model_masters (
    name TEXT PRIMARY KEY,
    runtime TEXT,
    defaults TEXT,
    deleted INTEGER NOT NULL,
    clock INTEGER NOT NULL,
    writer BLOB NOT NULL,
    idx INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE token_usage (
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    day TEXT NOT NULL,
    prompt INTEGER NOT NULL,
    completion INTEGER NOT NULL,
    total INTEGER NOT NULL,
    audio_ms INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    PRIMARY KEY (key_id, model, day)
) WITHOUT ROWID;
CREATE TABLE key_last_used (key_id TEXT PRIMARY KEY, at_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE applied (writer BLOB PRIMARY KEY, length INTEGER NOT NULL) WITHOUT ROWID;
"""

# table -> ORDER BY giving dump() a canonical order
_DATA_TABLES = {
    "api_keys": "id",
    "model_masters": "name",
    "token_usage": "key_id, model, day",
    "key_last_used": "key_id",
}

#: Columns of each data table, in ``_DATA_TABLES`` order (what a checkpoint carries).
TABLE_COLUMNS = {"api_keys": 11, "model_masters": 7, "token_usage": 8, "key_last_used": 2}
assert list(TABLE_COLUMNS) == list(_DATA_TABLES)

# Strictly greater stamp: an entry's stamp is unique, so equality only means the
# same entry applied again, which must change nothing.
_KEY_PUT = """
INSERT INTO api_keys (id, team, name, secret_hash, scopes, created_ms,
                      put_clock, put_writer, put_index, revoked)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)
ON CONFLICT (id) DO UPDATE SET
    team = excluded.team, name = excluded.name, secret_hash = excluded.secret_hash,
    scopes = excluded.scopes, created_ms = excluded.created_ms,
    put_clock = excluded.put_clock, put_writer = excluded.put_writer,
    put_index = excluded.put_index
WHERE api_keys.put_clock IS NULL
   OR (excluded.put_clock, excluded.put_writer, excluded.put_index)
      > (api_keys.put_clock, api_keys.put_writer, api_keys.put_index)
"""
# Never touches the put fields, and a put never touches these: the two commute.
_KEY_REVOKE = """
INSERT INTO api_keys (id, revoked, revoked_ms) VALUES (?, 1, ?)
ON CONFLICT (id) DO UPDATE SET
    revoked = 1,
    revoked_ms = MIN(COALESCE(api_keys.revoked_ms, excluded.revoked_ms), excluded.revoked_ms)
"""
_MODEL = """
INSERT INTO model_masters (name, runtime, defaults, deleted, clock, writer, idx)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET
    runtime = excluded.runtime, defaults = excluded.defaults, deleted = excluded.deleted,
    clock = excluded.clock, writer = excluded.writer, idx = excluded.idx
WHERE (excluded.clock, excluded.writer, excluded.idx)
      > (model_masters.clock, model_masters.writer, model_masters.idx)
"""
# MIN(a, cap - b) + b == MIN(a + b, cap) without ever computing an overflowing a + b.
_USAGE = """
INSERT INTO token_usage (key_id, model, day, prompt, completion, total, audio_ms, requests)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (key_id, model, day) DO UPDATE SET
""" + ",\n".join(
    f"    {c} = MIN(token_usage.{c}, {_MAX_INT} - excluded.{c}) + excluded.{c}"
    for c in ("prompt", "completion", "total", "audio_ms", "requests")
)
_KEY_USED = """
INSERT INTO key_last_used (key_id, at_ms) VALUES (?, ?)
ON CONFLICT (key_id) DO UPDATE SET at_ms = MAX(key_last_used.at_ms, excluded.at_ms)
"""
_APPLIED = """
INSERT INTO applied (writer, length) VALUES (?, ?)
ON CONFLICT (writer) DO UPDATE SET length = MAX(applied.length, excluded.length)
"""

_KEY_COLUMNS = "id, team, name, secret_hash, scopes, created_ms, revoked, revoked_ms"


def _json(value: Any) -> str:
    # One canonical text per value, so equal registers are equal rows everywhere.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def _api_key(row: tuple[Any, ...]) -> ApiKey:
    id_, team, name, secret_hash, scopes, created_ms, revoked, revoked_ms = row
    return ApiKey(id_, team, name, secret_hash, tuple(json.loads(scopes)), created_ms,
                  bool(revoked), revoked_ms)


class View:
    """The SQLite view of one database; open with :meth:`open`."""

    def __init__(self, conn: sqlite3.Connection, path: str, db: bytes | None) -> None:
        self._conn = conn
        self.path = path
        self.db = db
        #: Ops skipped because they failed validation, since open or reset.
        self.skipped_ops = 0
        self._in_transaction = False

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several :meth:`apply` and :meth:`reset` calls into one commit.

        Readers on other connections see the view as before until it commits
        (a rebuild is not seen half done); an error rolls all of it back.
        """
        if self._in_transaction:  # the outer transaction commits
            yield
            return
        self._conn.execute("BEGIN")
        self._in_transaction = True
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        else:
            self._conn.execute("COMMIT")
        finally:
            self._in_transaction = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], db: bytes | None = None) -> View:
        """Open the view at ``path``, creating it if the file does not exist.

        ``db`` is the database's bootstrap key; a new view records it and an
        existing one must have been built for the same key (``None`` only
        matches a view opened with ``None``).

        Raises:
            ViewMismatch: the file belongs to another database, has another
                format version, or is not a usable view; delete and rebuild.
        """
        if db is not None and not (isinstance(db, bytes) and len(db) == _KEY_BYTES):
            raise ValueError("db must be the 32-byte bootstrap key")
        path = os.fspath(path)
        if path != ":memory:" and not path.startswith("file:"):
            private_file(path)  # every team's key inventory and usage; -wal/-shm follow
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        with _closed_on_failure(conn, path):
            conn.execute("PRAGMA journal_mode=WAL")
            # A cache rebuildable from the logs: losing the last commits on power
            # failure is fine, an fsync per apply() is not worth it.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("BEGIN IMMEDIATE")
            try:
                _prepare(conn, path, b"" if db is None else db)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return cls(conn, path, db)

    @classmethod
    def open_read_only(cls, path: str | os.PathLike[str], db: bytes | None = None) -> View:
        """Open an existing view for reading only (inspection, while a daemon owns it).

        The format version is checked; the database key only if ``db`` is given.
        Writing through the returned view fails with :class:`sqlite3.OperationalError`.

        Raises:
            ViewMismatch: as :meth:`open`.
            sqlite3.OperationalError: the file does not exist or cannot be read.
        """
        path = os.fspath(path)
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        with _closed_on_failure(conn, path):
            tables = {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            _check_meta(conn, path, tables, db)
        return cls(conn, path, db)

    @staticmethod
    def delete(path: str | os.PathLike[str]) -> None:
        """Remove a (closed) view's files, the WAL and shared-memory files included."""
        path = os.fspath(path)
        for name in (path, path + "-wal", path + "-shm"):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> View:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<View {self.path!r}>"

    # --- applying -------------------------------------------------------------

    def apply(self, entries: Iterable[tuple[EntryId, Entry]], *,
              validated: bool = False) -> int:
        """Apply every op of ``entries`` in one transaction; return how many ops were applied.

        Each entry must be applied once (the causal gate ensures it). Invalid
        ops are skipped and counted in :attr:`skipped_ops`; admin ops are
        ignored. ``applied`` grows to cover each entry's index. ``validated``:
        the caller checked every op already (our own appends), so skip it.
        """
        # Reduce the batch in Python first (LWW winner, min, max, sums per row):
        # one upsert per touched row instead of one per op, and the result does
        # not rest on executemany's row order.
        key_puts: dict[str, tuple[tuple[int, bytes, int, int], tuple[Any, ...]]] = {}
        revokes: dict[str, int] = {}
        models: dict[str, tuple[tuple[int, bytes, int, int], tuple[Any, ...]]] = {}
        usage: dict[tuple[str, str, str], list[int]] = {}
        used: dict[str, int] = {}
        lengths: dict[bytes, int] = {}
        applied = skipped = 0
        for where, entry in entries:
            writer, index = where.writer, where.index
            if lengths.get(writer, 0) <= index:
                lengths[writer] = index + 1
            for op_no, op in enumerate(entry.ops):
                name = op[0] if op else None
                if isinstance(name, str) and name in ADMIN_OPS:
                    continue
                if not validated:
                    try:
                        validate_op(op)
                    except BadEntry:
                        skipped += 1
                        continue
                applied += 1
                if name == "usage_add":
                    row = (op[1], op[2], op[3])
                    sums = usage.get(row)
                    if sums is None:
                        usage[row] = list(op[4:9])
                    else:
                        for i in range(5):
                            sums[i] += op[4 + i]
                elif name == "key_used":
                    if used.get(op[1], -1) < op[2]:
                        used[op[1]] = op[2]
                elif name == "model_put" or name == "model_delete":
                    stamp = (entry.clock, writer, index, op_no)
                    best = models.get(op[1])
                    if best is None or best[0] < stamp:
                        models[op[1]] = (stamp, op)
                elif name == "key_put":
                    stamp = (entry.clock, writer, index, op_no)
                    best = key_puts.get(op[1])
                    if best is None or best[0] < stamp:
                        key_puts[op[1]] = (stamp, op)
                else:  # key_revoke, the only name left after validation
                    old = revokes.get(op[1])
                    if old is None or op[2] < old:
                        revokes[op[1]] = op[2]

        conn = self._conn
        with self.transaction():
            if key_puts:
                conn.executemany(_KEY_PUT, [
                    (op[1], op[2], op[3], op[4], _json(list(op[5])), op[6], s[0], s[1], s[2])
                    for s, op in key_puts.values()])
            if revokes:
                conn.executemany(_KEY_REVOKE, revokes.items())
            if models:
                conn.executemany(_MODEL, [
                    (op[1], op[2], _json(op[3]), 0, s[0], s[1], s[2]) if op[0] == "model_put"
                    else (op[1], None, None, 1, s[0], s[1], s[2])
                    for s, op in models.values()])
            if usage:
                conn.executemany(_USAGE, [
                    (*row, *(min(n, _MAX_INT) for n in sums)) for row, sums in usage.items()])
            if used:
                conn.executemany(_KEY_USED, used.items())
            if lengths:
                conn.executemany(_APPLIED, lengths.items())
        self.skipped_ops += skipped
        return applied

    def applied_lengths(self) -> dict[bytes, int]:
        """How many entries of each writer the view holds (a prefix of each log)."""
        return dict(self._conn.execute("SELECT writer, length FROM applied"))

    def reset(self) -> None:
        """Empty every table but ``meta``, before re-applying everything."""
        with self.transaction():
            for table in (*_DATA_TABLES, "applied"):
                self._conn.execute(f"DELETE FROM {table}")
        self.skipped_ops = 0

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every data table, in key order (for comparing replicas)."""
        return {
            table: self._conn.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
            for table, order in _DATA_TABLES.items()
        }

    def rows(self) -> list[list[tuple[Any, ...]]]:
        """Every row of every data table (``TABLE_COLUMNS`` order), in key order: what a
        checkpoint carries."""
        return list(self.dump().values())

    def replace(self, tables: list[list[tuple[Any, ...]]], applied: dict[bytes, int]) -> None:
        """Make the view exactly ``tables`` (as :meth:`rows` gives them) holding
        ``applied`` entries of each writer: installing a checkpoint. One transaction.

        Raises:
            sqlite3.IntegrityError: the rows break the schema (a missing
                value, a key twice); nothing changed.
        """
        conn = self._conn
        with self.transaction():
            self.reset()
            for (table, columns), rows in zip(TABLE_COLUMNS.items(), tables, strict=True):
                if rows:
                    marks = ", ".join("?" * columns)
                    conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
            conn.executemany(_APPLIED, [(w, n) for w, n in applied.items() if n])

    def counts(self) -> dict[str, int]:
        """Rows per table; ``api_keys`` counts keys that were put, not bare revocations."""
        conn = self._conn
        counts = {
            table: conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            for table in _DATA_TABLES
        }
        counts["api_keys"] = conn.execute(
            "SELECT COUNT(*) FROM api_keys WHERE put_clock IS NOT NULL").fetchone()[0]
        return counts

    # --- queries --------------------------------------------------------------

    def key_by_secret(self, secret: str) -> ApiKey | None:
        """The key whose secret this is, revoked or not (the caller refuses revoked keys).

        Should two key ids carry the same secret hash, a revoked one is returned
        first: revoking a key means its secret must stop working.
        """
        digest = hash_secret(secret)
        # The index lookup compares digests in variable time; that leaks nothing
        # useful about a secret, only about its hash. The final check is constant-time.
        row = self._conn.execute(
            f"SELECT {_KEY_COLUMNS} FROM api_keys"
            " WHERE secret_hash = ? AND put_clock IS NOT NULL"
            " ORDER BY revoked DESC, id LIMIT 1", (digest,)).fetchone()
        if row is None or not hmac.compare_digest(row[3], digest):
            return None
        return _api_key(row)

    def key(self, id: str) -> ApiKey | None:
        """The key ``id``; None if it was never put (even if a revocation is recorded)."""
        row = self._conn.execute(
            f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ? AND put_clock IS NOT NULL",
            (id,)).fetchone()
        return None if row is None else _api_key(row)

    def keys_of_team(self, team: str) -> list[ApiKey]:
        """The team's keys, revoked ones included, by id."""
        rows = self._conn.execute(
            f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE team = ? AND put_clock IS NOT NULL"
            " ORDER BY id", (team,))
        return [_api_key(row) for row in rows]

    def model(self, name: str) -> ModelMaster | None:
        """The model ``name``; None if unknown or deleted."""
        row = self._conn.execute(
            "SELECT name, runtime, defaults FROM model_masters WHERE name = ? AND deleted = 0",
            (name,)).fetchone()
        return None if row is None else ModelMaster(row[0], row[1], json.loads(row[2]))

    def models(self) -> list[ModelMaster]:
        """Every model not deleted, by name."""
        rows = self._conn.execute(
            "SELECT name, runtime, defaults FROM model_masters WHERE deleted = 0 ORDER BY name")
        return [ModelMaster(name, runtime, json.loads(defaults))
                for name, runtime, defaults in rows]

    def usage(self, key_id: str, model: str | None = None, day_from: str | None = None,
              day_to: str | None = None) -> list[Usage]:
        """A key's usage rows, optionally for one model and days in ``[day_from, day_to]``.

        Sorted by day, then model. Days are ``YYYY-MM-DD``, so text order is date order.
        """
        sql = "SELECT * FROM token_usage WHERE key_id = ?"
        args: list[Any] = [key_id]
        if model is not None:
            sql += " AND model = ?"
            args.append(model)
        if day_from is not None:
            sql += " AND day >= ?"
            args.append(day_from)
        if day_to is not None:
            sql += " AND day <= ?"
            args.append(day_to)
        rows = self._conn.execute(sql + " ORDER BY day, model", args)
        return [Usage(*row) for row in rows]

    def last_used(self, key_id: str) -> int | None:
        """When the key was last used (ms), the latest any replica reported; None if never."""
        row = self._conn.execute(
            "SELECT at_ms FROM key_last_used WHERE key_id = ?", (key_id,)).fetchone()
        return None if row is None else row[0]


def _raise_unreadable(path: str, exc: sqlite3.DatabaseError) -> None:
    # Only a damaged or foreign file means "rebuild"; a locked or missing one does not.
    if getattr(exc, "sqlite_errorname", None) in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        raise ViewMismatch(f"{path}: not a readable view ({exc})", code="UNREADABLE") from exc


@contextlib.contextmanager
def _closed_on_failure(conn: sqlite3.Connection, path: str) -> Iterator[None]:
    """Close ``conn`` if opening fails; a file that is not a view becomes ViewMismatch."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        conn.close()
        _raise_unreadable(path, exc)
        raise
    except BaseException:
        conn.close()
        raise


def _prepare(conn: sqlite3.Connection, path: str, db: bytes) -> None:
    tables = {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.executemany("INSERT INTO meta (k, v) VALUES (?, ?)",
                         [("format", FORMAT_VERSION), ("db", db)])
        return
    _check_meta(conn, path, tables, db)


def _check_meta(conn: sqlite3.Connection, path: str, tables: set[str],
                db: bytes | None) -> None:
    """Refuse a file that is not a view of this format for ``db`` (None: any db)."""
    if "meta" not in tables:
        raise ViewMismatch(f"{path}: an SQLite file but not a view", code="BAD_FORMAT")
    meta = dict(conn.execute("SELECT k, v FROM meta"))
    if meta.get("format") != FORMAT_VERSION:
        raise ViewMismatch(
            f"{path}: view format {meta.get('format')!r}, this code reads {FORMAT_VERSION}",
            code="BAD_FORMAT")
    if db is not None and meta.get("db") != db:
        raise ViewMismatch(f"{path}: the view was built for another database",
                           code="OTHER_DB")
