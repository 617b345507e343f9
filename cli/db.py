"""``cosmicac db``: run and inspect a replica of the shared database.

``serve`` keeps a replica on the swarm (the creator prints the database's
bootstrap key; a replica started with ``PROXY_AUTOBASE_KEY=<key>`` opens that
database and asks to be admitted as a writer). ``status`` and ``verify`` read
a replica's files, also while a daemon runs on them.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Annotated

import trio
import typer
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from crdt import (
    CrdtError,
    FsyncPolicy,
    ReplicationConfig,
    change_writer,
    inspect_storage,
    run_database_service,
    verify_storage,
)
from p2p.daemon import (
    AddressList,
    Daemon,
    DaemonError,
    DaemonSettings,
    Port,
    PublicKey,
    PublicKeyList,
    run_daemon,
)
from p2p.errors import P2PError
from p2p.keys import format_key, load_or_create_keypair
from p2p.swarm import Swarm, SwarmConfig

from ._args import (
    config_option,
    load_settings_or_exit,
    parse_key,
    parse_keys,
    port_option,
    wildcard_for,
)
from ._console import OutputFormat, fail, out, print_json
from .dht import parse_bootstrap
from .relay import parse_allow

__all__ = ["DbSettings", "app"]

log = logging.getLogger("cosmicac.db")

app = typer.Typer(help="The shared database (API keys, model masters, token usage).",
                  no_args_is_help=True)

STORAGE_HELP = "Storage folder of the replica (its identity, logs and view)."


class DbSettings(DaemonSettings):
    """Settings of ``cosmicac db serve``: ``COSMICAC_DB__<KEY>`` in the environment.

    ``PROXY_AUTOBASE_KEY`` (the platform's name, seeds/architecture.txt) and
    the names from before the kit (:attr:`legacy_env`) still work, below the
    prefixed ones.
    """

    model_config = SettingsConfigDict(env_prefix="COSMICAC_DB__")

    legacy_env = {
        **DaemonSettings.legacy_env,
        "COSMICAC_STORAGE": "storage",
        "PROXY_AUTOBASE_KEY": "key",
        "COSMICAC_DHT_BOOTSTRAP": "bootstrap",
        "COSMICAC_RELAYS": "relays",
        "COSMICAC_DB_ALLOW": "allow",
        "COSMICAC_DB_METRICS_PORT": "metrics.port",
    }

    #: The replica's folder (identity, logs, view).
    storage: Path
    #: Bootstrap key of the database to open; None: the one in ``storage``, or
    #: a new one with this replica as its first admin.
    key: PublicKey | None = None
    #: DHT bootstrap nodes (at least one).
    bootstrap: Annotated[AddressList, Field(min_length=1)]
    #: Address to listen on; empty: every address of the bootstrap's family.
    host: str = ""
    #: TCP and UDP port of the swarm (0: any free one).
    port: Port = 0
    #: Blind relays to stay reachable through.
    relays: PublicKeyList = ()
    #: Keys admitted as writers when they ask (this replica must be an admin).
    allow: PublicKeyList = ()
    #: Read-only replicas served. Only they, ``allow`` and the admitted writers
    #: may read this replica (the logs hold every team's keys and usage).
    readers: PublicKeyList = ()
    #: ``always``: an append returns once on disk; ``never``: tests and benchmarks only.
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS


@app.command("serve")
def serve(
    config: Path | None = config_option(),
    storage: Path | None = typer.Option(None, "--storage", help=STORAGE_HELP),
    key: str | None = typer.Option(
        None, "--key",
        help="Bootstrap key of the database to open; none: open the one in --storage, "
             "or create a new one with this replica as its first admin."),
    bootstrap: str | None = typer.Option(
        None, "--bootstrap", "-b", help="DHT bootstrap nodes HOST:PORT[,HOST:PORT...]."),
    host: str | None = typer.Option(None, "--host",
                                    help="Address to listen on (default: all)."),
    port: int | None = port_option(None, "--port", "-p",
                                   help="TCP and UDP port (0: any free one)."),
    relays: str | None = typer.Option(None, "--relay",
                                      help="Blind relay keys to stay reachable through "
                                           "(comma-separated)."),
    allow: list[str] | None = typer.Option(
        None, "--allow",
        help="Key admitted as a writer when it asks (repeatable or comma-separated); "
             "this replica must be an admin."),
    readers: list[str] | None = typer.Option(
        None, "--reader",
        help="Key of a read-only replica this one serves (repeatable or comma-separated). "
             "Only readers, --allow keys and admitted writers may read this replica."),
    fsync: FsyncPolicy | None = typer.Option(
        None, "--fsync",
        help="always: an append returns once on disk; never: tests and benchmarks only. "
             "(default: always)"),
    metrics_port: int | None = port_option(
        None, "--metrics-port", help="Serve Prometheus metrics on this port (0: off)."),
    metrics_host: str | None = typer.Option(None, "--metrics-host",
                                            help="(default: 127.0.0.1)"),
    log_level: str | None = typer.Option(None, "--log-level", help="(default: info)"),
) -> None:
    """Keep a replica of the shared database and replicate it with its peers.

    Every option can also be set in the --config file or as an environment
    variable COSMICAC_DB__<KEY> (README.md lists the keys).

    Example: cosmicac db serve --storage /var/lib/cosmicac/db --bootstrap 10.0.0.2:49737
    """
    allowed = parse_allow(allow)
    reader_keys = parse_allow(readers, what="--reader key")
    relay_keys = parse_keys(relays, what="--relay key") if relays else []
    settings = load_settings_or_exit(DbSettings, config, {
        "storage": storage,
        "key": parse_key(key, what="--key") if key is not None and key.strip() else None,
        "bootstrap": tuple(parse_bootstrap(bootstrap)) if bootstrap is not None else None,
        "host": host,
        "port": port,
        "relays": tuple(relay_keys) or None,
        "allow": tuple(allowed) if allowed else None,
        "readers": tuple(reader_keys) if reader_keys else None,
        "fsync": fsync,
        "metrics.port": metrics_port,
        "metrics.host": metrics_host,
        "log_level": log_level,
    })
    swarm_config = SwarmConfig(host=settings.host or wildcard_for(settings.bootstrap),
                               port=settings.port, bootstrap=settings.bootstrap,
                               relays=settings.relays)

    def os_error(exc: BaseException) -> str:
        assert isinstance(exc, OSError)
        if exc.filename is not None:  # a file of the replica, not a socket
            return f"cannot use {exc.filename}: {exc.strerror or exc}"
        return (f"cannot listen on {swarm_config.host}:{swarm_config.port}: "
                f"{exc.strerror or exc}")

    run_daemon(settings, functools.partial(_start, swarm_config), name="db", errors={
        CrdtError: str,
        OSError: os_error,
    })


async def _start(swarm_config: SwarmConfig, daemon: Daemon[DbSettings]) -> None:
    settings = daemon.settings
    try:
        keypair = load_or_create_keypair(daemon.storage)
    except P2PError as exc:
        raise DaemonError(str(exc)) from None
    # One peer: the database is a service on this daemon's one swarm, and the
    # metrics go on the process's one endpoint (the kit's).
    swarm = Swarm(keypair, config=swarm_config)
    address = await daemon.nursery.start(swarm.run)
    service = await daemon.nursery.start(functools.partial(
        run_database_service, daemon.storage, swarm=swarm, bootstrap=settings.key,
        allow=frozenset(settings.allow), readers=frozenset(settings.readers),
        fsync=settings.fsync,
        replication=ReplicationConfig()))
    daemon.metrics.add(service.db.metrics.registry, swarm.metrics.registry)
    db = service.db
    print(f"Database {format_key(db.bootstrap)}", flush=True)
    role = "admin" if db.is_admin else "writer" if db.is_writer else "reader (not admitted)"
    print(f"Replica {format_key(db.key)} ({role}) listening on "
          f"{address[0]}:{address[1]}", flush=True)
    if not db.is_writer:
        daemon.nursery.start_soon(_announce_admission, db)


async def _announce_admission(db) -> None:
    """Say on stdout when an admin has added us (what `task autobase-connect` waits for)."""
    while not db.is_writer:
        await db.wait_changed(db.lengths, 3600)
    print(f"Admitted as a writer of {format_key(db.bootstrap)}", flush=True)


def _identity_option() -> Path | None:
    return typer.Option(None, "--identity", help="The folder of the replica's identity, if "
                                                 "not --storage (app-node's: its storage, "
                                                 "with the database in <storage>/db).")


@app.command("add-writer")
def add_writer_command(
    key: str = typer.Argument(..., help="Public key (64 hex) of the replica to admit."),
    storage: Path = typer.Option(..., "--storage", envvar="COSMICAC_STORAGE",
                                 help="Storage folder of an admin replica."),
    admin: bool = typer.Option(False, "--admin", help="Let it add and remove writers too."),
    identity: Path | None = _identity_option(),
) -> None:
    """Admit a replica as a writer (what `task autobase-connect` does), as an admin replica.

    Example: cosmicac db add-writer 9f2c...e1 --storage /var/lib/cosmicac/db
    """
    _change_writer(storage, "add_writer", key, admin, identity)


@app.command("remove-writer")
def remove_writer_command(
    key: str = typer.Argument(..., help="Public key (64 hex) of the writer to remove."),
    storage: Path = typer.Option(..., "--storage", envvar="COSMICAC_STORAGE",
                                 help="Storage folder of an admin replica."),
    identity: Path | None = _identity_option(),
) -> None:
    """Remove a writer: only the entries this replica has of it go on counting, everywhere.

    Example: cosmicac db remove-writer 9f2c...e1 --storage /var/lib/cosmicac/db
    """
    _change_writer(storage, "remove_writer", key, False, identity)


def _change_writer(storage: Path, action: str, key: str, admin: bool,
                   identity: Path | None) -> None:
    writer = parse_key(key, what="writer key")
    try:
        result = trio.run(functools.partial(change_writer, storage, action, writer, admin=admin,
                                            identity=identity))
    except CrdtError as exc:
        fail(f"{exc.code}: {exc.message}")
    if result.status == "added":
        out.print(f"added {key} as {'an admin' if admin else 'a writer'} (via {result.via})")
    elif result.status == "already":
        out.print(f"{key} is a writer already (via {result.via})")
    else:
        out.print(f"removed {key}: its first {result.length} entries go on counting "
                  f"(via {result.via})")


@app.command("status")
def status(
    storage: Path = typer.Option(..., "--storage", envvar="COSMICAC_STORAGE", help=STORAGE_HELP),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o"),
) -> None:
    """Show the database key, writers with their lengths and heads, view rows and peers.

    Example: cosmicac db status --storage /var/lib/cosmicac/db -o json
    """
    try:
        report = inspect_storage(storage)
    except CrdtError as exc:
        fail(str(exc))
    document = {
        "storage": str(storage.resolve()),
        "bootstrap": report.bootstrap.hex(),
        "me": report.me.hex() if report.me else None,
        "writers": [
            {"key": w.key.hex(), "length": w.length, "head": w.head_hash.hex(),
             "admin": w.admin, "admitted": w.admitted, "cap": w.cap,
             "counted": w.counted, "applied": report.view_applied.get(w.key, 0),
             "stopped": {"index": w.stopped[0], "code": w.stopped[1]} if w.stopped else None,
             "tail_bytes": report.tails.get(w.key, 0)}
            for w in report.writers
        ],
        "rows": report.view_counts,
        "daemon_pid": report.daemon_pid,
        "peers": report.peers,
    }
    if output is OutputFormat.json:
        print_json(document)
        return
    out.print(f"database  {document['bootstrap']}")
    out.print(f"me        {document['me'] or '(no identity)'}")
    out.print("writers")
    for w in document["writers"]:
        role = "admin" if w["admin"] else "writer"
        if not w["admitted"]:
            role = f"removed (cap {w['cap']})" if w["cap"] is not None else "not admitted"
        notes = ["me"] if w["key"] == document["me"] else []
        if w["stopped"]:
            notes.append(f"invalid entry {w['stopped']['index']} ({w['stopped']['code']}): "
                         "later entries ignored")
        if w["tail_bytes"]:
            notes.append(f"{w['tail_bytes']} bytes being written")
        note = f"  ({'; '.join(notes)})" if notes else ""
        out.print(f"  {w['key']}  {role:<14} length {w['length']:>8}  counted "
                  f"{w['counted']:>8}  applied {w['applied']:>8}  head {w['head'][:16]}{note}",
                  markup=False)
    if report.view_counts is None:
        out.print("rows      (no view yet: the next open builds it)")
    else:
        out.print("rows      " + ", ".join(f"{name} {n}" for name, n in report.view_counts.items()))
    if report.daemon_pid is None:
        out.print("peers     (no daemon running on this storage)")
    else:
        out.print(f"peers     {len(report.peers)} (daemon pid {report.daemon_pid})")
        for peer in report.peers:
            out.print(f"  {peer['key']}  {peer['address']}")


@app.command("verify")
def verify(
    storage: Path = typer.Option(..., "--storage", envvar="COSMICAC_STORAGE", help=STORAGE_HELP),
) -> None:
    """Check every log record, chain and signature; exit 1 naming the first problem.

    Example: cosmicac db verify --storage /var/lib/cosmicac/db
    """
    problems = verify_storage(storage)
    for problem in problems:
        label = "error" if problem.fatal else "warning"
        out.print(f"{label}: {problem}", markup=False)
    fatal = [problem for problem in problems if problem.fatal]
    if fatal:
        fail(f"{len(fatal)} problem(s); the first: {fatal[0]}")
    out.print(f"ok: {storage.resolve()}", markup=False)
