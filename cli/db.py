"""``cosmicac db``: run and inspect a replica of the shared database.

``serve`` keeps a replica on the swarm (the creator prints the database's
bootstrap key; a replica started with ``PROXY_AUTOBASE_KEY=<key>`` opens that
database and asks to be admitted as a writer). ``status`` and ``verify`` read
a replica's files, also while a daemon runs on them.
"""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

import trio
import typer

from crdt import (
    CrdtError,
    FsyncPolicy,
    ReplicationConfig,
    change_writer,
    inspect_storage,
    run_database_service,
    verify_storage,
)
from p2p.errors import P2PError
from p2p.keys import format_key, load_or_create_keypair
from p2p.metrics import combined_registry, serve_metrics
from p2p.swarm import Swarm, SwarmConfig

from ._args import parse_key, parse_keys, wildcard_for
from ._console import OutputFormat, fail, out, print_json
from ._daemon import run_until_signalled
from ._logging import configure_logging
from .dht import parse_bootstrap
from .relay import parse_allow

__all__ = ["app"]

log = logging.getLogger("cosmicac.db")

app = typer.Typer(help="The shared database (API keys, model masters, token usage).",
                  no_args_is_help=True)

STORAGE_HELP = "Storage folder of the replica (its identity, logs and view)."


@app.command("serve")
def serve(
    storage: Path = typer.Option(..., "--storage", envvar="COSMICAC_STORAGE", help=STORAGE_HELP),
    key: str = typer.Option(
        "", "--key", envvar="PROXY_AUTOBASE_KEY",
        help="Bootstrap key of the database to open; none: open the one in --storage, "
             "or create a new one with this replica as its first admin."),
    bootstrap: str = typer.Option(
        ..., "--bootstrap", "-b", envvar="COSMICAC_DHT_BOOTSTRAP",
        help="DHT bootstrap nodes HOST:PORT[,HOST:PORT...]."),
    host: str = typer.Option("", "--host", help="Address to listen on (default: all)."),
    port: int = typer.Option(0, "--port", "-p", min=0, max=65535,
                             help="TCP and UDP port (0: any free one)."),
    relays: str = typer.Option("", "--relay", envvar="COSMICAC_RELAYS",
                               help="Blind relay keys to stay reachable through "
                                    "(comma-separated)."),
    allow: list[str] = typer.Option(
        [], "--allow", envvar="COSMICAC_DB_ALLOW",
        help="Key admitted as a writer when it asks (repeatable or comma-separated); "
             "this replica must be an admin."),
    fsync: FsyncPolicy = typer.Option(
        FsyncPolicy.ALWAYS.value, "--fsync",
        help="always: an append returns once on disk; never: tests and benchmarks only."),
    metrics_port: int = typer.Option(0, "--metrics-port", min=0, max=65535,
                                     envvar="COSMICAC_DB_METRICS_PORT",
                                     help="Serve Prometheus metrics on this port (0: off)."),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host"),
    log_level: str = typer.Option("info", "--log-level", envvar="COSMICAC_LOG_LEVEL"),
) -> None:
    """Keep a replica of the shared database and replicate it with its peers."""
    bootstrap_addresses = parse_bootstrap(bootstrap)
    database_key = parse_key(key, what="--key") if key.strip() else None
    relay_keys = tuple(parse_keys(relays, what="--relay key"))
    configure_logging(log_level, stream=sys.stderr)
    try:
        keypair = load_or_create_keypair(storage)
    except P2PError as exc:
        fail(str(exc))
    config = SwarmConfig(host=host or wildcard_for(bootstrap_addresses),
                         port=port, bootstrap=tuple(bootstrap_addresses), relays=relay_keys)
    try:
        trio.run(_serve, storage, keypair, database_key, config, parse_allow(allow) or frozenset(),
                 fsync, metrics_host, metrics_port)
    except* CrdtError as group:
        fail(str(group.exceptions[0]))
    except* OSError as group:
        exc = group.exceptions[0]
        fail(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}")


async def _serve(storage, keypair, database_key, config, allow, fsync, metrics_host,
                 metrics_port) -> None:
    swarm = Swarm(keypair, config=config)

    async def start(nursery: trio.Nursery) -> None:
        address = await nursery.start(swarm.run)
        service = await nursery.start(functools.partial(
            run_database_service, storage, swarm=swarm, bootstrap=database_key,
            allow=allow, fsync=fsync, replication=ReplicationConfig()))
        db = service.db
        if metrics_port:
            registry = combined_registry(db.metrics.registry, swarm.metrics.registry)
            await nursery.start(functools.partial(serve_metrics, registry, host=metrics_host,
                                                  port=metrics_port))
        print(f"Database {format_key(db.bootstrap)}", flush=True)
        role = "admin" if db.is_admin else "writer" if db.is_writer else "reader (not admitted)"
        print(f"Replica {format_key(db.key)} ({role}) listening on "
              f"{address[0]}:{address[1]}", flush=True)
        if not db.is_writer:
            nursery.start_soon(_announce_admission, db)

    stopped_by = await run_until_signalled(start)
    log.info("db.exiting signal=%s", stopped_by)


async def _announce_admission(db) -> None:
    """Say on stdout when an admin has added us (what `task autobase-connect` waits for)."""
    while not db.is_writer:
        await db.wait_changed(db.lengths, 3600)
    print(f"Admitted as a writer of {format_key(db.bootstrap)}", flush=True)


@app.command("add-writer")
def add_writer_command(
    key: str = typer.Argument(..., help="Public key (64 hex) of the replica to admit."),
    storage: Path = typer.Option(..., "--storage", envvar="COSMICAC_STORAGE",
                                 help="Storage folder of an admin replica."),
    admin: bool = typer.Option(False, "--admin", help="Let it add and remove writers too."),
) -> None:
    """Admit a replica as a writer (what `task autobase-connect` does), as an admin replica."""
    _change_writer(storage, "add_writer", key, admin)


@app.command("remove-writer")
def remove_writer_command(
    key: str = typer.Argument(..., help="Public key (64 hex) of the writer to remove."),
    storage: Path = typer.Option(..., "--storage", envvar="COSMICAC_STORAGE",
                                 help="Storage folder of an admin replica."),
) -> None:
    """Remove a writer: only the entries this replica has of it go on counting, everywhere."""
    _change_writer(storage, "remove_writer", key, False)


def _change_writer(storage: Path, action: str, key: str, admin: bool) -> None:
    writer = parse_key(key, what="writer key")
    try:
        result = trio.run(functools.partial(change_writer, storage, action, writer, admin=admin))
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
    """Show the database key, writers with their lengths and heads, view rows and peers."""
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
    """Check every log record, chain and signature; exit 1 naming the first problem."""
    problems = verify_storage(storage)
    for problem in problems:
        label = "error" if problem.fatal else "warning"
        out.print(f"{label}: {problem}", markup=False)
    fatal = [problem for problem in problems if problem.fatal]
    if fatal:
        fail(f"{len(fatal)} problem(s); the first: {fatal[0]}")
    out.print(f"ok: {storage.resolve()}", markup=False)
