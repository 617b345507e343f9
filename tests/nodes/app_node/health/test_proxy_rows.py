"""Each proxy is a row of its own in app-node's health history, as wrk-monitor hears
it: over the real RPC protocol (in memory, autojump clock) a proxy that pushes its
metrics is up, silent past ``proxy_fresh_s`` down, past ``proxy_forget_s`` no longer
watched (its rows stay history); a wrk-monitor too old to list its senders gives no
proxy rows, a garbled listing fails the source (the last set goes stale)."""

from __future__ import annotations

import logging

import pydantic
import pytest
import trio

from contracts.health import STATUS, StatusRequest, service_status
from contracts.monitor import METRICS_PUSH, MetricsReport
from nodes.app_node.health import (
    PROXY_FORGET_S,
    PROXY_FRESH_S,
    HealthProber,
    HealthSettings,
    app_node_target,
    proxies_source,
    proxy_row,
)
from nodes.kit.reporter import DEFAULT_INTERVAL_S as PROXY_REPORT_INTERVAL_S
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from tests.nodes.monitor.support import connect

from .fakes import MemoryHealthStore, WallClock

PROXY = b"\x01" * 32
OTHER_PROXY = b"\xab" * 32
APP_NODE = b"\x03" * 32


class MonitorOverRpc:
    """What the proxies source calls of app-node's MonitorClient, on an RPC client."""

    def __init__(self, client) -> None:
        self.client = client

    async def status(self, *, timeout_s: float | None = None):
        return await self.client.call(STATUS, StatusRequest())


class FakeMonitor:
    """A wrk-monitor answering ``service.status`` with the given details."""

    def __init__(self, details: dict) -> None:
        self.details = details

    async def status(self, *, timeout_s: float | None = None):
        return service_status("wrk-monitor", started_at=1.0, details=self.details)


def test_the_defaults_follow_the_proxys_report_interval():
    assert PROXY_FRESH_S == 3 * PROXY_REPORT_INTERVAL_S == 15.0
    settings = HealthSettings()
    assert (settings.proxy_fresh_s, settings.proxy_forget_s) == (PROXY_FRESH_S, PROXY_FORGET_S)
    with pytest.raises(pydantic.ValidationError, match="proxy_forget_s"):
        HealthSettings(proxy_fresh_s=600, proxy_forget_s=300)


def test_a_proxy_row_is_up_while_fresh_down_after_and_gone_past_the_bound():
    at = 1_800_000_000.0
    up = proxy_row(("0123456789abcdef", 4.0), at)
    assert (up.service, up.up, up.last_report_at, up.version) == (
        "proxy-inference 0123456789ab", True, at - 4.0, None)
    assert up.details == {"key": "0123456789abcdef", "age_s": 4.0}
    down = proxy_row(("0123456789abcdef", 40.0), at, fresh_s=15.0)
    assert not down.reachable and down.error == (
        "silent for 40 s: no metrics report to wrk-monitor within 15 s")
    assert proxy_row(("0123456789abcdef", 3601.0), at, forget_s=3600.0) is None


async def test_each_proxy_is_a_row_as_wrk_monitor_hears_it(nursery, autojump_clock):
    monitor = MonitorService(LogBuffer(), proxies=[PROXY, OTHER_PROXY], followers=[APP_NODE],
                             clock=trio.current_time)
    store = MemoryHealthStore()
    async with (connect(nursery, monitor, PROXY) as proxy,
                connect(nursery, monitor, OTHER_PROXY) as other,
                connect(nursery, monitor, APP_NODE) as app_node):
        source = proxies_source(MonitorOverRpc(app_node), fresh_s=15.0, forget_s=600.0)
        prober = HealthProber(store, [app_node_target()], sources=[source], interval_s=15.0,
                              timeout_s=5.0, clock=WallClock())
        with trio.fail_after(3600):
            rows = await prober.run_once()
            assert [r.service for r in rows] == ["app-node"]  # no proxy reported yet
            await other.call(METRICS_PUSH, MetricsReport(window_s=60))
            await proxy.call(METRICS_PUSH, MetricsReport(window_s=60))
            rows = {r.service: r for r in await prober.run_once()}
            # Key order, whichever reported last.
            assert prober.services == ("app-node", "proxy-inference 010101010101",
                                       "proxy-inference abababababab")
            first = rows["proxy-inference 010101010101"]
            assert first.up and first.last_report_at == pytest.approx(first.at, abs=0.1)
            # The other keeps reporting; the first falls silent.
            for _ in range(4):
                await trio.sleep(5)
                await other.call(METRICS_PUSH, MetricsReport(window_s=60))
            rows = {r.service: r for r in await prober.run_once()}
            silent = rows["proxy-inference 010101010101"]
            assert not silent.reachable and silent.error.startswith("silent for 20 s")
            assert silent.last_report_at == pytest.approx(first.at, abs=0.1)
            assert rows["proxy-inference abababababab"].up
            # Silent past proxy_forget_s: no longer watched, its rows stay history.
            await trio.sleep(600)
            await other.call(METRICS_PUSH, MetricsReport(window_s=60))
            rows = {r.service: r for r in await prober.run_once()}
            assert prober.services == ("app-node", "proxy-inference abababababab")
            assert list(rows) == ["app-node", "proxy-inference abababababab"]
            assert sum(r.service == "proxy-inference 010101010101" for r in store.rows) == 2


async def test_an_older_wrk_monitor_gives_no_proxy_rows_and_a_garbled_one_fails(
        autojump_clock, caplog):
    caplog.set_level(logging.INFO, logger="nodes.app_node.health._prober")
    old = FakeMonitor({"metrics_senders": 2})
    prober = HealthProber(MemoryHealthStore(), [], sources=[proxies_source(old)],
                          interval_s=15.0, timeout_s=5.0, clock=WallClock())
    for _ in range(2):
        assert await prober.run_once() == []
    assert caplog.text.count("health.no_proxy_rows") == 1
    old.details = {"metrics_sender_ages": "0101010101010101:1.0"}
    assert [r.service for r in await prober.run_once()] == ["proxy-inference 010101010101"]
    old.details = {"metrics_sender_ages": "not a listing"}
    assert await prober.run_once() == []
    assert "health.source_failed source=proxies" in caplog.text
    assert prober.services == ("proxy-inference 010101010101",)  # kept: it goes stale


async def test_app_nodes_prober_watches_the_proxies_when_wrk_monitor_is_set(tmp_path):
    from types import SimpleNamespace

    from nodes.app_node.health import build_prober

    monitor = FakeMonitor({})
    monitor.peer = "wrk-monitor"
    database = SimpleNamespace(db=None, replicator=None)
    settings = HealthSettings(proxy_fresh_s=30, proxy_forget_s=120)
    for given, sources in [(monitor, ["proxies"]), (None, [])]:
        prober = build_prober(settings, tmp_path, None, ork=None, monitor=given,
                              database=database, email=None)
        try:
            assert [s.name for s in prober.sources] == sources
        finally:
            await prober.store.aclose()
