"""Both health stores pass the same tests: SQLite in a temp file and Redis on a real
redis-server (started as the rate-limit tests start it; skipped only when it is
not installed and CI is unset)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from contracts.health import service_status
from nodes.app_node.health import (
    HEALTH_FILE,
    HealthRow,
    HealthSettings,
    HealthStore,
    HealthStoreError,
    RedisHealthStore,
    SqliteHealthStore,
    answered,
    not_answered,
    open_health_store,
)

from ..redis_server import RedisServer, needs_redis


def row(service: str, at: float, up: bool = True, depth: int = 0) -> HealthRow:
    if up:
        return answered(service_status(service, started_at=1.0, queue_depth=depth,
                                       details={"racks": 1}),
                        service=service, at=at, latency_ms=2.0)
    return not_answered(service, at=at, latency_ms=None, error="OrkUnavailable: gone")


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=needs_redis)])
async def store(request, tmp_path: Path) -> AsyncIterator[HealthStore]:
    if request.param == "sqlite":
        opened: HealthStore = await trio.to_thread.run_sync(
            SqliteHealthStore.open, tmp_path / HEALTH_FILE)
        yield opened
        await opened.aclose()
        return
    server = RedisServer(tmp_path)
    await trio.to_thread.run_sync(server.start)
    try:
        opened = RedisHealthStore(server.url)
        yield opened
        await opened.aclose()
    finally:
        server.stop()


async def test_latest_is_each_services_newest_row(store: HealthStore) -> None:
    assert await store.latest() == {}
    await store.add([row("wrk-ork", 10.0), row("database", 10.0)])
    await store.add([row("wrk-ork", 25.0, up=False), row("database", 25.0, depth=3)])
    latest = await store.latest()
    assert set(latest) == {"wrk-ork", "database"}
    assert latest["wrk-ork"] == row("wrk-ork", 25.0, up=False)
    assert latest["database"].queue_depth == 3 and latest["database"].details == {"racks": 1}


async def test_history_is_a_window_oldest_first_of_one_or_every_service(
        store: HealthStore) -> None:
    for i in range(10):
        await store.add([row("wrk-ork", 100.0 + 15 * i, up=i % 3 != 0),
                         row("app-node", 100.0 + 15 * i + 1)])
    ork = await store.history(130.0, 190.0, service="wrk-ork")
    assert [r.at for r in ork] == [130.0, 145.0, 160.0, 175.0, 190.0]
    assert [r.up for r in ork] == [True, False, True, True, False]
    every = await store.history(0.0, 1e9)
    assert len(every) == 20 and [r.at for r in every] == sorted(r.at for r in every)
    newest = await store.history(0.0, 1e9, limit=3)  # beyond the limit: the newest
    assert [(r.service, r.at) for r in newest] == [("app-node", 221.0), ("wrk-ork", 235.0),
                                                   ("app-node", 236.0)]
    assert await store.history(0.0, 1e9, service="nobody") == []
    assert await store.history(0.0, 1e9, limit=0) == []


async def test_prune_forgets_rows_older_than_its_cutoff(store: HealthStore) -> None:
    await store.add([row("wrk-ork", at) for at in (10.0, 20.0, 30.0)])
    await store.add([row("wrk-monitor", 5.0)])
    assert await store.prune(20.0) == 2
    assert [r.at for r in await store.history(0.0, 1e9)] == [20.0, 30.0]
    assert set(await store.latest()) == {"wrk-ork"}  # a service with no row left is gone
    assert await store.prune(0.0) == 0


async def test_two_rows_at_the_same_time_are_both_kept(store: HealthStore) -> None:
    await store.add([row("wrk-ork", 10.0, depth=1), row("wrk-ork", 10.0, depth=2)])
    assert sorted(r.queue_depth for r in await store.history(0.0, 100.0)) == [1, 2]


async def test_a_closed_sqlite_store_raises_its_own_error(tmp_path: Path) -> None:
    store = await trio.to_thread.run_sync(SqliteHealthStore.open, tmp_path / "h.sqlite")
    await store.aclose()
    await store.aclose()  # idempotent
    with pytest.raises(HealthStoreError):
        await store.add([row("wrk-ork", 1.0)])


async def test_an_unopenable_sqlite_file_says_which(tmp_path: Path) -> None:
    (tmp_path / "h.sqlite").write_bytes(b"not a database" * 100)
    with pytest.raises(HealthStoreError, match=r"h\.sqlite"):
        SqliteHealthStore.open(tmp_path / "h.sqlite")


async def test_an_unreachable_redis_raises_the_stores_error(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)  # a free port nobody listens on
    store = RedisHealthStore(server.url, timeout_s=0.2)
    try:
        for call in (store.add([row("wrk-ork", 1.0)]), store.latest(),
                     store.history(0.0, 1.0), store.prune(1.0)):
            with pytest.raises(HealthStoreError, match="Redis"):
                await call
    finally:
        await store.aclose()


def test_settings_pick_redis_when_a_url_is_given_else_the_file(tmp_path: Path) -> None:
    settings = HealthSettings()
    assert (settings.interval_s, settings.timeout_s, settings.retention_s) == \
        (15.0, 5.0, 86400.0)
    sqlite = open_health_store(settings, tmp_path, None)
    assert isinstance(sqlite, SqliteHealthStore) and (tmp_path / HEALTH_FILE).exists()
    trio.run(sqlite.aclose)
    redis_store = open_health_store(settings, tmp_path, "redis://127.0.0.1:1/0")
    assert isinstance(redis_store, RedisHealthStore)
    trio.run(redis_store.aclose)
    with pytest.raises(ValueError, match="timeout_s"):
        HealthSettings(interval_s=5.0, timeout_s=10.0)
