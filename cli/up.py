"""``cosmicac up``: the whole embedded deployment on this machine, until Ctrl-C.

Every daemon runs as its own process (``cosmicac run SERVICE --config FILE``,
``cosmicac relay``, ``cosmicac dht bootstrap``), as in a multi-host
deployment, under :class:`cli._supervisor.Supervisor`: started in dependency
order on their ready lines, restarted with backoff, stopped in reverse order.

Wiring is decided before anything starts: each service's key is created
first (:func:`p2p.keys.load_or_create_keypair` on its folder), so every
config can name the keys of the services it talks to. The layout::

    <storage>/.cosmicac-up        marker: --reset deletes only such a folder
    <storage>/config/<service>.json
    <storage>/<service>/          each daemon's identity and state
    <storage>/logs/<service>.log
    <storage>/credentials.json    the admin and an API key (first start)
    <storage>/wrk-monitor/http-token  wrk-monitor's HTTP bearer token (0600; first start)
    <storage>/agents/<vmi-disk>/  each local agent's own folder (config, storage),
                                  0700 and its own user's (see nodes/k8s_worker/local.py)

The storage folder is 0711: others may pass through it (an agent running as a
user of its own reaches its folder) but not list it; every daemon's folder in it
is its own business (0700).

On the way out the local backend's agent processes are stopped too: they
live in sessions of their own so that they outlive a worker restart, as VMIs
outlive a worker pod, but nothing may outlive ``up``.

``cosmicac up --node-only`` (or any of the old node options) is the previous
``up``: one peer that is a DHT bootstrap and serves a shared database.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import trio
import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from p2p.files import private_file, private_folder

from ._args import config_option, port_option
from ._config import write_private
from ._console import err, fail
from ._supervisor import ServiceSpec, StartFailed, Supervisor

__all__ = ["MONITOR_TOKEN_FILE", "Ports", "build_specs", "ensure_monitor_token",
           "service_configs", "up"]

MARKER = ".cosmicac-up"
#: ``--base-port``'s default: the relay's default port, the lowest of the daemons'
#: (tests/cli/test_up.py checks they agree; importing relay here costs a tenth of a second).
DEFAULT_BASE_PORT = 49737
ADMIN_EMAIL = "admin@cosmicac.local"
#: Jobs' default image here: the local backend runs agents as processes and never
#: pulls it, but the API wants a registry image for every job.
LOCAL_IMAGE = "docker://localhost/cosmicac/local:latest"
HOST = "127.0.0.1"
COSMICAC = (sys.executable, "-m", "cli.main")
#: Names of the environment that configure the single node (the old ``up``).
_NODE_ENV_PREFIX = "COSMICAC_NODE__"
_NODE_LEGACY_ENV = ("COSMICAC_STORAGE", "COSMICAC_HOST", "COSMICAC_PORT",
                    "COSMICAC_METRICS_PORT", "COSMICAC_METRICS_HOST", "COSMICAC_DB_ALLOW")

RELAY, DHT, APP, ORK, WORKER, PROXY, MONITOR, UI, ENTRY = (
    "relay", "dht", "app-node", "wrk-ork", "wrk-server-k8s-nvidia", "proxy-inference",
    "wrk-monitor", "ui", "entry")
KEYED = (RELAY, APP, ORK, WORKER, PROXY, MONITOR)
#: wrk-monitor's HTTP bearer token, in its folder (``http.token_file``).
MONITOR_TOKEN_FILE = "http-token"


def ensure_monitor_token(folder: Path) -> str:
    """wrk-monitor's HTTP token file in ``folder``: kept when there, else a new random
    token written 0600 (whatever the umask). Returns ``created`` or ``kept``.

    Every route of wrk-monitor's HTTP side wants it (nodes/monitor/_http.py): the
    operator's and Prometheus' (``credentials_file``); users read logs through app-node.
    """
    path = folder / MONITOR_TOKEN_FILE
    if path.exists():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return "kept"
    write_private(path, secrets.token_urlsafe(32) + "\n")
    return "created"


@dataclass(frozen=True)
class Ports:
    """Every port ``up`` uses, shifted together by ``--base-port``."""

    relay: int
    dht: int
    worker: int
    ork: int
    proxy: int
    app: int
    monitor: int
    proxy_http: int
    app_http: int
    monitor_http: int
    ui: int
    entry: int

    @classmethod
    def from_base(cls, base: int) -> Ports:
        # Each daemon's own default (its settings'), all moved by base minus the
        # relay's (the lowest); the entry point keeps 5173 unless shifted.
        defaults = default_ports()
        shift = base - defaults["relay"]
        entry = defaults["entry"] if shift == 0 else base + 20
        return cls(**{name: port + shift for name, port in defaults.items()
                      if name != "entry"}, entry=entry)


@functools.cache
def default_ports() -> dict[str, int]:
    """Each port's default, read from the settings of the daemon that listens on it.

    The DHT bootstrap's own default is the relay's port (they do not meet outside
    ``up``): here it takes the next one.
    """
    # Imported here: the daemons' settings are most of a second to import, which
    # `cosmicac deploy ...` and the tests of the wiring need not pay.
    from nodes.app_node.settings import AppNodeSettings
    from nodes.entry.settings import EntrySettings
    from nodes.k8s_worker.settings import WorkerSettings
    from nodes.monitor.settings import MonitorSettings
    from nodes.ork.settings import OrkSettings
    from nodes.proxy_inference.settings import ProxySettings
    from nodes.ui.settings import UiSettings
    from relay import RelaySettings

    relay = _default(RelaySettings, "port")
    return {"relay": relay, "dht": relay + 1, "worker": _default(WorkerSettings, "port"),
            "ork": _default(OrkSettings, "port"), "proxy": _default(ProxySettings, "port"),
            "app": _default(AppNodeSettings, "port"),
            "monitor": _default(MonitorSettings, "port"),
            "proxy_http": _default(ProxySettings, "http", "port"),
            "app_http": _default(AppNodeSettings, "http", "port"),
            "monitor_http": _default(MonitorSettings, "http", "port"),
            "ui": _default(UiSettings, "port"),
            "entry": _default(EntrySettings, "port")}


def _default(model: type[BaseModel], *path: str) -> int:
    """The default of ``model``'s field at ``path`` (``"http", "port"``)."""
    value: object = model
    for name in path:
        if isinstance(value, type) and issubclass(value, BaseModel):
            info = value.model_fields[name]
            default = info.get_default(call_default_factory=True)
            value = info.annotation if default is PydanticUndefined else default
        else:
            value = getattr(value, name)
    assert isinstance(value, int), f"{model.__name__}.{'.'.join(path)} has no default port"
    return value


def _addr(port: int) -> str:
    return f"{HOST}:{port}"


#: The folder (in the deployment's) of the local backend's agents: 0711, each
#: agent's own folder in it 0700 and owned by the agent's user.
AGENTS = "agents"
#: The worker's backend in ``up``: agents as local processes on 2 simulated nodes.
LOCAL_BACKEND: dict = {"backend": "local", "local": {"nodes": [
    {"name": "local-node-1", "gpus": 8}, {"name": "local-node-2", "gpus": 8}]}}


def local_backend(storage: Path) -> dict:
    """:data:`LOCAL_BACKEND` with the agents' own folders beside the daemons' (not in
    the worker's storage, so that stays 0700 while each agent reaches its own)."""
    return {**LOCAL_BACKEND, "local": {**LOCAL_BACKEND["local"],
                                       "agents_dir": str(storage / AGENTS)}}


def service_configs(storage: Path, ports: Ports, keys: dict[str, str], *,
                    hosts: Mapping[str, str] | None = None, listen: str = HOST,
                    worker: Mapping[str, object] | None = None,
                    rack: Mapping[str, str] | None = None,
                    public_url: str | None = None,
                    default_image: str | None = None) -> dict[str, dict]:
    """Each service's config, wired to the others' keys and addresses.

    The one place the wiring is decided, for ``up`` (every default: all on
    127.0.0.1) and ``cosmicac bootstrap`` (cli/deploy.py, services spread
    over hosts). ``hosts`` maps a service (or ``dht``) to the address the
    others reach it at (HTTP servers listen there too); ``listen`` is where
    the swarms listen; ``worker`` the worker's backend settings; ``rack`` the
    rack wrk-ork registers for the worker; ``default_image`` the image of
    jobs that name none (app-node's setting; ``None``: they must name one).
    """
    def at(name: str) -> str:
        return (hosts or {}).get(name, HOST)

    bootstrap = [f"{at(DHT)}:{ports.dht}"]
    relays = [keys[RELAY]]
    # Where the relay listens: every peer (and, through app-node's /api/swarm, every
    # user's CLI) reaches it there with no DHT (seeds/relay.txt).
    relay_addresses = {keys[RELAY]: [f"{at(RELAY)}:{ports.relay}"]}
    ork_addresses = [f"{at(ORK)}:{ports.ork}"]
    monitor_addresses = [f"{at(MONITOR)}:{ports.monitor}"]
    # Every daemon ships its log records to wrk-monitor (nodes/kit/telemetry.py);
    # app-node ships to the monitor it already reads logs from.
    telemetry = {"monitor": keys[MONITOR], "monitor_addresses": monitor_addresses}
    return {
        APP: {"storage": str(storage / APP), "host": listen, "port": ports.app,
              "bootstrap": bootstrap, "relays": relays, "relay_addresses": relay_addresses,
              "ork": keys[ORK],
              "ork_addresses": ork_addresses, "database_writers": [keys[PROXY]],
              "monitor": keys[MONITOR], "monitor_addresses": monitor_addresses,
              "http": {"host": at(APP), "port": ports.app_http},
              "public_url": public_url or f"http://{at(ENTRY)}:{ports.entry}",
              # the door (entry point or Caddy), and the web UI behind it, say who
              # their client was: app-node's rate limits and login throttles believe
              # X-Forwarded-For from them only
              "limits": {"trusted_proxies": sorted({at(ENTRY), at(UI)})},
              **({"default_image": default_image} if default_image else {})},
        ORK: {"storage": str(storage / ORK), "host": listen, "port": ports.ork,
              "bootstrap": bootstrap, "relays": relays, "relay_addresses": relay_addresses,
              # Each caller exactly its role (nodes/ork/access.py): app-node every
              # method, the proxy reading and following jobs; the worker speaks
              # only the queue of its rack, below.
              "app_nodes": [keys[APP]], "proxies": [keys[PROXY]],
              "racks": [{"key": keys[WORKER], **(rack or {"name": "local"})}],
              "telemetry": telemetry},
        WORKER: {"storage": str(storage / WORKER), "host": listen, "port": ports.worker,
                 "ork": keys[ORK], "ork_addresses": ork_addresses,
                 "interconnect": {"bootstrap": bootstrap, "proxies": [keys[PROXY]],
                                  "relays": relays, "relay_addresses": relay_addresses},
                 "telemetry": telemetry,
                 **(local_backend(storage) if worker is None else worker)},
        PROXY: {"storage": str(storage / PROXY), "host": listen, "port": ports.proxy,
                "database": keys[APP], "bootstrap": bootstrap, "relays": relays,
                "relay_addresses": relay_addresses,
                "ork": keys[ORK], "ork_addresses": ork_addresses,
                "http": {"host": at(PROXY), "port": ports.proxy_http},
                "telemetry": telemetry},
        # The daemons above ship their logs to it (pushers); the proxy pushes its
        # per-job windows (proxies), the worker its agents' figures (workers);
        # app-node reads for `cosmicac jobs logs` and sets Loki (followers). Each
        # list is exactly who needs it (nodes/monitor/service.py, METHOD_ROLES).
        # Its HTTP side wants the token in its folder (ensure_monitor_token); the
        # entry point in front of it names the client in X-Forwarded-For.
        MONITOR: {"storage": str(storage / MONITOR), "host": listen, "port": ports.monitor,
                  "bootstrap": bootstrap, "relays": relays, "relay_addresses": relay_addresses,
                  "followers": [keys[APP]],
                  "pushers": [keys[name] for name in (APP, ORK, WORKER, PROXY)],
                  "proxies": [keys[PROXY]], "workers": [keys[WORKER]],
                  "http": {"host": at(MONITOR), "port": ports.monitor_http,
                           "token_file": str(storage / MONITOR / MONITOR_TOKEN_FILE),
                           "trusted_proxies": [at(ENTRY)]}},
        # The web UI speaks to app-node's public API only, as a browser's user would.
        UI: {"host": at(UI), "port": ports.ui, "api_url": f"http://{at(APP)}:{ports.app_http}",
             "trusted_proxies": [at(ENTRY)]},
        ENTRY: {"host": at(ENTRY), "port": ports.entry,
                "api_url": f"http://{at(APP)}:{ports.app_http}",
                "inference_url": f"http://{at(PROXY)}:{ports.proxy_http}",
                "monitor_url": f"http://{at(MONITOR)}:{ports.monitor_http}",
                "ui_url": f"http://{at(UI)}:{ports.ui}"},
    }


def qemu_backend(image: Path) -> dict:
    """The worker's backend in ``up --backend qemu``: every VMI a VM of this machine,
    booted from ``image`` (``make image``), on one node reporting 8 GPUs with no
    device behind them (a machine with GPUs lists them: ``qemu.gpus``). Sized for a
    workstation, not a GPU server: 2 vCPUs and 2 GiB per VM share of a GPU (the
    backend's defaults, 4 and 8 GiB per GPU, are for real GPU jobs)."""
    return {"backend": "qemu", "qemu": {"image": str(image), "node": "qemu-node-1",
                                        "unbacked_gpus": 8, "cpus_per_gpu": 2,
                                        "memory_mib_per_gpu": 2048}}


def build_specs(storage: Path, ports: Ports, keys: dict[str, str], *,
                worker: Mapping[str, object] | None = None) -> list[ServiceSpec]:
    """Write each service's config under ``<storage>/config`` and return the specs."""
    config_dir = storage / "config"
    private_folder(config_dir)  # configs carry tokens and keys
    bootstrap = [_addr(ports.dht)]
    configs = service_configs(storage, ports, keys, default_image=LOCAL_IMAGE, worker=worker)
    files = {}
    for name, config in configs.items():
        path = config_dir / f"{name}.json"
        write_private(path, json.dumps(config, indent=2) + "\n")
        files[name] = str(path)

    def run(name: str) -> tuple[str, ...]:
        return (*COSMICAC, "run", name, "--config", files[name])

    # Each waits for its daemon's ready line on stdout (nodes/kit/ready.py).
    return [
        # The DHT and the relay stop last: every other daemon unannounces through
        # them on its way out (a Ctrl-C then takes 0.2 s, not 2).
        ServiceSpec(DHT, (*COSMICAC, "dht", "bootstrap", "--host", HOST, "--port",
                          str(ports.dht)), ready="dht-bootstrap", outlives_dependants=True),
        ServiceSpec(RELAY, (*COSMICAC, "relay", "--storage", str(storage / RELAY), "--host",
                            HOST, "--port", str(ports.relay), "--bootstrap", bootstrap[0]),
                    ready="relay", depends_on=(DHT,), outlives_dependants=True),
        ServiceSpec(MONITOR, run(MONITOR), ready="wrk-monitor", depends_on=(DHT, RELAY)),
        ServiceSpec(APP, run(APP), ready="app-node", depends_on=(DHT, RELAY, MONITOR)),
        ServiceSpec(ORK, run(ORK), ready="wrk-ork", depends_on=(DHT, RELAY, APP)),
        ServiceSpec(WORKER, run(WORKER), ready="wrk-server-k8s-nvidia", depends_on=(ORK,)),
        ServiceSpec(PROXY, run(PROXY), ready="proxy-inference",
                    depends_on=(APP, ORK, WORKER)),
        ServiceSpec(UI, run(UI), ready="ui", depends_on=(APP,)),
        ServiceSpec(ENTRY, run(ENTRY), ready="entry", depends_on=(APP, PROXY, MONITOR, UI)),
    ]


def up(
    storage: Path | None = typer.Option(
        None, "--storage", help="The deployment's folder (default: .cosmicac)."),
    reset: bool = typer.Option(False, "--reset",
                               help="Delete the storage folder first (only one up made)."),
    no_table: bool = typer.Option(False, "--no-table",
                                  help="One line per state change instead of a live table."),
    base_port: int = port_option(
        DEFAULT_BASE_PORT, "--base-port",
        help="Shift every port: relay BASE, DHT BASE+1 … app-node HTTP BASE+14, "
             "entry BASE+20 (5173 at the default)."),
    backend: str = typer.Option(
        "local", "--backend",
        help="local: jobs' agents as processes of this machine; qemu: each job a VM "
             "booted from the guest image (make image; needs qemu-system-x86)."),
    image: Path | None = typer.Option(
        None, "--image", help="--backend qemu: the guest image (default: "
                              "build/image/cosmicac-guest.qcow2 of this checkout)."),
    node_only: bool = typer.Option(
        False, "--node-only", help="Run only the single node of before: a DHT bootstrap "
                                   "serving a shared database (the options below)."),
    config: Path | None = config_option(),
    host: str | None = typer.Option(None, "--host", help="--node-only: (default: 127.0.0.1)"),
    port: int | None = port_option(None, "--port", help="--node-only: the node's port."),
    log_level: str | None = typer.Option(None, "--log-level", help="--node-only."),
    metrics_port: int | None = port_option(None, "--metrics-port", help="--node-only."),
    metrics_host: str | None = typer.Option(None, "--metrics-host", help="--node-only."),
    db_allow: list[str] | None = typer.Option(None, "--db-allow", help="--node-only."),
    db_readers: list[str] | None = typer.Option(None, "--db-reader", help="--node-only."),
) -> None:
    """Run the whole system on this machine until Ctrl-C.

    DHT bootstrap, relay, app-node, wrk-ork, a local GPU worker (2 simulated
    nodes of 8 GPUs), proxy-inference, wrk-monitor and the entry point on
    http://127.0.0.1:5173, each its own process, restarted if it exits. The first
    start creates an admin and an API key (in <storage>/credentials.json); every
    start logs this machine's CLI in.

    Example: cosmicac up --storage .cosmicac

    Example: cosmicac up --reset --base-port 30000 --no-table
    """
    node_options = (config, host, port, log_level, metrics_port, metrics_host, db_allow,
                    db_readers)
    node_env = any(name.startswith(_NODE_ENV_PREFIX) or name in _NODE_LEGACY_ENV
                   for name in os.environ)
    if node_only or any(option is not None for option in node_options) or node_env:
        from .node import up as node_up
        node_up(config=config, storage=storage, host=host, port=port, log_level=log_level,
                metrics_port=metrics_port, metrics_host=metrics_host, db_allow=db_allow,
                db_readers=db_readers)
        return
    storage = (storage or Path(".cosmicac")).absolute()
    worker = _worker_backend(backend, image)
    if not 1 <= base_port <= 65535 - 20:
        fail(f"--base-port {base_port} leaves no room for the 20 ports above it", code=2)
    if reset and storage.exists():
        if not (storage / MARKER).exists():
            fail(f"{storage} was not made by cosmicac up (no {MARKER}); not deleting it",
                 code=2)
        shutil.rmtree(storage)
    try:
        private_folder(storage)  # every daemon's storage, configs, logs and credentials
        storage.chmod(0o711)  # agents of their own users pass through to ./agents
        private_file(storage / MARKER)
        from p2p.keys import load_or_create_keypair
        keys = {name: load_or_create_keypair(storage / name).hex for name in KEYED}
        ensure_monitor_token(storage / MONITOR)
        specs = build_specs(storage, Ports.from_base(base_port), keys, worker=worker)
    except OSError as exc:
        fail(f"cannot prepare {storage}: {exc.strerror or exc}")
    table = not no_table and sys.stdout.isatty()
    code = trio.run(_run, storage, Ports.from_base(base_port), specs, table)
    raise typer.Exit(code)


def _worker_backend(backend: str, image: Path | None) -> dict | None:
    """The worker's backend settings for ``--backend`` (None: the local default)."""
    if backend == "local":
        if image is not None:
            fail("--image goes with --backend qemu", code=2)
        return None
    if backend != "qemu":
        fail(f"--backend {backend!r}: choose local or qemu (kubevirt needs a cluster: "
             "cosmicac bootstrap, deploy/README.md)", code=2)
    image = (image or Path(__file__).resolve().parent.parent / "build" / "image"
             / "cosmicac-guest.qcow2").absolute()
    if not image.is_file() or not (image.parent / "image.json").is_file():
        fail(f"no guest image at {image}: build it with `make image` (deploy/image)", code=2)
    if shutil.which("qemu-system-x86_64") is None:
        fail("qemu-system-x86_64 is not installed (Debian: apt install qemu-system-x86)",
             code=2)
    return qemu_backend(image)


async def _run(storage: Path, ports: Ports, specs: list[ServiceSpec], table: bool) -> int:
    supervisor = Supervisor(specs, log_dir=storage / "logs", stop_timeout_s=4.0)
    code = 0
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                async def until_signalled() -> None:
                    async for signum in signals:
                        err.print(f"{signal.Signals(signum).name}: stopping", markup=False)
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(until_signalled)
                nursery.start_soon(_show, supervisor, table)
                try:
                    await nursery.start(supervisor.run)
                except StartFailed as exc:
                    err.print(f"error: {exc}", markup=False)
                    code = 1
                    nursery.cancel_scope.cancel()
                    return code
                try:
                    await _credentials(storage, ports)
                except _SetupError as exc:
                    err.print(f"error: {exc}", markup=False)
                    code = 1
                    nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await _stop_agents(storage)
    return code


async def _stop_agents(storage: Path) -> None:
    """Stop the local backend's agents and the qemu backend's VMs, which outlive the
    worker by design."""
    from nodes.k8s_worker.backend import BackendError
    from nodes.k8s_worker.local import LocalBackend, LocalClusterSettings

    backend = LocalBackend(LocalClusterSettings(stop_grace_s=3.0, agents_dir=storage / AGENTS),
                           storage / WORKER / "vmis")
    with trio.move_on_after(10):
        try:
            stopped = await backend.stop_all()
        except BackendError as exc:
            err.print(f"error: {exc}", markup=False)
            return
        if stopped:
            err.print(f"stopped {stopped} agent processes", markup=False)
    vms = storage / WORKER / "vms"
    if vms.is_dir():
        from nodes.k8s_worker.qemu import QemuBackend, QemuSettings

        # The power button first: a guest given a few seconds keeps a clean disk.
        with trio.move_on_after(20):
            try:
                stopped = await QemuBackend(QemuSettings(stop_grace_s=8.0), vms).stop_all()
            except BackendError as exc:
                err.print(f"error: {exc}", markup=False)
                return
            if stopped:
                err.print(f"powered off {stopped} VMs", markup=False)


async def _show(supervisor: Supervisor, table: bool) -> None:
    """The live status table, or one line per state change."""
    if table:
        from rich.live import Live
        from rich.table import Table

        def render(width: int = 120) -> Table:
            room = max(10, width - 70)  # what the other columns leave the last line
            out = Table(title="cosmicac up (Ctrl-C stops everything)")
            out.add_column("service", no_wrap=True, min_width=21)
            out.add_column("state", no_wrap=True, min_width=10)
            for column in ("pid", "restarts", "uptime"):
                out.add_column(column, no_wrap=True, min_width=len(column))
            out.add_column("last line", no_wrap=True)
            for row in supervisor.rows():
                out.add_row(str(row["service"]), str(row["state"]), str(row["pid"] or ""),
                            str(row["restarts"]),
                            "" if row["uptime_s"] is None else f"{row['uptime_s']:.0f}s",
                            _clip(str(row["last"]), room))
            return out

        with Live(render(), auto_refresh=False, transient=False) as live:
            while True:
                live.update(render(live.console.width), refresh=True)
                await trio.sleep(0.5)
    states: dict[str, tuple] = {}
    while True:
        for row in supervisor.rows():
            now = (row["state"], row["pid"], row["restarts"])
            if states.get(str(row["service"])) != now:
                states[str(row["service"])] = now
                print(f"{row['service']}: {row['state']} pid {row['pid']} "
                      f"restarts {row['restarts']}", flush=True)
        await trio.sleep(0.2)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


class _SetupError(Exception):
    """The admin or its API key could not be created."""


async def _credentials(storage: Path, ports: Ports) -> None:
    """First start: sign the admin up and create an API key; print how to use them."""
    path = storage / "credentials.json"
    if path.exists():
        creds = json.loads(path.read_text())
        first = False
    else:
        # Abandoned on Ctrl-C: the stop must not wait out an HTTP timeout.
        creds = await trio.to_thread.run_sync(_sign_up, ports, abandon_on_cancel=True)
        write_private(path, json.dumps(creds, indent=2) + "\n")
        first = True
    cli_session = await trio.to_thread.run_sync(_log_cli_in, creds, abandon_on_cancel=True)
    print(f"cosmicac is up at {creds['url']} ({'created' if first else 'from'} {path})",
          flush=True)
    print(f"  email {creds['email']}  password {creds['password']}", flush=True)
    print(f"  API key {creds['api_key']}", flush=True)
    print(f"  {cli_session}", flush=True)
    print(f"  OpenAI base URL {creds['url']}/inference/v1 (the API key as bearer)",
          flush=True)
    token = storage / MONITOR / MONITOR_TOKEN_FILE
    print(f"  wrk-monitor {creds['url']}/monitor/metrics (operators, Prometheus): "
          f"Authorization: Bearer $(cat {token})", flush=True)
    print("Ctrl-C stops everything.", flush=True)


def _log_cli_in(creds: dict[str, str]) -> str:
    """Log this machine's CLI in as the admin, unless it has a session elsewhere.

    A session on another server is the user's own choice and is kept; one on
    this URL is replaced when it is missing, expiring or refused (after
    ``--reset`` the old token means nothing). Returns a line saying which.
    """
    import httpx

    from p2p.errors import P2PError
    from p2p.keys import load_or_create_keypair

    from ._config import config_dir
    from .session import SavedSession, load_session, save_session

    url = creds["url"]
    login_hint = f"cosmicac login --server {url} --email {creds['email']}"
    session = load_session()
    if session is not None and session.server != url:
        return f"the CLI stays logged in to {session.server}; to use this one: {login_hint}"
    try:
        with httpx.Client(base_url=f"{url}/api", timeout=30.0) as client:
            if session is not None and session.expires_at > time.time() + 3600:
                me = client.get("/me", headers={"authorization": f"Bearer {session.token}"})
                if me.is_success:
                    return f"the CLI is logged in as {session.email} (cosmicac whoami)"
            keypair = load_or_create_keypair(config_dir(None) / "user")
            answer = client.post("/auth/login", json={
                "email": creds["email"], "password": creds["password"],
                "cli_public_key": keypair.hex})
            answer.raise_for_status()
            body = answer.json()
        save_session(SavedSession(server=url, token=body["token"],
                                  expires_at=body["expires_at"], email=creds["email"]))
    except (httpx.HTTPError, P2PError, OSError, ValueError, KeyError) as exc:
        return f"the CLI could not be logged in ({exc}); log in with: {login_hint}"
    return f"the CLI is logged in as {creds['email']} (try: cosmicac whoami)"


def _sign_up(ports: Ports) -> dict[str, str]:
    import httpx

    api = f"http://{HOST}:{ports.app_http}/api"
    password = secrets.token_urlsafe(18)
    try:
        with httpx.Client(timeout=30.0) as client:
            answer = client.post(f"{api}/auth/signup", json={
                "email": ADMIN_EMAIL, "name": "admin", "password": password,
                "team_name": "default"})
            if answer.status_code == 409:
                raise _SetupError("app-node already has users but credentials.json is "
                                  "missing; use --reset to start afresh")
            answer.raise_for_status()
            token = answer.json()["token"]
            answer = client.post(f"{api}/apikeys", json={"name": "cosmicac-up"},
                                 headers={"authorization": f"Bearer {token}"})
            answer.raise_for_status()
            api_key = answer.json()["key"]
    except httpx.HTTPError as exc:
        raise _SetupError(f"cannot create the admin through {api}: {exc}") from None
    return {"url": f"http://{HOST}:{ports.entry}", "email": ADMIN_EMAIL,
            "password": password, "api_key": api_key}
