"""``cosmicac bootstrap``, ``wire``, ``autobase-connect`` and ``restart``: the seeds'
deployment tasks (seeds/architecture.txt, "Data stores") for the daemons run one
by one (``cosmicac run SERVICE``) under systemd (deploy/systemd/), on one host
or spread over several (deploy/README.md). ``cosmicac up`` needs none of them.

The deployment folder (``--dir``, ``COSMICAC_DEPLOY_DIR``, default
``/var/lib/cosmicac``, the units' ``StateDirectory``)::

    <dir>/deployment.json         what bootstrap was told (hosts, ports, backend, rack)
    <dir>/keys.json               each service's public key (public: copy it anywhere)
    <dir>/config/<service>.json   each daemon's config, where ``run --config-dir`` and
                                  ``apply-config --config-dir`` look
    <dir>/env/<service>.env       each unit's EnvironmentFile (``wire`` writes
                                  PROXY_AUTOBASE_KEY into proxy-inference's)
    <dir>/<service>/              each daemon's identity and state
    <dir>/wrk-monitor/http-token  wrk-monitor's HTTP bearer token (0600; kept across runs)

Which key each config names is decided in one place for ``up`` and here:
:func:`cli.up.service_configs`. Every step is safe to run again: identities are
never replaced, a config that differs from what bootstrap would write is kept
unless ``--rewrite-configs``, and the database admits a writer once.

Exit codes: 0 done; 1 failed (the message says what to fix); 2 a usage error
(unknown service, bad ``--host``); 3 (``autobase-connect``) app-node is not
running yet: start the services and run it again.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Literal

import trio
import typer
from pydantic import BaseModel, Field, ValidationError

from contracts.model import first_error
from contracts.monitor import Observability
from p2p.files import private_folder

from ._args import port_option
from ._config import write_private
from ._console import fail, out
from .up import (
    APP,
    DEFAULT_BASE_PORT,
    DHT,
    ENTRY,
    KEYED,
    LOCAL_IMAGE,
    MONITOR,
    MONITOR_TOKEN_FILE,
    ORK,
    PROXY,
    RELAY,
    UI,
    WORKER,
    Ports,
    ensure_monitor_token,
)

__all__ = ["SERVICES", "Deployment", "autobase_connect", "bootstrap", "restart", "wire"]

#: Every daemon of a deployment, in start order; the unit of each is cosmicac-<name>.
SERVICES = (DHT, RELAY, MONITOR, APP, ORK, WORKER, PROXY, UI, ENTRY)
DEFAULT_DIR = Path("/var/lib/cosmicac")
DEFAULT_HOST = "127.0.0.1"
#: Where the swarms listen: every address (the DHT learns the interfaces').
LISTEN = "0.0.0.0"
PROXY_KEY_ENV = "PROXY_AUTOBASE_KEY"
#: ``autobase-connect``'s exit code when app-node is not running yet.
NOT_RUNNING = 3


def dir_option() -> Path:
    return typer.Option(DEFAULT_DIR, "--dir", envvar="COSMICAC_DEPLOY_DIR",
                        help="The deployment folder (identities, configs, env files).")


class Deployment(BaseModel):
    """``<dir>/deployment.json``: what bootstrap was told, the defaults of its next run."""

    model_config = {"extra": "forbid"}

    #: Service (or ``dht``) -> the address the others reach it at.
    hosts: dict[str, str] = {}
    default_host: str = DEFAULT_HOST
    base_port: int = Field(default=DEFAULT_BASE_PORT, ge=1, le=65535 - 20)
    backend: Literal["local", "kubevirt"] = "kubevirt"
    kubeconfig: str | None = None
    rack_name: str = Field(default="rack-1", min_length=1, max_length=64)
    location: str = Field(default="default", min_length=1, max_length=64)
    public_url: str | None = None
    #: The operator's Loki and Prometheus: app-node sends them to wrk-monitor.
    observability: Observability = Observability()

    def host(self, service: str) -> str:
        return self.hosts.get(service, self.default_host)


# -- files -----------------------------------------------------------------------------


def _env_line(key: str) -> re.Pattern[str]:
    return re.compile(rf"^\s*(export\s+)?{re.escape(key)}\s*=(.*)$")


def update_env(path: Path, values: dict[str, str], *, replace: bool, header: str) -> str:
    """Set ``KEY=VALUE`` lines of an EnvironmentFile, keeping every other line.

    A key already set to another value is changed only if ``replace``.
    Returns ``written``, ``unchanged`` or ``kept`` (a differing value stayed).
    """
    lines = path.read_text().splitlines() if path.exists() else [header]
    changed = kept = False
    for key, value in values.items():
        pattern = _env_line(key)
        found = [i for i, line in enumerate(lines) if pattern.match(line)]
        if not found:
            lines.append(f"{key}={value}")
            changed = True
            continue
        current = pattern.match(lines[found[-1]]).group(2).strip().strip("'\"")  # type: ignore[union-attr]
        if current == value:
            continue
        if not replace:
            kept = True
            continue
        for i in reversed(found[:-1]):  # one line per key: systemd takes the last
            del lines[i]
        lines[found[-1] - (len(found) - 1)] = f"{key}={value}"
        changed = True
    if changed or not path.exists():
        write_private(path, "\n".join(lines) + "\n")
        return "written"
    return "kept" if kept else "unchanged"


def _env_header(service: str) -> str:
    return (f"# EnvironmentFile of cosmicac-{service}.service: KEY=VALUE lines "
            "(deploy/README.md, \"Config overrides\").")


def public_key(folder: Path, service: str) -> str | None:
    """``service``'s public key: from its identity in ``folder``, else ``keys.json``."""
    from p2p.keys import load_keypair

    if (folder / service / "identity").exists():
        try:
            return load_keypair(folder / service).hex
        except Exception as exc:  # IdentityError, PermissionError: say which file
            fail(f"cannot read {service}'s identity in {folder / service}: {exc}")
    try:
        return json.loads((folder / "keys.json").read_text())[service]
    except (OSError, ValueError, KeyError, TypeError):
        return None


# -- bootstrap -------------------------------------------------------------------------


def _parse_hosts(values: list[str] | None) -> dict[str, str]:
    hosts = {}
    for value in values or ():
        service, sep, address = value.partition("=")
        if not sep or service not in SERVICES:
            fail(f"--host {value!r}: expected SERVICE=ADDRESS with SERVICE one of "
                 f"{', '.join(SERVICES)}", code=2)
        hosts[service] = _parse_ip(address, f"--host {service}")
    return hosts


def _parse_ip(value: str, what: str) -> str:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        fail(f"{what}: {value!r} is not an IP address", code=2)


def _load_deployment(folder: Path) -> Deployment | None:
    path = folder / "deployment.json"
    if not path.exists():
        return None
    try:
        return Deployment.model_validate_json(path.read_text())
    except (OSError, ValidationError) as exc:
        fail(f"{path} is unusable ({' '.join(str(exc).split())}); fix or remove it")


def bootstrap(
    folder: Path = dir_option(),
    host: list[str] | None = typer.Option(
        None, "--host", help="SERVICE=ADDRESS: where the others reach SERVICE (dht, relay, "
                             "app-node, …); repeatable."),
    default_host: str | None = typer.Option(
        None, "--default-host", help="Address of every service not named by --host "
                                     "(default: 127.0.0.1, one machine)."),
    backend: str | None = typer.Option(
        None, "--backend", help="The worker's backend: kubevirt (your cluster; the default) "
                                "or local (agents as processes, to try it out)."),
    kubeconfig: str | None = typer.Option(None, "--kubeconfig",
                                          help="kubevirt: the worker's kubeconfig file."),
    rack_name: str | None = typer.Option(None, "--rack-name",
                                         help="Name of the rack registered (default rack-1)."),
    location: str | None = typer.Option(None, "--location",
                                        help="Its location (default: default)."),
    public_url: str | None = typer.Option(
        None, "--public-url", help="The URL users reach (links in emails; default: the "
                                   "entry point's http://ADDRESS:5173)."),
    base_port: int | None = port_option(
        None, "--base-port", help="Shift every port as cosmicac up does (default 49737: "
                                  "the daemons' own defaults)."),
    loki_url: str | None = typer.Option(
        None, "--loki-url", help="Your Loki (http://loki:3100): app-node gives it to "
                                 "wrk-monitor, which pushes every log record there."),
    loki_tenant: str | None = typer.Option(None, "--loki-tenant",
                                           help="X-Scope-OrgID of a multi-tenant Loki."),
    prometheus_url: str | None = typer.Option(
        None, "--prometheus-url", help="Your Prometheus (it scrapes wrk-monitor's /metrics); "
                                       "wrk-monitor reads job metrics history from it."),
    no_observability: bool = typer.Option(
        False, "--no-observability", help="Forget the Loki and Prometheus given before: "
                                          "app-node then tells wrk-monitor to stop pushing "
                                          "(with --rewrite-configs for an existing config)."),
    rewrite_configs: bool = typer.Option(
        False, "--rewrite-configs", help="Replace configs that differ from what bootstrap "
                                         "writes (identities are never replaced)."),
) -> None:
    """Prepare a deployment: identities, wired configs, wire, autobase-connect, a rack.

    Each service's identity and config (wired to the others' keys); wire;
    autobase-connect if app-node runs; one rack registered in wrk-ork's config.

    Safe to run again: it keeps identities and says what already exists; the options
    given last time (deployment.json) are the defaults.

    Example (one machine): cosmicac bootstrap --dir /var/lib/cosmicac --backend local

    Example (three hosts): cosmicac bootstrap --default-host 10.0.0.5
    --host relay=203.0.113.7 --host wrk-server-k8s-nvidia=10.0.0.6
    --kubeconfig /var/lib/cosmicac/kubeconfig
    """
    saved = _load_deployment(folder) or Deployment()
    given = {"hosts": {**saved.hosts, **_parse_hosts(host)},
             "default_host": _parse_ip(default_host, "--default-host") if default_host
             else None, "backend": backend, "kubeconfig": kubeconfig, "rack_name": rack_name,
             "location": location, "public_url": public_url, "base_port": base_port}
    observability = {k: v for k, v in (("loki_url", loki_url), ("loki_tenant", loki_tenant),
                                       ("prometheus_url", prometheus_url)) if v is not None}
    if no_observability and observability:
        fail("--no-observability forgets Loki and Prometheus: give it without "
             "--loki-url, --loki-tenant or --prometheus-url", code=2)
    if no_observability:
        saved = saved.model_copy(update={"observability": Observability()})
    elif observability:
        given["observability"] = {**saved.observability.model_dump(), **observability}
    try:
        plan = Deployment.model_validate(
            {**saved.model_dump(), **{k: v for k, v in given.items() if v is not None}})
    except ValidationError as exc:
        fail(f"bad option: {first_error(exc, 'deployment')}", code=2)
    from p2p.errors import P2PError

    try:
        refused = _bootstrap(folder.absolute(), plan, rewrite_configs)
    except OSError as exc:
        fail(f"cannot prepare {folder}: {exc.strerror or exc}"
             + (f" ({exc.filename})" if exc.filename else ""))
    except P2PError as exc:  # an identity file that cannot be used: say which
        fail(str(exc))
    if refused is not None:
        fail(f"autobase-connect: {refused}")


def _bootstrap(folder: Path, plan: Deployment, rewrite: bool) -> str | None:
    """Every step, printed as it is done; returns why autobase-connect was refused, if it was."""
    from p2p.keys import load_or_create_keypair

    from .up import service_configs

    existed = folder.exists()
    private_folder(folder)  # identities, configs with tokens, the deployment plan
    folder.chmod(0o711)  # the local backend's agents pass through to ./agents, nobody lists
    out.print(f"deployment {folder} ({'exists' if existed else 'created'})")
    write_private(folder / "deployment.json", plan.model_dump_json(indent=2) + "\n")
    try:  # a service moved to its host may have left only its public key here
        known = json.loads((folder / "keys.json").read_text())
    except (OSError, ValueError):
        known = {}
    keys = {}
    for name in KEYED:
        if (folder / name / "identity").exists():
            keys[name], state = load_or_create_keypair(folder / name).hex, "kept"
        elif isinstance(known, dict) and isinstance(known.get(name), str):
            keys[name], state = known[name], "kept (keys.json; the identity is on its host)"
        else:
            keys[name], state = load_or_create_keypair(folder / name).hex, "created"
        out.print(f"identity   {name:<22} {keys[name]}  {state}")
    write_private(folder / "keys.json", json.dumps(keys, indent=2) + "\n", 0o644)
    token_file = folder / MONITOR / MONITOR_TOKEN_FILE
    if (folder / MONITOR / "identity").exists():
        state = ensure_monitor_token(folder / MONITOR)
    else:  # kept on wrk-monitor's host with its identity
        state = "not here (on wrk-monitor's host, beside its identity)"
    out.print(f"token      {MONITOR + ' http':<22} {token_file}  {state}")

    ports = Ports.from_base(plan.base_port)
    worker: dict | None = None if plan.backend == "local" else {  # None: up's 2 x 8 GPUs
        "backend": "kubevirt",
        **({"kubevirt": {"kubeconfig": plan.kubeconfig}} if plan.kubeconfig else {})}
    configs = service_configs(
        folder, ports, keys, hosts={name: plan.host(name) for name in SERVICES},
        listen=LISTEN, worker=worker, rack={"name": plan.rack_name, "location": plan.location},
        public_url=plan.public_url,
        default_image=LOCAL_IMAGE if plan.backend == "local" else None)
    wanted = plan.observability.model_dump(exclude_none=True)
    if wanted:
        configs[APP]["observability"] = wanted
    configs[RELAY] = {"storage": str(folder / RELAY), "host": LISTEN, "port": ports.relay,
                      "bootstrap": [f"{plan.host(DHT)}:{ports.dht}"]}
    for name in SERVICES[1:]:
        path = folder / "config" / f"{name}.json"
        text = json.dumps(configs[name], indent=2) + "\n"
        state = "written"
        if path.exists():
            if path.read_text() == text:
                state = "unchanged"
            elif not rewrite:
                state = "kept (differs from bootstrap's; --rewrite-configs replaces it)"
        if state == "written":
            write_private(path, text)
        out.print(f"config     {name:<22} {path}  {state}")
    for name in SERVICES:
        path = folder / "env" / f"{name}.env"
        values = {"COSMICAC_DHT_HOST": plan.host(DHT),
                  "COSMICAC_DHT_PORT": str(ports.dht)} if name == DHT else {}
        state = update_env(path, values, replace=rewrite, header=_env_header(name))
        out.print(f"env        {name:<22} {path}  {state}")

    out.print(f"wire       {PROXY_KEY_ENV}={keys[APP]}  {_wire(folder, keys[APP])}")
    out.print(f"rack       {plan.rack_name} (location {plan.location}): worker "
              f"{keys[WORKER]} in {folder / 'config' / (ORK + '.json')}")
    refused = None
    try:
        if not (folder / APP / "identity").exists():
            raise _NotRunning("app-node runs on another host: run cosmicac autobase-connect "
                              "there")
        status = _connect_or_explain(folder / APP, keys[PROXY])
    except _NotRunning as exc:
        status = (f"not yet: {exc}; app-node admits it when it starts (database_writers in "
                  "its config): run cosmicac autobase-connect once the services run")
    except _Refused as exc:
        refused = str(exc)
        status = f"failed: {exc}"
    out.print(f"autobase-connect  proxy-inference {keys[PROXY]}: {status}")
    _next_steps(folder, plan)
    return refused


def _next_steps(folder: Path, plan: Deployment) -> None:
    units = " ".join(f"cosmicac-{name}" for name in SERVICES)
    spread = sorted({plan.host(name) for name in SERVICES})
    dir_flag = "" if folder == DEFAULT_DIR else f" --dir {folder}"
    out.print("Next steps (deploy/README.md):")
    if len(spread) > 1:
        out.print("  - copy to each host the folders, configs and env files of the services it "
                  "runs, and keys.json: " + ", ".join(
                      f"{name}@{plan.host(name)}" for name in SERVICES))
    out.print("  - install the units: sudo cp deploy/systemd/cosmicac-*.service "
              "/etc/systemd/system/ && sudo systemctl daemon-reload")
    out.print(f"  - start them (each host its own): sudo systemctl enable --now {units}")
    out.print(f"  - on app-node's host, as the user that runs it: cosmicac autobase-connect"
              f"{dir_flag}")
    out.print(f"  - give Prometheus wrk-monitor's token (every route of its HTTP side wants "
              f"it): a copy of {folder / MONITOR / MONITOR_TOKEN_FILE} readable by "
              "Prometheus, named by the scrape's authorization.credentials_file "
              "(deploy/prometheus.yml)")
    out.print("  - sign up the first admin: POST http://"
              f"{plan.host(ENTRY)}:{Ports.from_base(plan.base_port).entry}/api/auth/signup, "
              f"then cosmicac login --server http://{plan.host(ENTRY)}:"
              f"{Ports.from_base(plan.base_port).entry}")


# -- wire ------------------------------------------------------------------------------


def _wire(folder: Path, key: str) -> str:
    return update_env(folder / "env" / f"{PROXY}.env", {PROXY_KEY_ENV: key}, replace=True,
                      header=_env_header(PROXY))


def wire(
    folder: Path = dir_option(),
    key: str | None = typer.Option(
        None, "--key", help="The shared database's bootstrap key (default: app-node's "
                            "public key, from its identity or keys.json)."),
) -> None:
    """Write the shared database's key as PROXY_AUTOBASE_KEY for proxy-inference.

    The key is app-node's public key (app-node creates the database); the file is
    <dir>/env/proxy-inference.env, the unit's EnvironmentFile (it wins over the
    config's `database`). Safe to run again. Restart proxy-inference if it changed.

    Example: cosmicac wire --dir /var/lib/cosmicac && cosmicac restart proxy-inference
    """
    from ._args import parse_key

    if key is not None:
        key = parse_key(key, what="--key").hex()
    else:
        key = public_key(folder, APP)
        if key is None:
            fail(f"no app-node identity in {folder / APP} and no {folder / 'keys.json'}: "
                 "run cosmicac bootstrap first, or pass --key")
    path = folder / "env" / f"{PROXY}.env"
    try:
        state = _wire(folder, key)
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")
    if state == "written":
        out.print(f"wrote {PROXY_KEY_ENV}={key} into {path}; restart proxy-inference to use "
                  "it (cosmicac restart proxy-inference)")
    else:
        out.print(f"{PROXY_KEY_ENV}={key} is already in {path}")


# -- autobase-connect ------------------------------------------------------------------


class _NotRunning(Exception):
    """app-node does not run (or has not created the database yet): try again later."""


class _Refused(Exception):
    """The change was refused or cannot be made as things are."""


def _connect_or_explain(app_storage: Path, writer_hex: str) -> str:
    """Admit ``writer_hex`` through the app-node running on ``app_storage``; say how it went."""
    from crdt import CrdtError, WriteRefused, change_writer

    try:
        result = trio.run(functools.partial(
            change_writer, app_storage / "db", "add_writer", bytes.fromhex(writer_hex),
            identity=app_storage, require_daemon=True))
    except WriteRefused as exc:
        raise _Refused(f"{exc.code}: {exc.message}") from None
    except CrdtError as exc:
        if exc.code in ("NO_DATABASE", "DAEMON_NOT_RUNNING", "DAEMON_UNREACHABLE"):
            hint = {"NO_DATABASE": "app-node has not created the shared database yet (it does "
                                   "at its first start)",
                    "DAEMON_NOT_RUNNING": "app-node is not running",
                    }.get(exc.code, exc.message)
            raise _NotRunning(hint) from None
        if exc.code == "NO_IDENTITY":
            raise _Refused(f"{exc.message}: run it on app-node's host, as the user that runs "
                           "app-node (--dir or --app-node-storage)") from None
        raise _Refused(f"{exc.code}: {exc.message}") from None
    if result.status == "added":
        return f"admitted as a writer (via app-node, {result.via})"
    return f"already a writer (via app-node, {result.via})"


def autobase_connect(
    folder: Path = dir_option(),
    key: str | None = typer.Option(
        None, "--key", help="The key to admit (default: proxy-inference's, from its identity "
                            "or keys.json)."),
    app_storage: Path | None = typer.Option(
        None, "--app-node-storage", help="app-node's folder (default: <dir>/app-node)."),
) -> None:
    """Admit proxy-inference as a writer of the shared database (through app-node).

    The request goes to the running app-node, signed with app-node's identity: run
    it on app-node's host, as its user. Safe to run again ("already a writer").

    Exit 3 when app-node is not running yet: start the services, then run it again.

    Example: sudo -u cosmicac cosmicac autobase-connect --dir /var/lib/cosmicac
    """
    from ._args import parse_key

    if key is not None:
        writer = parse_key(key, what="--key").hex()
    else:
        found = public_key(folder, PROXY)
        if found is None:
            fail(f"no proxy-inference identity in {folder / PROXY} and no "
                 f"{folder / 'keys.json'}: run cosmicac bootstrap first, or pass --key")
        writer = found
    storage = app_storage or folder / APP
    try:
        status = _connect_or_explain(storage, writer)
    except _NotRunning as exc:
        fail(f"{exc} ({storage}): start the services (sudo systemctl start cosmicac-app-node),"
             " then run cosmicac autobase-connect again", code=NOT_RUNNING)
    except _Refused as exc:
        fail(str(exc))
    out.print(f"proxy-inference {writer}: {status}")


# -- restart ---------------------------------------------------------------------------

SYSTEMCTL_TIMEOUT_S = 120.0


def _service_name(value: str) -> str:
    name = value.strip().removesuffix(".service").removeprefix("cosmicac-")
    if name not in SERVICES:
        fail(f"unknown service {value!r}; known: {', '.join(SERVICES)}", code=2)
    return name


def restart(
    services: list[str] = typer.Argument(
        ..., help="Services to restart: dht, relay, app-node, wrk-ork, wrk-server-k8s-nvidia, "
                  "proxy-inference, entry (cosmicac-<name> works too)."),
) -> None:
    """Restart services installed as systemd units (systemctl restart cosmicac-<name>).

    For a deployment under systemd (deploy/systemd/); `cosmicac up` restarts
    crashed services itself: stop it with Ctrl-C and start it again instead.

    Example: sudo cosmicac restart wrk-server-k8s-nvidia proxy-inference
    """
    names = [_service_name(part) for value in services
             for part in re.split(r"[\s,]+", value) if part]
    if not names:
        fail("name at least one service", code=2)
    units = [f"cosmicac-{name}.service" for name in dict.fromkeys(names)]
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        fail("systemctl not found: restart works on a deployment under systemd "
             "(deploy/systemd/); inside cosmicac up, stop it and start it again")
    for unit in units:
        state = _systemctl(systemctl, "show", "--property=LoadState", "--value", unit)
        if state.stdout.strip() != "loaded":
            fail(f"{unit} is not installed ({state.stdout.strip() or state.stderr.strip()}): "
                 f"copy deploy/systemd/{unit} to /etc/systemd/system and run "
                 "systemctl daemon-reload")
    done = _systemctl(systemctl, "restart", *units)
    if done.returncode != 0:
        fail(f"systemctl restart {' '.join(units)} failed (exit {done.returncode}): "
             f"{done.stderr.strip() or done.stdout.strip()}; see journalctl -u {units[0]}")
    out.print(f"restarted {' '.join(units)}")


def _systemctl(systemctl: str, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([systemctl, *args], capture_output=True, text=True,
                              timeout=SYSTEMCTL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        fail(f"systemctl {' '.join(args)} did not finish in {SYSTEMCTL_TIMEOUT_S:.0f}s")
    except OSError as exc:
        fail(f"cannot run {systemctl}: {exc.strerror or exc}")
