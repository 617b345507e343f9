"""Daemon settings: file < environment < command line, and errors that name their key."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic_settings import SettingsConfigDict

from p2p.daemon import (
    AddressList,
    ConfigError,
    DaemonSettings,
    Port,
    PublicKeyList,
    load_settings,
)

KEY = "ab" * 32
OTHER = "cd" * 32


class Interconnect(BaseModel):
    model_config = {"extra": "forbid"}
    relays: PublicKeyList = ()
    timeout_s: float = 5.0


class Settings(DaemonSettings):
    model_config = SettingsConfigDict(env_prefix="K8S_COMMON_CONFIG__")
    legacy_env = {**DaemonSettings.legacy_env, "OLD_PORT": "port"}
    port: Port = 4000
    bootstrap: AddressList = ()
    interconnect: Interconnect = Interconnect()


def test_defaults_without_file_or_environment():
    settings = load_settings(Settings, environ={})
    assert settings.port == 4000
    assert settings.metrics.port == 0 and settings.log_level == "info"
    assert settings.storage is None


def test_a_json_value_in_a_nested_key_exactly_as_the_platform_writes_it():
    # seeds/relay.txt: K8S_COMMON_CONFIG__interconnect__relays='["<relay-key>"]'
    settings = load_settings(Settings, environ={
        "K8S_COMMON_CONFIG__interconnect__relays": f'["{KEY}"]'})
    assert settings.interconnect.relays == (bytes.fromhex(KEY),)
    # comma-separated works too, and names are case-insensitive
    settings = load_settings(Settings, environ={
        "K8S_COMMON_CONFIG__INTERCONNECT__RELAYS": f"{KEY},{OTHER}"})
    assert settings.interconnect.relays == (bytes.fromhex(KEY), bytes.fromhex(OTHER))


def test_precedence_command_line_over_environment_over_file_over_defaults(tmp_path):
    config = tmp_path / "daemon.toml"
    config.write_text('port = 1\nlog_level = "debug"\n[interconnect]\ntimeout_s = 9.0\n'
                      f'relays = ["{KEY}"]\n[metrics]\nport = 9100\n')
    from_file = load_settings(Settings, config_file=config, environ={})
    assert (from_file.port, from_file.log_level, from_file.metrics.port) == (1, "debug", 9100)
    assert from_file.interconnect.relays == (bytes.fromhex(KEY),)
    env = {"K8S_COMMON_CONFIG__PORT": "2", "K8S_COMMON_CONFIG__INTERCONNECT__RELAYS": OTHER}
    from_env = load_settings(Settings, config_file=config, environ=env)
    assert from_env.port == 2
    # a nested key from the environment merges with its siblings from the file
    assert from_env.interconnect.relays == (bytes.fromhex(OTHER),)
    assert from_env.interconnect.timeout_s == 9.0
    from_cli = load_settings(Settings, config_file=config, environ=env,
                             overrides={"port": 3, "metrics.port": 9200, "log_level": None})
    assert (from_cli.port, from_cli.metrics.port) == (3, 9200)
    assert from_cli.log_level == "debug"  # None means "not given"


def test_a_json_config_file(tmp_path):
    config = tmp_path / "daemon.json"
    config.write_text(json.dumps({"port": 7, "bootstrap": ["127.0.0.1:49737", "[::1]:5"]}))
    settings = load_settings(Settings, config_file=config, environ={})
    assert settings.port == 7
    assert settings.bootstrap == (("127.0.0.1", 49737), ("::1", 5))


def test_legacy_names_rank_below_the_prefixed_ones():
    assert load_settings(Settings, environ={"OLD_PORT": "5"}).port == 5
    assert load_settings(Settings, environ={"OLD_PORT": "5",
                                            "K8S_COMMON_CONFIG__PORT": "6"}).port == 6
    assert load_settings(Settings, environ={"COSMICAC_LOG_LEVEL": "WARNING"}).log_level == (
        "warning")


@pytest.mark.parametrize(("environ", "key", "source", "problem"), [
    ({"K8S_COMMON_CONFIG__PORT": "70000"}, "port", "K8S_COMMON_CONFIG__PORT",
     "less than or equal to 65535"),
    ({"K8S_COMMON_CONFIG__PORT": "-1"}, "port", "K8S_COMMON_CONFIG__PORT",
     "greater than or equal to 0"),
    ({"K8S_COMMON_CONFIG__interconnect__relays": '["nope"]'}, "interconnect.relays[0]",
     "K8S_COMMON_CONFIG__interconnect__relays", "64 hex characters"),
    ({"K8S_COMMON_CONFIG__interconnect__relays": '["x"'}, "interconnect.relays",
     "K8S_COMMON_CONFIG__interconnect__relays", "not a JSON array"),
    ({"K8S_COMMON_CONFIG__INTERCONNECT": "{"}, "interconnect",
     "K8S_COMMON_CONFIG__INTERCONNECT", "not valid JSON"),
    ({"K8S_COMMON_CONFIG__interconnect__timeout_s": "soon"}, "interconnect.timeout_s",
     "K8S_COMMON_CONFIG__interconnect__timeout_s", "valid number"),
    ({"K8S_COMMON_CONFIG__PROT": "1"}, "prot", "K8S_COMMON_CONFIG__PROT", "no such setting"),
    ({"K8S_COMMON_CONFIG__METRICS__PROT": "1"}, "metrics.prot",
     "K8S_COMMON_CONFIG__METRICS__PROT", "no such setting"),
    ({"K8S_COMMON_CONFIG__BOOTSTRAP": "localhost:5"}, "bootstrap[0]",
     "K8S_COMMON_CONFIG__BOOTSTRAP", "not an IP address"),
    ({"OLD_PORT": "x"}, "port", "OLD_PORT", "valid integer"),
])
def test_a_bad_environment_value_names_its_key_its_variable_and_the_problem(
        environ, key, source, problem):
    with pytest.raises(ConfigError) as info:
        load_settings(Settings, environ=environ)
    assert (info.value.key, info.value.source) == (key, source)
    assert problem in info.value.problem
    assert str(info.value).startswith(f"bad setting {key} (from {source}): ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("text", "key", "problem"), [
    ("port = 'high'\n", "port", "valid integer"),
    ("[metrics]\nprot = 1\n", "metrics.prot", "no such setting"),
    ("bootstrap = ['1.2.3.4:0']\n", "bootstrap[0]", "between 1 and 65535"),
])
def test_a_bad_file_value_names_its_key_and_the_file(tmp_path, text, key, problem):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(Settings, config_file=config, environ={})
    assert info.value.key == key
    assert info.value.source == f"config file {config}"
    assert problem in info.value.problem


def test_an_unreadable_or_malformed_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(Settings, config_file=tmp_path / "missing.toml", environ={})
    broken = tmp_path / "broken.toml"
    broken.write_text("port = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(Settings, config_file=broken, environ={})
    listed = tmp_path / "listed.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a table"):
        load_settings(Settings, config_file=listed, environ={})


def test_a_command_line_value_out_of_range_is_named_as_from_the_command_line():
    with pytest.raises(ConfigError) as info:
        load_settings(Settings, environ={}, overrides={"metrics.port": 65536})
    assert (info.value.key, info.value.source) == ("metrics.port", "the command line")


@given(st.text(max_size=40))
def test_any_port_text_loads_or_names_the_port(text):
    if "\x00" in text:
        text = text.replace("\x00", "")
    try:
        settings = load_settings(Settings, environ={"K8S_COMMON_CONFIG__PORT": text})
    except ConfigError as exc:
        assert exc.key == "port"
        assert exc.source == "K8S_COMMON_CONFIG__PORT"
    else:
        assert 0 <= settings.port <= 65535


@given(st.text(max_size=80))
def test_any_relays_text_loads_or_names_the_key(text):
    text = text.replace("\x00", "")
    try:
        settings = load_settings(Settings, environ={
            "K8S_COMMON_CONFIG__interconnect__relays": text})
    except ConfigError as exc:
        assert exc.key.startswith("interconnect.relays")
        assert exc.source == "K8S_COMMON_CONFIG__interconnect__relays"
    else:
        assert all(len(key) == 32 for key in settings.interconnect.relays)
