"""app-node's ``observability`` settings: read from the environment with the
daemon's prefix, bad URLs named by key, a clear when unset; and in-process,
app-node tells the wrk-monitor it connects to its Loki and Prometheus, and once
restarted without them makes it forget them (its own settings, else no Loki);
a wrk-monitor too old to clear costs app-node nothing but a warning."""

from __future__ import annotations

import logging

import pydantic
import pytest
import trio

from contracts.health import STATUS, StatusRequest
from contracts.monitor import PROTOCOL as MONITOR
from contracts.monitor import Observability
from nodes.app_node.daemon import serve_app_node
from nodes.app_node.settings import ApiHttpSettings, AppNodeSettings
from nodes.kit.monitor_client import MonitorClient
from nodes.monitor.daemon import RunningMonitor, serve_monitor
from nodes.monitor.observability import OBSERVABILITY_FILE
from nodes.monitor.settings import MonitorSettings
from p2p.host import RpcService
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.rpc import Router, RpcError
from p2p.swarm import Swarm, SwarmConfig, UpkeepPolicy
from tests.p2p.helpers import wait_until


def test_observability_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("COSMICAC_APP_NODE__OBSERVABILITY__LOKI_URL", "http://loki:3100")
    monkeypatch.setenv("COSMICAC_APP_NODE__OBSERVABILITY__LOKI_TENANT", "team-a")
    monkeypatch.setenv("COSMICAC_APP_NODE__OBSERVABILITY__PROMETHEUS_URL", "https://prom")
    settings = AppNodeSettings(storage=tmp_path)
    assert settings.observability.to_send() == Observability(
        loki_url="http://loki:3100", loki_tenant="team-a", prometheus_url="https://prom")


def test_unset_is_a_clear_and_a_bad_url_names_its_key(tmp_path):
    unset = AppNodeSettings(storage=tmp_path).observability
    assert unset.to_send() == Observability() and not unset.configured
    only_prometheus = AppNodeSettings(storage=tmp_path,
                                      observability={"prometheus_url": "http://p:9090"})
    assert only_prometheus.observability.configured
    with pytest.raises(pydantic.ValidationError) as caught:
        AppNodeSettings(storage=tmp_path, observability={"loki_url": "loki:3100"})
    assert "observability.loki_url" in str(caught.value)


@pytest.mark.slow
async def test_app_node_gives_wrk_monitor_its_loki_and_prometheus(tmp_path):
    app_key = load_or_create_keypair(tmp_path / "app-node")
    (tmp_path / "monitor").mkdir()
    monitor_settings = MonitorSettings(
        storage=tmp_path / "monitor", host="127.0.0.1", port=0,
        followers=[app_key.public_key.hex()], http={"host": "127.0.0.1", "port": 0})
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            monitor: RunningMonitor = await nursery.start(serve_monitor, monitor_settings)
            app_settings = AppNodeSettings(
                storage=tmp_path / "app-node", host="127.0.0.1", port=0, fsync=False,
                http=ApiHttpSettings(host="127.0.0.1", port=0),
                monitor=monitor.swarm.keypair.public_key.hex(),
                monitor_addresses=[f"127.0.0.1:{monitor.swarm_address[1]}"],
                telemetry={"ship": False},
                observability={"loki_url": "http://127.0.0.1:9/loki",
                               "prometheus_url": "http://127.0.0.1:9/prom"})
            await nursery.start(serve_app_node, app_settings)
            await wait_until(lambda: monitor.observability.state().origin == "app-node",
                             limit_s=30)
            state = monitor.observability.state()
            assert (state.loki, state.loki_url, state.prometheus_url) == (
                True, "http://127.0.0.1:9/loki", "http://127.0.0.1:9/prom")
            nursery.cancel_scope.cancel()


@pytest.mark.slow
@pytest.mark.parametrize("own_loki", [None, "http://127.0.0.1:9/own"])
async def test_app_node_restarted_without_loki_makes_wrk_monitor_forget_it(tmp_path, own_loki):
    app_key = load_or_create_keypair(tmp_path / "app-node")
    (tmp_path / "monitor").mkdir()
    monitor_settings = MonitorSettings(
        storage=tmp_path / "monitor", host="127.0.0.1", port=0,
        followers=[app_key.public_key.hex()], http={"host": "127.0.0.1", "port": 0},
        loki={"url": own_loki})
    path = tmp_path / "monitor" / OBSERVABILITY_FILE
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            monitor: RunningMonitor = await nursery.start(serve_monitor, monitor_settings)

            def app_settings(**observability) -> AppNodeSettings:
                return AppNodeSettings(
                    storage=tmp_path / "app-node", host="127.0.0.1", port=0, fsync=False,
                    http=ApiHttpSettings(host="127.0.0.1", port=0),
                    monitor=monitor.swarm.keypair.public_key.hex(),
                    monitor_addresses=[f"127.0.0.1:{monitor.swarm_address[1]}"],
                    telemetry={"ship": False}, observability=observability)

            # Its own nursery: leaving it waits until the first app-node has closed
            # its storage (a cancel alone returns while it still unwinds).
            async with trio.open_nursery() as first:
                await first.start(serve_app_node,
                                  app_settings(loki_url="http://127.0.0.1:9/sent"))
                await wait_until(lambda: monitor.observability.state().origin == "app-node",
                                 limit_s=30)
                assert monitor.observability.state().loki_url == "http://127.0.0.1:9/sent"
                assert path.exists()
                first.cancel_scope.cancel()
            # The operator removed observability.loki_url: app-node clears it.
            await nursery.start(serve_app_node, app_settings())
            expected = "settings" if own_loki else "none"
            await wait_until(lambda: monitor.observability.state().origin == expected,
                             limit_s=30)
            state = monitor.observability.state()
            assert (state.loki, state.loki_url, state.persisted) == (
                own_loki is not None, own_loki, False)
            pusher = monitor.observability.pusher
            assert (None if pusher is None else pusher.safe_url) == own_loki
            assert not path.exists()
            nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_wrk_monitor_too_old_to_clear_keeps_the_connection(caplog):
    caplog.set_level(logging.INFO, logger="nodes.kit.monitor_client")
    fast = UpkeepPolicy(base_s=0.05, max_s=0.2, dial_timeout_s=2.0)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            old = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", port=0),
                        services=[RpcService(MONITOR, Router())])
            address = await nursery.start(old.run)
            swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", port=0))
            await nursery.start(swarm.run)
            client = MonitorClient(swarm, old.keypair.public_key, addresses=[address],
                                   observability=Observability(), backoff=fast)
            await nursery.start(client.run)
            await wait_until(lambda: "observability_not_cleared" in caplog.text, limit_s=20)
            with pytest.raises(RpcError) as caught:  # still connected: it answers
                await client.call(STATUS, StatusRequest(), timeout_s=5)
            assert caught.value.code == "UNKNOWN_METHOD"
            assert client.connected and client.connections == 1
            assert client.observability_state is None
            nursery.cancel_scope.cancel()
