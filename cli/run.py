"""``cosmicac run SERVICE`` and ``cosmicac apply-config SERVICE FILE``.

``run`` starts one platform daemon alone, for a deployment spread over hosts
(``make up`` runs them all on one). Its settings come from ``--config FILE``,
else from the file ``apply-config`` installed, then from the environment
(each daemon's prefix: ``COSMICAC_DHT__`` for a DHT node, ``COSMICAC_RELAY__`` for
the blind relay, ``K8S_COMMON_CONFIG__`` for the worker, as the seeds
write it; ``COSMICAC_ORK__`` for wrk-ork; ``COSMICAC_PROXY__`` for
proxy-inference, which also reads ``PROXY_AUTOBASE_KEY``; ``COSMICAC_ENTRY__`` for
the entry point on port 5173; ``COSMICAC_APP_NODE__`` for app-node, which also
reads ``REDIS_URL``; ``COSMICAC_MONITOR__`` for wrk-monitor; ``COSMICAC_UI__`` for the
web UI).

``apply-config`` is the seeds' ``task apply-wrk-server-k8s-nvidia-common-config``:
it validates a file exactly as the daemon will read it (environment
overrides included) and, only if it is valid, installs it under the config
folder (``--config-dir``, ``COSMICAC_CONFIG_DIR``, default
``~/.config/cosmicac``). The running daemon keeps its settings until it is
restarted, and a worker gives new relay keys only to jobs created after that.
"""

from __future__ import annotations

import enum
import os
import shutil
import tempfile
from pathlib import Path

import typer

from p2p.daemon import ConfigError, DaemonSettings, load_settings, run_daemon
from p2p.files import private_folder

from ._args import config_option
from ._config import config_dir
from ._console import fail

__all__ = ["apply_config", "run"]

CONFIG_DIR_HELP = "Folder of installed daemon configs (default: ~/.config/cosmicac)."


class ServiceName(enum.StrEnum):
    DHT = "dht"
    RELAY = "relay"
    ORK = "wrk-ork"
    WORKER = "wrk-server-k8s-nvidia"
    PROXY = "proxy-inference"
    ENTRY = "entry"
    APP_NODE = "app-node"
    MONITOR = "wrk-monitor"
    UI = "ui"


def _settings_class(service: ServiceName) -> type[DaemonSettings]:
    if service is ServiceName.DHT:
        from .dht import DhtSettings
        return DhtSettings
    if service is ServiceName.RELAY:
        from relay import RelaySettings
        return RelaySettings
    if service is ServiceName.ORK:
        from nodes.ork.settings import OrkSettings
        return OrkSettings
    if service is ServiceName.PROXY:
        from nodes.proxy_inference.settings import ProxySettings
        return ProxySettings
    if service is ServiceName.ENTRY:
        from nodes.entry.settings import EntrySettings
        return EntrySettings
    if service is ServiceName.APP_NODE:
        from nodes.app_node.settings import AppNodeSettings
        return AppNodeSettings
    if service is ServiceName.MONITOR:
        from nodes.monitor.settings import MonitorSettings
        return MonitorSettings
    if service is ServiceName.UI:
        from nodes.ui.settings import UiSettings
        return UiSettings
    from nodes.k8s_worker.settings import WorkerSettings
    return WorkerSettings


def installed_config(service: ServiceName, folder: Path) -> Path | None:
    for suffix in (".toml", ".json"):
        candidate = folder / f"{service.value}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def run(
    service: ServiceName = typer.Argument(..., help="The daemon to start."),
    config: Path | None = config_option(),
    config_folder: Path | None = typer.Option(None, "--config-dir", help=CONFIG_DIR_HELP),
    storage: Path | None = typer.Option(None, "--storage",
                                        help="The daemon's folder (identity and state)."),
) -> None:
    """Run one platform daemon in the foreground until SIGINT or SIGTERM.

    Example: cosmicac run wrk-ork --storage /var/lib/cosmicac/wrk-ork

    Example: cosmicac run app-node --config /etc/cosmicac/app-node.toml
    """
    config = config or installed_config(service, config_dir(config_folder))
    cls = _settings_class(service)
    try:
        settings = load_settings(cls, config_file=config, overrides={"storage": storage})
    except ConfigError as exc:
        fail(str(exc), code=2)
    if service is ServiceName.DHT:
        from .dht import run_node
        run_node(settings)
    elif service is ServiceName.RELAY:
        from .relay import run_relay_daemon
        run_relay_daemon(settings)
    elif service is ServiceName.ORK:
        from nodes.ork.daemon import start_ork
        run_daemon(settings, start_ork, name="ork")
    elif service is ServiceName.PROXY:
        from crdt import CrdtError
        from nodes.proxy_inference.daemon import start_proxy
        run_daemon(settings, start_proxy, name="proxy", errors={CrdtError: str})
    elif service is ServiceName.ENTRY:
        from nodes.entry.daemon import start_entry
        run_daemon(settings, start_entry, name="entry")
    elif service is ServiceName.UI:
        from nodes.ui.daemon import start_ui
        run_daemon(settings, start_ui, name="ui")
    elif service is ServiceName.APP_NODE:
        from crdt import CrdtError
        from nodes.app_node.daemon import start_app_node
        from nodes.app_node.errors import AppNodeError
        run_daemon(settings, start_app_node, name="app-node",
                   errors={CrdtError: str, AppNodeError: str})
    elif service is ServiceName.MONITOR:
        from nodes.monitor.daemon import start_monitor
        run_daemon(settings, start_monitor, name="monitor")
    else:
        from nodes.k8s_worker.backend import BackendError
        from nodes.k8s_worker.daemon import start_worker
        from nodes.k8s_worker.store import StoreError
        run_daemon(settings, start_worker, name="worker",
                   errors={BackendError: str, StoreError: str})


def apply_config(
    service: ServiceName = typer.Argument(..., help="The daemon the config is for."),
    file: Path = typer.Argument(..., dir_okay=False, help="Settings file (TOML or .json)."),
    config_folder: Path | None = typer.Option(None, "--config-dir", help=CONFIG_DIR_HELP),
) -> None:
    """Validate a daemon's config (with the environment's overrides) and install it.

    Example: cosmicac apply-config app-node app-node.toml --config-dir /etc/cosmicac
    """
    cls = _settings_class(service)
    try:
        load_settings(cls, config_file=file, overrides={})
    except ConfigError as exc:
        fail(str(exc), code=2)
    folder = config_dir(config_folder)
    suffix = ".json" if file.suffix.lower() == ".json" else ".toml"
    target = folder / f"{service.value}{suffix}"
    tmp_name = None
    try:
        private_folder(folder)
        with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False,
                                         prefix=f".{service.value}.") as tmp:
            tmp_name = tmp.name
            with file.open("rb") as source:
                shutil.copyfileobj(source, tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.chmod(tmp_name, 0o600)
        os.replace(tmp_name, target)
        tmp_name = None
        other = folder / f"{service.value}{'.toml' if suffix == '.json' else '.json'}"
        other.unlink(missing_ok=True)  # one installed config per service
    except OSError as exc:
        fail(f"cannot install {file} into {folder}: {exc.strerror or exc}", code=1)
    finally:
        if tmp_name is not None:  # a failed copy leaves nothing behind
            Path(tmp_name).unlink(missing_ok=True)
    typer.echo(f"Installed {target}; restart {service.value} to use it "
               f"(jobs created before the restart keep their relays).")
