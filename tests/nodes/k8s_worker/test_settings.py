"""The worker's settings: the kit's peer, in the seeds' common-config shape."""

from __future__ import annotations

import json

import pytest

from nodes.k8s_worker.settings import WORKER_PORT, WorkerSettings
from nodes.kit.settings import PeerRef, PeerSettings
from p2p.daemon import ConfigError, load_settings

ORK = "ab" * 32
RELAY = "cd" * 32


def base(tmp_path) -> dict[str, str]:
    return {"K8S_COMMON_CONFIG__STORAGE": str(tmp_path), "K8S_COMMON_CONFIG__ORK": ORK}


def test_the_workers_bootstrap_and_relays_are_the_seeds_interconnect_keys(tmp_path):
    settings = load_settings(WorkerSettings, environ={
        **base(tmp_path), "K8S_COMMON_CONFIG__interconnect__bootstrap": '["10.0.0.5:49738"]',
        "K8S_COMMON_CONFIG__interconnect__relays": f'["{RELAY}"]',
        "K8S_COMMON_CONFIG__interconnect__relay_addresses": f'{{"{RELAY}": ["10.0.0.7:49737"]}}'})
    assert isinstance(settings, PeerSettings)
    assert settings.relay_addresses == {bytes.fromhex(RELAY): (("10.0.0.7", 49737),)}
    assert settings.port == WORKER_PORT
    # One value: the worker's swarm and its agents read the same bootstrap.
    assert settings.bootstrap == settings.interconnect.bootstrap == (("10.0.0.5", 49738),)
    # The relays there are its jobs' (seeds/relay.txt), and its own: it reserves on
    # them, so agents that cannot reach it come through one.
    assert settings.relays == settings.interconnect.relays == (bytes.fromhex(RELAY),)


def test_the_interconnect_section_reads_from_a_file_too(tmp_path):
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"storage": str(tmp_path), "ork": ORK,
                                  "interconnect": {"bootstrap": ["10.0.0.5:49738"]}}))
    settings = load_settings(WorkerSettings, config_file=config)
    assert settings.bootstrap == (("10.0.0.5", 49738),)


@pytest.mark.parametrize(("name", "value"), [("BOOTSTRAP", '["10.0.0.5:49738"]'),
                                             ("bootstrap", '["10.0.0.5:49738"]'),
                                             ("RELAYS", f'["{RELAY}"]')])
def test_a_top_level_bootstrap_or_relays_is_no_setting_of_the_worker(tmp_path, name, value):
    with pytest.raises(ConfigError) as caught:
        load_settings(WorkerSettings, environ={**base(tmp_path),
                                               f"K8S_COMMON_CONFIG__{name}": value})
    assert caught.value.key == name.lower() and caught.value.problem == "no such setting"
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"storage": str(tmp_path), "ork": ORK,
                                  name.lower(): json.loads(value)}))
    with pytest.raises(ConfigError) as caught:
        load_settings(WorkerSettings, config_file=config)
    assert caught.value.key == name.lower()


def test_an_unprefixed_interconnect_variable_is_not_read(tmp_path):
    settings = load_settings(WorkerSettings, environ={
        **base(tmp_path), "INTERCONNECT": '{"bootstrap": ["10.9.9.9:1"]}'})
    assert settings.bootstrap == () == settings.interconnect.bootstrap


def test_a_bad_bootstrap_is_named_once_at_the_seeds_key(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_settings(WorkerSettings, environ={
            **base(tmp_path), "K8S_COMMON_CONFIG__interconnect__bootstrap": '["nowhere"]'})
    assert caught.value.key == "interconnect.bootstrap[0]"
    assert caught.value.source == "K8S_COMMON_CONFIG__interconnect__bootstrap"
    assert "more)" not in caught.value.problem  # read twice, one mistake


def test_the_worker_dials_ork_as_a_peer_ref(tmp_path):
    settings = load_settings(WorkerSettings, environ={
        **base(tmp_path), "K8S_COMMON_CONFIG__ORK_ADDRESSES": "127.0.0.1:49740"})
    assert settings.ork_peer == PeerRef(bytes.fromhex(ORK), (("127.0.0.1", 49740),))


def test_a_dump_holds_the_bootstrap_where_the_seeds_put_it(tmp_path):
    settings = load_settings(WorkerSettings, environ={
        **base(tmp_path), "K8S_COMMON_CONFIG__interconnect__bootstrap": '["10.0.0.5:49738"]'})
    dumped = settings.model_dump()
    # Top-level keys would be refused on reading back.
    assert "bootstrap" not in dumped and "relays" not in dumped
    assert dumped["interconnect"]["bootstrap"] == (("10.0.0.5", 49738),)
