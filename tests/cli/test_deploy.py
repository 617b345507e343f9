"""The deployment tasks as a script runs them: ``cosmicac`` run in this process (the
group's smoke test, bootstrap under umask 0, runs the real one in a subprocess).

bootstrap writes identities and configs that each daemon's own settings class
accepts, and keeps them when run again; wire writes app-node's key where
proxy-inference's unit reads it; autobase-connect admits a writer through a
real app-node (served in-process) and says so again without changing
anything; restart calls systemctl (a fake one on PATH) and refuses unknown
services. The systemd units are checked against the layout bootstrap writes.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from cli.deploy import SERVICES
from cli.run import ServiceName, _settings_class
from nodes.app_node.daemon import RunningAppNode, serve_app_node
from nodes.app_node.settings import ApiHttpSettings, AppNodeSettings
from p2p.daemon import load_settings
from p2p.keys import KeyPair, load_keypair
from relay import RelaySettings
from tests.cli.helpers import COSMICAC
from tests.cli.support import cosmicac, invoke

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
KEYED = ("relay", "app-node", "wrk-ork", "wrk-server-k8s-nvidia", "proxy-inference",
         "wrk-monitor")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COSMICAC_", "K8S_COMMON_CONFIG__")) and k != "PROXY_AUTOBASE_KEY"}
    env.update({"NO_COLOR": "1", "COLUMNS": "200", **extra})
    return env


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``cosmicac *args`` in this process, its output as text."""
    ran = invoke(args, env=env or clean_env())
    return subprocess.CompletedProcess(ran.args, ran.returncode, ran.stdout.decode(),
                                       ran.stderr.decode())


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {key: value for key, value in pairs}


def load(folder: Path, service: str, monkeypatch: pytest.MonkeyPatch, env: Path | None = None):
    """The config as ``cosmicac run SERVICE`` reads it, with the unit's env file if given."""
    for name in list(os.environ):
        if name.startswith(("COSMICAC_", "K8S_COMMON_CONFIG__")) or name == "PROXY_AUTOBASE_KEY":
            monkeypatch.delenv(name)
    with monkeypatch.context() as patch:
        for key, value in (env_file(env) if env else {}).items():
            patch.setenv(key, value)
        cls = RelaySettings if service == "relay" else _settings_class(ServiceName(service))
        return load_settings(cls, config_file=folder / "config" / f"{service}.json",
                             overrides={})


def test_bootstrap_writes_what_each_daemon_accepts(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "deploy"
    result = cli("bootstrap", "--dir", str(folder), "--backend", "local")
    assert result.returncode == 0, result.stderr
    keys = {name: load_keypair(folder / name).hex for name in KEYED}
    assert json.loads((folder / "keys.json").read_text()) == keys
    for name in KEYED:
        assert f"identity   {name:<22} {keys[name]}  created" in result.stdout

    app = load(folder, "app-node", monkeypatch)
    assert app.storage == folder / "app-node"
    assert [k.hex() for k in app.database_writers] == [keys["proxy-inference"]]
    assert app.ork.hex() == keys["wrk-ork"]
    ork = load(folder, "wrk-ork", monkeypatch)
    [rack] = ork.racks
    assert rack.key.hex() == keys["wrk-server-k8s-nvidia"] and rack.name == "rack-1"
    # Each caller its own role: app-node every method, the proxy reads jobs only.
    assert [k.hex() for k in ork.app_nodes] == [keys["app-node"]]
    assert [k.hex() for k in ork.proxies] == [keys["proxy-inference"]]
    assert ork.clients == ()
    worker = load(folder, "wrk-server-k8s-nvidia", monkeypatch)
    assert worker.backend == "local" and worker.ork.hex() == keys["wrk-ork"]
    assert [k.hex() for k in worker.interconnect.relays] == [keys["relay"]]
    proxy = load(folder, "proxy-inference", monkeypatch,
                 env=folder / "env" / "proxy-inference.env")
    assert proxy.database.hex() == keys["app-node"]
    entry = load(folder, "entry", monkeypatch)
    assert str(entry.api_url).startswith("http://127.0.0.1:49751")
    assert str(entry.monitor_url).startswith("http://127.0.0.1:49752")
    monitor = load(folder, "wrk-monitor", monkeypatch)
    assert [k.hex() for k in monitor.followers] == [keys["app-node"]]
    assert app.monitor.hex() == keys["wrk-monitor"]
    # Every daemon ships its logs to wrk-monitor, which lets exactly them push.
    shippers = {"wrk-ork": ork.telemetry, "wrk-server-k8s-nvidia": worker.telemetry,
                "proxy-inference": proxy.telemetry, "app-node": app.telemetry_settings()}
    for telemetry in shippers.values():
        assert telemetry.monitor.hex() == keys["wrk-monitor"]
        assert telemetry.monitor_addresses == (("127.0.0.1", 49743),)
    assert {k.hex() for k in monitor.pushers} == {keys[name] for name in shippers}
    # Least privilege: each of wrk-monitor's lists names exactly the peers that need it.
    assert [k.hex() for k in monitor.proxies] == [keys["proxy-inference"]]
    assert [k.hex() for k in monitor.workers] == [keys["wrk-server-k8s-nvidia"]]
    assert not monitor.allow_any_pusher
    # Its HTTP side wants a token bootstrap made (0600), which it reads at start.
    token_file = folder / "wrk-monitor" / "http-token"
    assert monitor.http.token_file == token_file and monitor.http.token is None
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert len(monitor.http.resolved_token()) >= 32
    assert monitor.http.trusted_proxies == ("127.0.0.1",)  # the entry point
    assert f"token      {'wrk-monitor http':<22} {token_file}  created" in result.stdout
    relay = load(folder, "relay", monkeypatch)
    assert relay.storage == folder / "relay" and relay.port == 49737
    assert env_file(folder / "env" / "dht.env") == {
        "COSMICAC_DHT_HOST": "127.0.0.1", "COSMICAC_DHT_PORT": "49738"}
    # app-node has never run: no database yet, so the connect is left for later.
    assert "autobase-connect" in result.stdout and "not yet" in result.stdout
    assert "Next steps" in result.stdout


def test_bootstrap_over_hosts_on_kubevirt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "deploy"
    result = cli("bootstrap", "--dir", str(folder), "--default-host", "10.0.0.5",
                 "--host", "relay=10.0.0.9", "--host", "wrk-server-k8s-nvidia=10.0.0.6",
                 "--host", "proxy-inference=10.0.0.7", "--kubeconfig", "/etc/kube.conf",
                 "--rack-name", "h100-a", "--location", "eu-1")
    assert result.returncode == 0, result.stderr
    worker = load(folder, "wrk-server-k8s-nvidia", monkeypatch)
    assert worker.backend == "kubevirt" and worker.kubevirt.kubeconfig == "/etc/kube.conf"
    assert worker.ork_addresses == (("10.0.0.5", 49740),)
    assert worker.interconnect.bootstrap == (("10.0.0.5", 49738),)
    # The relay box by key and address, in every daemon's config (the worker's under
    # interconnect): reached with no DHT; app-node tells users' CLIs (/api/swarm).
    relay_key = bytes.fromhex(json.loads((folder / "keys.json").read_text())["relay"])
    assert worker.relay_addresses == {relay_key: (("10.0.0.9", 49737),)}
    for name in ("app-node", "wrk-ork", "proxy-inference", "wrk-monitor"):
        assert load(folder, name, monkeypatch).relay_addresses == {
            relay_key: (("10.0.0.9", 49737),)}, name
    proxy = load(folder, "proxy-inference", monkeypatch)
    assert proxy.http.host == "10.0.0.7" and proxy.host == "0.0.0.0"
    entry = load(folder, "entry", monkeypatch)
    assert str(entry.inference_url).startswith("http://10.0.0.7:49750")
    [rack] = load(folder, "wrk-ork", monkeypatch).racks
    assert (rack.name, rack.location) == ("h100-a", "eu-1")
    assert "copy to each host" in result.stdout

    bad = cli("bootstrap", "--dir", str(folder), "--host", "nope=10.0.0.1")
    assert bad.returncode == 2 and "SERVICE=ADDRESS" in one_error(bad)
    bad = cli("bootstrap", "--dir", str(folder), "--host", "relay=example.com")
    assert bad.returncode == 2 and "not an IP address" in one_error(bad)


def test_bootstrap_gives_app_node_the_operators_loki_and_prometheus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "deploy"
    result = cli("bootstrap", "--dir", str(folder), "--backend", "local",
                 "--loki-url", "http://ops:s3cret@10.0.0.20:3100", "--loki-tenant", "cac")
    assert result.returncode == 0, result.stderr
    app = load(folder, "app-node", monkeypatch)
    assert app.observability.loki_url == "http://ops:s3cret@10.0.0.20:3100"
    assert app.observability.loki_tenant == "cac" and app.observability.prometheus_url is None
    # The next run adds Prometheus and keeps what it was told before.
    again = cli("bootstrap", "--dir", str(folder), "--rewrite-configs",
                "--prometheus-url", "http://10.0.0.21:9090")
    assert again.returncode == 0, again.stderr
    app = load(folder, "app-node", monkeypatch)
    assert app.observability.loki_url == "http://ops:s3cret@10.0.0.20:3100"
    assert app.observability.prometheus_url == "http://10.0.0.21:9090"

    bad = cli("bootstrap", "--dir", str(folder), "--loki-url", "loki:3100")
    assert bad.returncode == 2 and "loki_url" in one_error(bad)
    both = cli("bootstrap", "--dir", str(folder), "--no-observability",
               "--loki-url", "http://10.0.0.20:3100")
    assert both.returncode == 2 and "--no-observability" in one_error(both)
    # Forgotten: app-node's config has none, so it clears what wrk-monitor holds.
    cleared = cli("bootstrap", "--dir", str(folder), "--rewrite-configs", "--no-observability")
    assert cleared.returncode == 0, cleared.stderr
    app = load(folder, "app-node", monkeypatch)
    assert not app.observability.configured
    saved = json.loads((folder / "deployment.json").read_text()).get("observability") or {}
    assert not any(saved.values()), saved
    # And a later run without options does not bring them back.
    assert cli("bootstrap", "--dir", str(folder), "--rewrite-configs").returncode == 0
    assert not load(folder, "app-node", monkeypatch).observability.configured


def test_bootstrap_again_keeps_identities_and_edited_configs(tmp_path: Path) -> None:
    folder = tmp_path / "deploy"
    assert cli("bootstrap", "--dir", str(folder), "--backend", "local").returncode == 0
    keys = json.loads((folder / "keys.json").read_text())
    token_file = folder / "wrk-monitor" / "http-token"
    token = token_file.read_text()
    token_file.chmod(0o644)  # loosened by hand: put back, not replaced
    (folder / "env" / "wrk-server-k8s-nvidia.env").write_text(
        "K8S_COMMON_CONFIG__interconnect__relays='[]'\n")
    edited = folder / "config" / "wrk-ork.json"
    edited.write_text(edited.read_text().replace('"rack-1"', '"mine"'))

    again = cli("bootstrap", "--dir", str(folder))  # the options of last time
    assert again.returncode == 0, again.stderr
    assert json.loads((folder / "keys.json").read_text()) == keys
    for name in KEYED:
        assert f"identity   {name:<22} {keys[name]}  kept" in again.stdout
        assert load_keypair(folder / name).hex == keys[name]
    assert "config     app-node               " in again.stdout
    assert f"{folder / 'config' / 'app-node.json'}  unchanged" in again.stdout
    assert f"{token_file}  kept" in again.stdout and token_file.read_text() == token
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert f"{edited}  kept (differs" in again.stdout
    assert '"mine"' in edited.read_text()
    assert "K8S_COMMON_CONFIG__interconnect__relays='[]'" in \
        (folder / "env" / "wrk-server-k8s-nvidia.env").read_text()
    assert json.loads((folder / "config" / "wrk-server-k8s-nvidia.json").read_text())[
        "backend"] == "local"
    assert "PROXY_AUTOBASE_KEY=" in again.stdout and "unchanged" in again.stdout

    rewritten = cli("bootstrap", "--dir", str(folder), "--rewrite-configs")
    assert rewritten.returncode == 0, rewritten.stderr
    assert f"{edited}  written" in rewritten.stdout and '"rack-1"' in edited.read_text()

    # The worker's folder moved to its host: its key comes from keys.json, no new one.
    shutil.rmtree(folder / "wrk-server-k8s-nvidia")
    moved = cli("bootstrap", "--dir", str(folder))
    assert moved.returncode == 0, moved.stderr
    assert f"{keys['wrk-server-k8s-nvidia']}  kept (keys.json" in moved.stdout
    assert not (folder / "wrk-server-k8s-nvidia").exists()
    assert json.loads((folder / "keys.json").read_text()) == keys
    assert keys["wrk-server-k8s-nvidia"] in edited.read_text()


def test_wire_writes_app_nodes_key_once(tmp_path: Path) -> None:
    folder = tmp_path / "deploy"
    missing = cli("wire", "--dir", str(folder))
    assert missing.returncode == 1 and "bootstrap" in one_error(missing)

    assert cli("bootstrap", "--dir", str(folder), "--backend", "local").returncode == 0
    app_key = load_keypair(folder / "app-node").hex
    env = folder / "env" / "proxy-inference.env"
    other = KeyPair.generate().hex
    env.write_text(f"REDIS_URL=redis://x\nPROXY_AUTOBASE_KEY={other}\nEXTRA=1\n")
    wired = cli("wire", "--dir", str(folder))
    assert wired.returncode == 0, wired.stderr
    assert f"wrote PROXY_AUTOBASE_KEY={app_key}" in wired.stdout
    assert env_file(env) == {"REDIS_URL": "redis://x", "PROXY_AUTOBASE_KEY": app_key,
                             "EXTRA": "1"}
    again = cli("wire", "--dir", str(folder))
    assert again.returncode == 0 and "already" in again.stdout
    # The env file is found through COSMICAC_DEPLOY_DIR too, and --key wins.
    explicit = cli("wire", "--key", other, env=clean_env(COSMICAC_DEPLOY_DIR=str(folder)))
    assert explicit.returncode == 0, explicit.stderr
    assert env_file(env)["PROXY_AUTOBASE_KEY"] == other


@pytest.mark.slow
async def test_autobase_connect_through_a_running_app_node(tmp_path: Path,
                                                           nursery: trio.Nursery) -> None:
    folder = tmp_path / "deploy"

    async def run(*args: str):
        return await cosmicac(*args, env=clean_env())

    with trio.fail_after(120):
        done = await run("bootstrap", "--dir", str(folder), "--backend", "local")
        assert done.returncode == 0, done.stderr
        proxy_key = load_keypair(folder / "proxy-inference").hex
        before = await run("autobase-connect", "--dir", str(folder))
        assert before.returncode == 3, before.stderr
        assert b"run cosmicac autobase-connect again" in before.stderr

        # app-node as bootstrap made it, minus the writers it admits at start.
        settings = AppNodeSettings(storage=folder / "app-node", host="127.0.0.1", port=0,
                                   http=ApiHttpSettings(host="127.0.0.1", port=0), fsync=False)
        scope = trio.CancelScope()

        async def serve(task_status=trio.TASK_STATUS_IGNORED) -> None:
            with scope:
                await serve_app_node(settings, task_status=task_status)

        node: RunningAppNode = await nursery.start(serve)
        db = node.services.database
        assert not db.base.admission.is_writer(bytes.fromhex(proxy_key))
        status = folder / "app-node" / "db" / "db" / "status.json"
        while not status.exists():  # noqa: ASYNC110 - a file the service writes at start
            await trio.sleep(0.05)

        added = await run("autobase-connect", "--dir", str(folder))
        assert added.returncode == 0, added.stderr
        assert f"proxy-inference {proxy_key}: admitted as a writer".encode() in added.stdout
        assert db.base.admission.is_writer(bytes.fromhex(proxy_key))
        again = await run("autobase-connect", "--dir", str(folder))
        assert again.returncode == 0, again.stderr
        assert b"already a writer" in again.stdout
        other = KeyPair.generate().hex
        explicit = await run("autobase-connect", "--dir", str(folder), "--key", other)
        assert explicit.returncode == 0 and b"admitted" in explicit.stdout
        # bootstrap again, app-node running: it connects and says so.
        rerun = await run("bootstrap", "--dir", str(folder))
        assert rerun.returncode == 0, rerun.stderr
        assert b"already a writer (via app-node" in rerun.stdout

        scope.cancel()
        while status.exists():  # noqa: ASYNC110 - removed as the service stops
            await trio.sleep(0.05)
        after = await run("autobase-connect", "--dir", str(folder))
        assert after.returncode == 3 and b"app-node is not running" in after.stderr


FAKE_SYSTEMCTL = """#!/bin/sh
echo "$@" >> "{log}"
if [ "$1" = show ]; then
  case "$4" in *entry*) echo not-found ;; *) echo loaded ;; esac
fi
if [ "$1" = restart ] && [ -n "$FAIL_RESTART" ]; then echo "Job failed" >&2; exit 1; fi
exit 0
"""


def test_restart_calls_systemctl_for_known_services(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "systemctl.log"
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL.format(log=log))
    fake.chmod(0o755)
    env = clean_env(PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")

    done = cli("restart", "wrk-server-k8s-nvidia", "cosmicac-proxy-inference.service", env=env)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[-1] == ("restart cosmicac-wrk-server-k8s-nvidia.service "
                         "cosmicac-proxy-inference.service")
    assert calls[0] == "show --property=LoadState --value cosmicac-wrk-server-k8s-nvidia.service"
    # The seeds' form: one argument naming several.
    assert cli("restart", "cosmicac-app-node wrk-ork", env=env).returncode == 0
    assert log.read_text().splitlines()[-1] == \
        "restart cosmicac-app-node.service cosmicac-wrk-ork.service"

    log.unlink()
    unknown = cli("restart", "app-node", "nope", env=env)
    assert unknown.returncode == 2 and "unknown service 'nope'" in one_error(unknown)
    assert not log.exists()  # nothing restarted
    not_installed = cli("restart", "entry", env=env)
    assert not_installed.returncode == 1 and "not installed" in one_error(not_installed)
    failing = cli("restart", "relay", env={**env, "FAIL_RESTART": "1"})
    assert failing.returncode == 1 and "Job failed" in one_error(failing)
    empty = tmp_path / "empty"
    empty.mkdir()
    absent = cli("restart", "relay", env=clean_env(PATH=str(empty)))
    assert absent.returncode == 1 and "systemctl not found" in one_error(absent)


def test_units_match_the_layout_bootstrap_writes() -> None:
    assert sorted(p.name for p in UNITS.glob("*.service")) == \
        sorted(f"cosmicac-{name}.service" for name in SERVICES)
    for name in SERVICES:
        unit = configparser.ConfigParser(strict=False, interpolation=None)
        unit.optionxform = str  # type: ignore[assignment, method-assign]
        unit.read(UNITS / f"cosmicac-{name}.service")
        service = unit["Service"]
        start = service["ExecStart"].split()
        if name in ("app-node", "wrk-ork", "wrk-server-k8s-nvidia", "proxy-inference", "entry",
                    "wrk-monitor", "ui"):
            assert start[1:] == ["run", name, "--config-dir", "/var/lib/cosmicac/config"]
        elif name == "dht":
            assert start[1:] == ["run", "dht"]  # its env file says where it listens
        else:  # every daemon is `cosmicac run SERVICE`
            assert start[1:3] == ["run", name], start
        assert Path(start[0]).name == "cosmicac"
        assert service["EnvironmentFile"].lstrip("-") == f"/var/lib/cosmicac/env/{name}.env"
        assert service["KillSignal"] == "SIGINT" and service["Restart"] == "on-failure"
        assert service["User"] == "cosmicac" and service["StateDirectory"] == "cosmicac"
        assert "network-online.target" in unit["Unit"]["After"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    for unit in UNITS.glob("*.service"):
        copy = tmp_path / unit.name  # verify wants the command to exist
        copy.write_text(unit.read_text().replace("/usr/local/bin/cosmicac", sys.executable))
        result = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr


def test_bootstrap_makes_the_monitor_token_private_whatever_the_umask(tmp_path: Path) -> None:
    folder = tmp_path / "deploy"
    result = subprocess.run(["sh", "-c", 'umask 0; exec "$@"', "sh", *COSMICAC, "bootstrap",
                             "--dir", str(folder), "--backend", "local"],
                            capture_output=True, text=True, timeout=60, env=clean_env(),
                            check=False)
    assert result.returncode == 0, result.stderr
    assert (folder / "wrk-monitor" / "http-token").stat().st_mode & 0o777 == 0o600
    # Others may pass through to the local agents' own folders, never list it; the
    # plan written last must not have tightened it back to 0700.
    assert folder.stat().st_mode & 0o777 == 0o711
    assert (folder / "deployment.json").stat().st_mode & 0o777 == 0o600


def test_the_prometheus_example_is_valid_and_sends_the_token(tmp_path: Path) -> None:
    """deploy/prometheus.yml as promtool reads it, with its token file in place."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian's prometheus package)")
    example = (UNITS.parent / "prometheus.yml").read_text()
    token = tmp_path / "token"
    token.write_text("x" * 43 + "\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(example.replace("/etc/prometheus/cosmicac-wrk-monitor.token", str(token)))
    assert str(token) in config.read_text()
    checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_app_node_trusts_the_door_it_is_given(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: app-node believes X-Forwarded-For from the entry point's (or
    Caddy's) address and the web UI's only, the ones `bootstrap` and `up` give it;
    the UI believes the door's."""
    from cli.up import DEFAULT_BASE_PORT, Ports, service_configs

    folder = tmp_path / "deploy"
    result = cli("bootstrap", "--dir", str(folder), "--default-host", "10.0.0.5",
                 "--host", "entry=10.0.0.8")
    assert result.returncode == 0, result.stderr
    app = load(folder, "app-node", monkeypatch)
    assert app.limits.trusted_proxies == ("10.0.0.5", "10.0.0.8")  # the UI's, the door's
    assert load(folder, "ui", monkeypatch).trusted_proxies == ("10.0.0.8",)
    keys = {name: KeyPair.generate().hex for name in SERVICES}
    one_machine = service_configs(tmp_path, Ports.from_base(DEFAULT_BASE_PORT), keys)
    assert one_machine["app-node"]["limits"]["trusted_proxies"] == ["127.0.0.1"]
