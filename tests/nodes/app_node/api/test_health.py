"""``GET /api/health`` and ``/api/health/history`` over a prober of fake services and an
in-memory store: states now, the overall status, the last hour's uptime and
buckets, the history's filters and bounds; operators only; 503 without a prober
or while its store fails."""

from __future__ import annotations

import pytest

from nodes.app_node.health import HealthProber, app_node_target

from ..health.fakes import FakeService, MemoryHealthStore
from .apis import Api, bearer


@pytest.fixture
def services(api: Api) -> tuple[FakeService, FakeService, MemoryHealthStore]:
    ork, monitor, store = FakeService("wrk-ork", 0.0), FakeService("wrk-monitor", 0.0), \
        MemoryHealthStore()
    api.services.health = HealthProber(store, [ork.target, monitor.target,
                                               app_node_target()],
                                       interval_s=15.0, timeout_s=1.0, clock=api.clock)
    return ork, monitor, store


async def rounds(api: Api, n: int) -> None:
    assert api.services.health is not None
    for _ in range(n):
        await api.services.health.run_once()
        api.clock.now += 15.0


async def test_health_now_shows_each_service_and_the_overall_status(api: Api, services) -> None:
    ork, monitor, _ = services
    token = await api.signup()
    r = await api.client.get("/api/health", headers=bearer(token))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "unknown" and body["interval_s"] == 15.0
    assert [(s["service"], s["state"], s["last"]) for s in body["services"]] == [
        ("wrk-ork", "unknown", None), ("wrk-monitor", "unknown", None),
        ("app-node", "unknown", None)]

    await rounds(api, 3)
    ork.mode = "gone"  # the connection broke (a hang is the prober's test: no real waits)
    monitor.mode = "refuse"
    await rounds(api, 1)
    api.clock.now -= 15.0  # ask right after the last round
    body = (await api.client.get("/api/health", headers=bearer(token))).json()
    assert body["status"] == "degraded" and body["at"] == api.clock.now
    by = {s["service"]: s for s in body["services"]}
    assert by["wrk-ork"]["state"] == "down" and by["wrk-monitor"]["state"] == "error"
    assert by["app-node"]["state"] == "up"
    last = by["wrk-ork"]["last"]
    assert set(last) == {"at", "service", "reachable", "version", "queue_depth",
                         "last_report_at", "latency_ms", "error", "details"}
    assert last["reachable"] is False and last["error"].startswith("CHANNEL_CLOSED")
    hour = by["wrk-ork"]["last_hour"]
    assert (hour["probes"], hour["up"], hour["down"]) == (4, 3, 1)
    assert hour["uptime"] == 0.75 and len(hour["buckets"]) == 12
    assert hour["buckets"][-1] == 0.75 and hour["buckets"][0] is None

    ork.mode = monitor.mode = "up"
    api.clock.now += 15.0
    await rounds(api, 1)
    api.clock.now -= 15.0
    body = (await api.client.get("/api/health", headers=bearer(token))).json()
    assert body["status"] == "ok"

    api.clock.now += 600  # the prober stopped: its rows go stale
    body = (await api.client.get("/api/health", headers=bearer(token))).json()
    assert body["status"] == "degraded"
    assert {s["state"] for s in body["services"]} == {"stale"}


async def test_history_filters_by_service_and_window_and_bounds_rows(api: Api,
                                                                     services) -> None:
    token = await api.signup()
    await rounds(api, 8)  # 24 rows over 2 minutes
    r = await api.client.get("/api/health/history", headers=bearer(token))
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["rows"]) == 24 and body["truncated"] is False
    assert body["until"] == api.clock.now and body["since"] == api.clock.now - 3600
    ats = [row["at"] for row in body["rows"]]
    assert ats == sorted(ats)

    ork = (await api.client.get("/api/health/history", params={"service": "wrk-ork"},
                                headers=bearer(token))).json()
    assert {row["service"] for row in ork["rows"]} == {"wrk-ork"} and len(ork["rows"]) == 8
    recent = (await api.client.get("/api/health/history",
                                   params={"service": "wrk-ork", "since": "50"},
                                   headers=bearer(token))).json()
    assert len(recent["rows"]) == 3  # at now-45, -30, -15
    few = (await api.client.get("/api/health/history", params={"limit": "5"},
                                headers=bearer(token))).json()
    assert len(few["rows"]) == 5 and few["truncated"] is True
    assert few["rows"][-1]["at"] == ats[-1]  # the newest kept
    old = (await api.client.get("/api/health/history", params={"since": "30d"},
                                headers=bearer(token))).json()
    assert old["since"] == api.clock.now - 86400  # never past the retention

    for params, field in [({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"),
                          ({"since": "yesterday"}, "since"), ({"service": "x" * 65}, "service")]:
        r = await api.client.get("/api/health/history", params=params, headers=bearer(token))
        assert r.status_code == 422 and r.json()["error"]["field"] == field, params


async def test_health_is_for_operators_only(api: Api, services) -> None:
    admin = await api.signup()
    store = api.services.store
    [(team, _)] = store.teams.of_user(store.users.by_email("admin@example.com").id)
    member = await api.user("m@example.com", team.id, "member", admin)
    for path in ("/api/health", "/api/health/history"):
        r = await api.client.get(path, headers=bearer(member))
        assert r.status_code == 403 and "platform operators" in r.json()["error"]["message"]


async def test_without_a_prober_or_with_its_store_down_health_is_503(api: Api) -> None:
    token = await api.signup()
    for path in ("/api/health", "/api/health/history"):
        r = await api.client.get(path, headers=bearer(token))
        assert r.status_code == 503 and r.json()["error"]["code"] == "HEALTH_UNAVAILABLE"
    store = MemoryHealthStore()
    api.services.health = HealthProber(store, [app_node_target()], clock=api.clock)
    store.failing = True
    for path in ("/api/health", "/api/health/history"):
        r = await api.client.get(path, headers=bearer(token))
        assert r.status_code == 503 and "told to fail" in r.json()["error"]["message"]
