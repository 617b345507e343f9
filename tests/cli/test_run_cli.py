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


def test_run_wrk_monitor_with_an_unreadable_token_file_says_so_in_one_line(tmp_path):
    import os

    from tests.cli.support import invoke

    config = tmp_path / "monitor.json"
    (tmp_path / "m").mkdir()
    missing = tmp_path / "m" / "http-token"
    config.write_text(json.dumps({"storage": str(tmp_path / "m"), "host": "127.0.0.1",
                                  "port": 0, "http": {"host": "127.0.0.1", "port": 0,
                                                      "token_file": str(missing)}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    result = invoke(["run", "wrk-monitor", "--config", str(config),
                     "--config-dir", str(tmp_path / "none")], env=env)
    stderr = result.stderr.decode()
    assert result.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"error: cannot read http.token_file {missing}: No such file or directory")
    assert "Traceback" not in stderr


@pytest.mark.slow
async def test_run_wrk_monitor_prints_its_ready_line_serves_and_stops_on_sigint(tmp_path):
    import os
    import signal
    import subprocess

    import httpx
    import trio

    from tests.cli.helpers import process, read_ready
    from tests.cli.support import shared_tls

    config = tmp_path / "monitor.json"
    (tmp_path / "m").mkdir()
    token = tmp_path / "m" / "http-token"
    token.write_text("k" * 43 + "\n")
    config.write_text(json.dumps({"storage": str(tmp_path / "m"), "host": "127.0.0.1",
                                  "port": 0, "http": {"host": "127.0.0.1", "port": 0,
                                                      "token_file": str(token)}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    with trio.fail_after(60):
        async with process("run", "wrk-monitor", "--config", str(config),
                           "--config-dir", str(tmp_path / "none"),
                           stdout=subprocess.PIPE, env=env) as proc:
            ready = await read_ready(proc.stdout, "wrk-monitor")
            assert ready.address("swarm")[0] == "127.0.0.1" and ready.fields["loki"] == "off"
            async with httpx.AsyncClient(timeout=10, verify=shared_tls()) as http:
                url = ready.url("http", "/metrics")
                assert (await http.get(url)).status_code == 401
                metrics = await http.get(url, headers={"Authorization": f"Bearer {'k' * 43}"})
            assert "monitor_records_received_total 0.0" in metrics.text
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0


@pytest.mark.slow
async def test_run_dht_and_run_relay_start_as_every_daemon_does(tmp_path):
    """`cosmicac run dht` (its env file's names: COSMICAC_DHT_HOST, _PORT) and `cosmicac
    run relay` with only its storage and a port: ready lines, then a clean SIGINT. The
    relay bootstraps on nothing (a DHT of its own): peers find it by its address."""
    import os
    import signal
    import subprocess

    import trio

    from tests.cli.helpers import process, read_ready

    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    dht_env = {**env, "COSMICAC_DHT_HOST": "127.0.0.1", "COSMICAC_DHT_PORT": "0"}
    relay_config = tmp_path / "relay.json"
    relay_config.write_text(json.dumps({"storage": str(tmp_path / "relay"),
                                        "host": "127.0.0.1", "port": 0}))
    with trio.fail_after(60):
        async with process("run", "dht", "--config-dir", str(tmp_path / "none"),
                           stdout=subprocess.PIPE, env=dht_env) as dht:
            ready = await read_ready(dht.stdout, "dht-bootstrap")
            assert ready.address("udp")[0] == "127.0.0.1" and ready.address("udp")[1] > 0
            dht.send_signal(signal.SIGINT)
            assert await dht.wait() == 0
        async with process("run", "relay", "--config", str(relay_config),
                           "--config-dir", str(tmp_path / "none"),
                           stdout=subprocess.PIPE, env=env) as relay:
            ready = await read_ready(relay.stdout, "relay")
            assert ready.key and len(ready.key) == 64
            assert (tmp_path / "relay" / "identity").exists()
            assert ready.address("tcp")[0] == "127.0.0.1"
            relay.send_signal(signal.SIGINT)
            assert await relay.wait() == 0
