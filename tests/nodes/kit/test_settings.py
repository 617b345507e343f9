"""The kit's shared settings, as each daemon reads them: every name keeps working."""

from __future__ import annotations

import pytest

from nodes.app_node.settings import APP_NODE_HTTP_PORT, APP_NODE_PORT, AppNodeSettings
from nodes.kit.settings import HttpSettings, PeerRef, PeerSettings, peer_ref
from nodes.monitor.settings import MONITOR_HTTP_PORT, MONITOR_PORT, MonitorSettings
from nodes.ork.settings import ORK_PORT, OrkSettings
from nodes.proxy_inference.settings import HTTP_PORT, PROXY_PORT, ProxySettings
from p2p.daemon import ConfigError, load_settings

KEY = "ab" * 32
OTHER = "cd" * 32

#: Each daemon that is a plain peer: its settings, its prefix, its default port.
PEERS = [(OrkSettings, "COSMICAC_ORK__", ORK_PORT),
         (AppNodeSettings, "COSMICAC_APP_NODE__", APP_NODE_PORT),
         (MonitorSettings, "COSMICAC_MONITOR__", MONITOR_PORT),
         (ProxySettings, "COSMICAC_PROXY__", PROXY_PORT)]


@pytest.mark.parametrize(("model", "prefix", "port"), PEERS,
                         ids=[model.__name__ for model, _, _ in PEERS])
def test_each_daemons_peer_keys_read_from_its_environment_as_before(tmp_path, model,
                                                                     prefix, port):
    assert issubclass(model, PeerSettings)
    defaults = load_settings(model, environ={f"{prefix}STORAGE": str(tmp_path)})
    assert (defaults.host, defaults.port, defaults.bootstrap, defaults.relays,
            defaults.announce_addresses) == ("0.0.0.0", port, (), (), None)
    given = load_settings(model, environ={
        f"{prefix}STORAGE": str(tmp_path), f"{prefix}HOST": "127.0.0.1",
        f"{prefix}PORT": "4000", f"{prefix}BOOTSTRAP": '["127.0.0.1:49738"]',
        f"{prefix}RELAYS": f'["{KEY}"]', f"{prefix}ANNOUNCE_ADDRESSES": "10.0.0.1:4000"})
    assert given.storage == tmp_path
    assert (given.host, given.port) == ("127.0.0.1", 4000)
    assert given.bootstrap == (("127.0.0.1", 49738),)
    assert given.relays == (bytes.fromhex(KEY),)
    assert given.announce_addresses == (("10.0.0.1", 4000),)


@pytest.mark.parametrize(("model", "prefix", "port"), PEERS,
                         ids=[model.__name__ for model, _, _ in PEERS])
def test_a_daemon_without_storage_names_its_variable(model, prefix, port):
    with pytest.raises(ConfigError) as caught:
        load_settings(model, environ={})
    assert caught.value.key == "storage"
    assert f"{prefix}STORAGE" in str(caught.value)


def test_the_peer_keys_read_from_a_config_file_as_before(tmp_path):
    config = tmp_path / "ork.toml"
    config.write_text(f'storage = "{tmp_path}"\nhost = "127.0.0.1"\nport = 4001\n'
                      f'bootstrap = ["127.0.0.1:49738"]\nrelays = ["{KEY}"]\n')
    settings = load_settings(OrkSettings, config_file=config)
    assert (settings.host, settings.port, settings.relays) == (
        "127.0.0.1", 4001, (bytes.fromhex(KEY),))


HTTP = [(AppNodeSettings, "COSMICAC_APP_NODE__", APP_NODE_HTTP_PORT),
        (MonitorSettings, "COSMICAC_MONITOR__", MONITOR_HTTP_PORT),
        (ProxySettings, "COSMICAC_PROXY__", HTTP_PORT)]


@pytest.mark.parametrize(("model", "prefix", "port"), HTTP,
                         ids=[model.__name__ for model, _, _ in HTTP])
def test_each_http_side_is_the_kits_with_its_own_default_port(tmp_path, model, prefix, port):
    defaults = load_settings(model, environ={f"{prefix}STORAGE": str(tmp_path)})
    assert isinstance(defaults.http, HttpSettings)
    assert (defaults.http.host, defaults.http.port) == ("127.0.0.1", port)
    given = load_settings(model, environ={f"{prefix}STORAGE": str(tmp_path),
                                          f"{prefix}HTTP__HOST": "0.0.0.0",
                                          f"{prefix}HTTP__PORT": "8080"})
    assert (given.http.host, given.http.port) == ("0.0.0.0", 8080)
    with pytest.raises(ConfigError) as caught:
        load_settings(model, environ={f"{prefix}STORAGE": str(tmp_path),
                                      f"{prefix}HTTP__PORTS": "8080"})
    assert caught.value.key == "http.ports"


def test_each_http_side_keeps_its_own_fields(tmp_path):
    app = load_settings(AppNodeSettings, environ={
        "COSMICAC_APP_NODE__STORAGE": str(tmp_path),
        "COSMICAC_APP_NODE__HTTP__BODY__MAX_JSON_DEPTH": "8"})
    assert app.http.body.max_json_depth == 8
    monitor = load_settings(MonitorSettings, environ={
        "COSMICAC_MONITOR__STORAGE": str(tmp_path),
        "COSMICAC_MONITOR__HTTP__TOKEN": "t" * 20,
        "COSMICAC_MONITOR__HTTP__MAX_FOLLOWERS": "3"})
    assert (monitor.http.token, monitor.http.max_followers) == ("t" * 20, 3)
    proxy = load_settings(ProxySettings, environ={
        "COSMICAC_PROXY__STORAGE": str(tmp_path),
        "COSMICAC_PROXY__HTTP__BODY_TIMEOUT_S": "5"})
    assert proxy.http.body_timeout_s == 5.0
    # One daemon's field is no setting of another's HTTP side.
    with pytest.raises(ConfigError) as caught:
        load_settings(ProxySettings, environ={"COSMICAC_PROXY__STORAGE": str(tmp_path),
                                              "COSMICAC_PROXY__HTTP__TOKEN": "t" * 20})
    assert caught.value.key == "http.token"


def test_a_peer_ref_is_built_from_the_flat_pair(tmp_path):
    settings = load_settings(AppNodeSettings, environ={
        "COSMICAC_APP_NODE__STORAGE": str(tmp_path), "COSMICAC_APP_NODE__ORK": KEY,
        "COSMICAC_APP_NODE__ORK_ADDRESSES": "127.0.0.1:49740"})
    assert settings.ork_peer == PeerRef(bytes.fromhex(KEY), (("127.0.0.1", 49740),))
    assert peer_ref(settings, "ork") == settings.ork_peer
    assert settings.monitor_peer is None  # unset: the daemon runs without it
    with_monitor = settings.model_copy(update={"monitor": bytes.fromhex(OTHER)})
    assert with_monitor.monitor_peer == PeerRef(bytes.fromhex(OTHER), ())


def test_telemetry_names_its_monitor_as_a_peer_ref():
    from nodes.kit.telemetry import TelemetrySettings

    assert TelemetrySettings().monitor_peer is None  # telemetry off
    on = TelemetrySettings(monitor=KEY, monitor_addresses=["127.0.0.1:49743"])
    assert on.monitor_peer == PeerRef(bytes.fromhex(KEY), (("127.0.0.1", 49743),))
