"""The SQLite helper the daemon stores share: connect, immediate, migrate."""

from __future__ import annotations

import sqlite3

import pytest

from nodes.kit.sqlite import (
    USER_VERSION,
    NotThisStore,
    Schema,
    SchemaTooNew,
    connect,
    immediate,
    migrate,
)

V1 = "CREATE TABLE t (a INTEGER)"
LADDER = Schema(create="CREATE TABLE t (a INTEGER, b TEXT); CREATE TABLE u (c INTEGER)",
                upgrades=("ALTER TABLE t ADD COLUMN b TEXT", "CREATE TABLE u (c INTEGER)"))


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def test_a_file_is_opened_with_wal_and_the_synchronous_level_asked(tmp_path) -> None:
    conn = connect(tmp_path / "s.sqlite", synchronous="NORMAL", foreign_keys=True)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert not conn.in_transaction  # autocommit: transactions are explicit
    conn.close()


def test_a_fresh_file_is_created_at_the_newest_version() -> None:
    conn = connect(None)
    assert migrate(conn, LADDER) == 0
    assert USER_VERSION.read(conn) == LADDER.version == 3
    assert _columns(conn, "t") == ["a", "b"] and _columns(conn, "u") == ["c"]


def test_an_old_file_climbs_each_step_of_the_ladder() -> None:
    conn = connect(None)
    conn.execute(V1)
    USER_VERSION.write(conn, 1)
    assert migrate(conn, LADDER) == 1
    assert USER_VERSION.read(conn) == 3
    assert _columns(conn, "t") == ["a", "b"] and _columns(conn, "u") == ["c"]
    assert migrate(conn, LADDER) == 3  # nothing left to do


def test_a_failed_step_leaves_the_file_at_the_last_step_that_finished() -> None:
    conn = connect(None)
    conn.execute(V1)
    USER_VERSION.write(conn, 1)

    def fails(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half (x)")
        raise sqlite3.OperationalError("disk full")

    with pytest.raises(sqlite3.OperationalError, match="disk full"):
        migrate(conn, Schema(create="", upgrades=(LADDER.upgrades[0], fails)))
    assert USER_VERSION.read(conn) == 2 and _columns(conn, "t") == ["a", "b"]
    assert _columns(conn, "half") == []  # rolled back with its step


def test_a_newer_file_is_refused_with_both_versions() -> None:
    conn = connect(None)
    USER_VERSION.write(conn, 7)
    with pytest.raises(SchemaTooNew) as info:
        migrate(conn, LADDER)
    assert (info.value.found, info.value.supported, info.value.code) == (7, 3, "schema_too_new")


def test_an_unversioned_file_with_tables_is_refused_unless_adopted() -> None:
    conn = connect(None)
    conn.execute("CREATE TABLE IF NOT EXISTS t (a INTEGER)")
    with pytest.raises(NotThisStore):
        migrate(conn, LADDER)
    assert migrate(conn, Schema(create="CREATE TABLE IF NOT EXISTS t (a INTEGER)",
                                adopt_unversioned=True)) == 0
    assert USER_VERSION.read(conn) == 1


def test_an_immediate_transaction_commits_or_writes_nothing() -> None:
    conn = connect(None)
    conn.execute("CREATE TABLE t (a INTEGER)")
    with immediate(conn):
        conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(ValueError), immediate(conn):
        conn.execute("INSERT INTO t VALUES (2)")
        raise ValueError("refused")
    assert conn.execute("SELECT a FROM t").fetchall() == [(1,)]
    assert not conn.in_transaction
