"""The agent's config: refused with the field named, by the loader and by `cosmicac agent run`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from contracts.agent_config import AgentConfigError, load_agent_config

from .helpers import agent_config

WORKER = b"\x01" * 32


def write(tmp_path, document) -> str:
    path = tmp_path / "agent.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return str(path)


def test_the_rendered_config_reads_back_equal(tmp_path):
    config = agent_config(WORKER, address=("127.0.0.1", 4000))
    assert load_agent_config(write(tmp_path, config.to_json())) == config


@pytest.mark.parametrize(("change", "field"), [
    ({"worker": "not-a-key"}, "worker"),
    ({"report_token": "short"}, "report_token"),
    ({"heartbeat_interval_s": 0}, "heartbeat_interval_s"),
    ({"relays": ["zz"]}, "relays.0"),
    ({"job_type": "vm"}, "job_type"),
    ({"unknown": 1}, "unknown"),
    ({"node_rank": 3, "node_count": 2}, "config"),
])
def test_a_bad_field_is_named(tmp_path, change, field):
    document = json.loads(agent_config(WORKER).to_json()) | change
    with pytest.raises(AgentConfigError) as info:
        load_agent_config(write(tmp_path, document))
    assert f": {field}:" in str(info.value)


def test_a_missing_field_is_named(tmp_path):
    document = json.loads(agent_config(WORKER).to_json())
    del document["job_id"]
    with pytest.raises(AgentConfigError, match=r": job_id: Field required"):
        load_agent_config(write(tmp_path, document))


@pytest.mark.parametrize(("field", "value"), [
    ("worker_addresses", ["localhost:80"]),
    ("bootstrap", ["127.0.0.1:4000", "127.0.0.1"]),
])
def test_an_address_that_is_not_ip_port_is_named_with_its_index(tmp_path, field, value):
    document = json.loads(agent_config(WORKER).to_json()) | {field: value}
    with pytest.raises(AgentConfigError) as info:
        load_agent_config(write(tmp_path, document))
    assert f"{field}.{len(value) - 1}:" in str(info.value)


def test_addresses_are_typed_once_and_written_as_host_port(tmp_path):
    config = agent_config(WORKER, address=("127.0.0.1", 4000)).model_copy(
        update={"bootstrap": (("::1", 49737), ("10.0.0.1", 49737))})
    document = json.loads(config.to_json())
    # The wire format of every version: strings an older agent reads too.
    assert document["worker_addresses"] == ["127.0.0.1:4000"]
    assert document["bootstrap"] == ["[::1]:49737", "10.0.0.1:49737"]
    loaded = load_agent_config(write(tmp_path, document))
    assert loaded.worker_addresses == (("127.0.0.1", 4000),)
    assert loaded.bootstrap == (("::1", 49737), ("10.0.0.1", 49737))


def test_agent_run_exits_2_naming_the_field(tmp_path):
    document = json.loads(agent_config(WORKER).to_json()) | {"replica": -1}
    result = CliRunner().invoke(app, ["agent", "run", "--config", write(tmp_path, document)])
    assert result.exit_code == 2
    assert "replica" in result.output


def test_agent_run_exits_2_for_a_file_that_is_not_json(tmp_path):
    result = CliRunner().invoke(app, ["agent", "run", "--config", write(tmp_path, "{nope")])
    assert result.exit_code == 2
    assert "not valid JSON" in result.output


def test_relay_addresses_are_written_only_when_set_and_read_back_typed(tmp_path):
    relay = "ab" * 32
    plain = json.loads(agent_config(WORKER).to_json())
    assert "relay_addresses" not in plain  # an agent image older than its worker reads it
    config = agent_config(WORKER).model_validate(
        {**plain, "relays": [relay], "relay_addresses": {relay: ["203.0.113.7:49737",
                                                                 "[2001:db8::7]:49737"]}})
    document = json.loads(config.to_json())
    assert document["relay_addresses"] == {relay: ["203.0.113.7:49737", "[2001:db8::7]:49737"]}
    loaded = load_agent_config(write(tmp_path, document))
    assert loaded.relay_addresses == {relay: (("203.0.113.7", 49737), ("2001:db8::7", 49737))}
    bad = {**document, "relay_addresses": {relay: ["relay.example:49737"]}}
    with pytest.raises(AgentConfigError) as info:
        load_agent_config(write(tmp_path, bad))
    assert "relay_addresses" in str(info.value)


def test_the_agent_without_the_cli_exits_2_naming_the_field_too(tmp_path, capsys):
    from agents.boot import command_line

    document = json.loads(agent_config(WORKER).to_json()) | {"replica": -1}
    with pytest.raises(SystemExit) as exited:
        command_line(["--config", str(write(tmp_path, document))])
    assert exited.value.code == 2
    assert "replica" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        command_line(["--no-such-option"])
    assert exited.value.code == 2
