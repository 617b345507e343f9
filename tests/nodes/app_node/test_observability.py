"""app-node's ``observability`` settings: read from the environment with the
daemon's prefix, bad URLs named by key, nothing sent when unset; and in-process,
app-node tells the wrk-monitor it connects to its Loki and Prometheus."""

from __future__ import annotations

import pydantic
import pytest
import trio

from contracts.telemetry import Observability
from nodes.app_node.daemon import serve_app_node
from nodes.app_node.settings import AppNodeSettings, HttpSettings
from nodes.monitor.daemon import RunningMonitor, serve_monitor
from nodes.monitor.settings import MonitorSettings
from p2p.keys import load_or_create_keypair
from tests.p2p.helpers import wait_until


def test_observability_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("COSMICAC_APP_NODE__OBSERVABILITY__LOKI_URL", "http://loki:3100")
    monkeypatch.setenv("COSMICAC_APP_NODE__OBSERVABILITY__LOKI_TENANT", "team-a")
    monkeypatch.setenv("COSMICAC_APP_NODE__OBSERVABILITY__PROMETHEUS_URL", "https://prom")
    settings = AppNodeSettings(storage=tmp_path)
    assert settings.observability.to_send() == Observability(
        loki_url="http://loki:3100", loki_tenant="team-a", prometheus_url="https://prom")


def test_nothing_is_sent_when_unset_and_a_bad_url_names_its_key(tmp_path):
    assert AppNodeSettings(storage=tmp_path).observability.to_send() is None
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
                http=HttpSettings(host="127.0.0.1", port=0),
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
