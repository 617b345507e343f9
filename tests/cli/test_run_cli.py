"""``cosmicac apply-config`` and ``cosmicac run``: validated settings, the seeds' env form."""

from __future__ import annotations

import json
import stat

import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.run import ServiceName, installed_config
from nodes.k8s_worker.settings import WorkerSettings
from p2p.daemon import load_settings

ORK = "ab" * 32
RELAY = "cd" * 32
OTHER_RELAY = "ef" * 32


def invoke(*args: str, env: dict[str, str] | None = None):
    result = CliRunner().invoke(app, list(args), env=env)
    return result, result.output


def worker_config(tmp_path, **changes) -> str:
    config = {"storage": str(tmp_path / "worker"), "ork": ORK,
              "interconnect": {"relays": [RELAY]}, "backend": "local"}
    config.update(changes)
    path = tmp_path / "worker.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_apply_config_validates_and_installs_the_worker_config(tmp_path):
    folder = tmp_path / "etc"
    result, output = invoke("apply-config", "wrk-server-k8s-nvidia", worker_config(tmp_path),
                            "--config-dir", str(folder))
    assert result.exit_code == 0, output
    installed = folder / "wrk-server-k8s-nvidia.json"
    assert json.loads(installed.read_text())["interconnect"]["relays"] == [RELAY]
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600
    assert installed_config(ServiceName.WORKER, folder) == installed
    assert "restart wrk-server-k8s-nvidia" in output


def test_a_bad_config_is_refused_naming_the_key_and_the_installed_one_stays(tmp_path):
    folder = tmp_path / "etc"
    invoke("apply-config", "wrk-server-k8s-nvidia", worker_config(tmp_path),
           "--config-dir", str(folder))
    bad = worker_config(tmp_path, interconnect={"relays": ["not-a-key"]})
    result, output = invoke("apply-config", "wrk-server-k8s-nvidia", bad,
                            "--config-dir", str(folder))
    assert result.exit_code == 2
    assert "interconnect.relays" in output and "Traceback" not in output
    kept = json.loads((folder / "wrk-server-k8s-nvidia.json").read_text())
    assert kept["interconnect"]["relays"] == [RELAY]


def test_the_seeds_environment_override_form_is_read_and_checked(tmp_path):
    path = worker_config(tmp_path)
    env = {"K8S_COMMON_CONFIG__interconnect__relays": json.dumps([OTHER_RELAY])}
    settings = load_settings(WorkerSettings, config_file=path, environ=env)
    assert settings.interconnect.relays == (bytes.fromhex(OTHER_RELAY),)
    result, output = invoke("apply-config", "wrk-server-k8s-nvidia", path,
                            "--config-dir", str(tmp_path / "etc"),
                            env={"K8S_COMMON_CONFIG__interconnect__relays": '["short"]'})
    assert result.exit_code == 2
    assert "K8S_COMMON_CONFIG__INTERCONNECT__RELAYS" in output.upper()
    assert not (tmp_path / "etc" / "wrk-server-k8s-nvidia.json").exists()


@pytest.mark.parametrize(("service", "config", "key"), [
    ("wrk-server-k8s-nvidia", {"storage": "x"}, "ork"),
    ("wrk-server-k8s-nvidia", {"storage": "x", "ork": ORK, "backend": "cloud"}, "backend"),
    ("wrk-ork", {"storage": "x", "unknown_after_s": -1}, "unknown_after_s"),
    ("wrk-ork", {"storage": "x", "racks": [{"key": "zz"}]}, "racks"),
])
def test_run_refuses_a_bad_setting_before_starting_anything(tmp_path, service, config, key):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(config))
    result, output = invoke("run", service, "--config", str(path),
                            "--config-dir", str(tmp_path / "none"))
    assert result.exit_code == 2
    assert key in output and "Traceback" not in output
