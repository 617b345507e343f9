"""``cosmicac up --node-only`` (the single node) and ``cosmicac ping``.

``cosmicac up`` (cli/up.py) runs the whole deployment; with ``--node-only``
or any of this node's options it calls :func:`up` here, which runs one peer
on one swarm: its DHT node bootstraps the network, and it serves the node's
diagnostics and a replica of a shared database it creates and administers.
"""

from __future__ import annotations

import functools
import json
import logging
import statistics
import time
from pathlib import Path

import trio
import typer
from prometheus_client import Counter, Gauge, Info
from pydantic_settings import SettingsConfigDict

from crdt import CrdtError, run_database_service
from p2p.connection import dial_tcp
from p2p.daemon import (
    DaemonSettings,
    Port,
    PublicKeyList,
    StorageInUse,
    StorageUnusable,
    lock_storage,
)
from p2p.dht import dht_registry
from p2p.diagnostics import (
    IDENTIFY,
    PING,
    PROTOCOL,
    IdentifyParams,
    PingPayload,
    diagnostics_router,
)
from p2p.errors import HandshakeError, P2PError
from p2p.host import RpcService
from p2p.keys import KeyPair, format_key, load_or_create_keypair
from p2p.metrics import CollectorRegistry, MetricsBindError, combined_registry, serve_metrics
from p2p.rpc import RpcClient, RpcError
from p2p.swarm import Swarm, SwarmConfig

from ._args import (
    config_option,
    count_option,
    load_settings_or_exit,
    parse_peer,
    port_option,
    seconds_option,
)
from ._console import OutputFormat, err, fail, first_leaf, print_json
from ._daemon import run_until_signalled
from ._logging import configure_logging
from .beam import connect_failure_reason
from .relay import parse_allow

log = logging.getLogger("cosmicac.node")

#: One above the relay's 49737, so both fit one firewall rule range: the
#: node's swarm, TCP for connections and UDP for the DHT bootstrap.
DEFAULT_NODE_PORT = 49738
AGENT = "cosmicac-node/0.1"


class NodeSettings(DaemonSettings):
    """Settings of ``cosmicac up``: ``--config FILE``, ``COSMICAC_NODE__<KEY>``, options.

    The names from before the kit (:attr:`legacy_env`) still work, below the
    prefixed ones.
    """

    model_config = SettingsConfigDict(env_prefix="COSMICAC_NODE__")

    legacy_env = {
        **DaemonSettings.legacy_env,
        "COSMICAC_STORAGE": "storage",
        "COSMICAC_HOST": "host",
        "COSMICAC_PORT": "port",
        "COSMICAC_METRICS_PORT": "metrics.port",
        "COSMICAC_METRICS_HOST": "metrics.host",
        "COSMICAC_DB_ALLOW": "db_allow",
    }

    #: Identity and state folder (the same folder gives the same key).
    storage: Path = Path(".cosmicac")
    host: str = "127.0.0.1"
    #: TCP (connections) and UDP (the DHT bootstrap) port of the node's one swarm.
    port: Port = DEFAULT_NODE_PORT
    #: Replica keys admitted as writers of the shared database when they ask.
    db_allow: PublicKeyList = ()
    #: Read-only replicas of the shared database this node serves. Only they,
    #: ``db_allow`` and the admitted writers may read it.
    db_readers: PublicKeyList = ()


def up(
    config: Path | None = config_option(),
    storage: Path | None = typer.Option(
        None, "--storage",
        help="Identity and state folder (the same folder gives the same key). "
             "(default: .cosmicac)"),
    host: str | None = typer.Option(None, "--host", help="(default: 127.0.0.1)"),
    port: int | None = port_option(
        None, "--port", help=f"TCP (connections) and UDP (DHT) port of this node's swarm "
                             f"(0: any free one). (default: {DEFAULT_NODE_PORT})"),
    log_level: str | None = typer.Option(None, "--log-level", help="(default: info)"),
    metrics_port: int | None = port_option(
        None, "--metrics-port", help="Serve Prometheus metrics on this port (0: off)."),
    metrics_host: str | None = typer.Option(None, "--metrics-host",
                                            help="(default: 127.0.0.1)"),
    db_allow: list[str] | None = typer.Option(
        None, "--db-allow",
        help="Replica key admitted as a writer of the shared database when it asks."),
    db_readers: list[str] | None = typer.Option(
        None, "--db-reader",
        help="Key of a read-only replica of the shared database this node serves; only "
             "these, --db-allow keys and admitted writers may read it."),
) -> None:
    """Run what exists of the system on this machine, until Ctrl-C.

    One peer on one swarm (one key, one TCP and UDP port): its DHT node is
    the network's bootstrap, and it serves the node's diagnostics (for
    `cosmicac ping` and `cosmicac beam`) and the shared database, which this
    node creates and administers; other replicas join with its key
    (`PROXY_AUTOBASE_KEY=<key> cosmicac db serve ...`). The control plane
    (app-node, wrk-ork, workers) is not built yet. Every option can also be set
    in the --config file or as COSMICAC_NODE__<KEY>.
    """
    allowed = parse_allow(db_allow)
    readers = parse_allow(db_readers, what="--db-reader key")
    settings = load_settings_or_exit(NodeSettings, config, {
        "storage": storage, "host": host, "port": port, "log_level": log_level,
        "metrics.port": metrics_port, "metrics.host": metrics_host,
        "db_allow": tuple(allowed) if allowed else None,
        "db_readers": tuple(readers) if readers else None,
    })
    storage, host = settings.storage, settings.host
    port = settings.port
    configure_logging(settings.log_level, format=settings.log_format)
    try:
        lock = lock_storage(storage)  # one daemon per folder; released at exit
    except (StorageInUse, StorageUnusable) as exc:
        fail(str(exc))
    try:
        keypair = load_or_create_keypair(storage)
    except P2PError as exc:
        fail(str(exc))
    metrics = settings.metrics
    try:
        trio.run(_run_node, keypair, storage.resolve(), host, port,
                 frozenset(settings.db_allow) or None,
                 (metrics.host, metrics.port) if metrics.port else None,
                 frozenset(settings.db_readers))
    except* CrdtError as group:
        fail(str(first_leaf(group)))
    except* OSError as group:
        exc = first_leaf(group)
        if isinstance(exc, MetricsBindError):
            fail(str(exc))
        if exc.filename is not None:
            fail(f"cannot use {exc.filename}: {exc.strerror or exc}")
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    finally:
        lock.release()


class DiagnosticsService(RpcService):
    """The node's diagnostics (ping, identify), counted per channel.

    Open to any key, on purpose (``cosmicac ping`` dials with a fresh key each
    time): it answers only what the node announces anyway (its key, agent
    string and protocol names) and echoes at most 1 KiB, nothing of a team.
    """

    def __init__(self, keypair: KeyPair, registry: CollectorRegistry) -> None:
        super().__init__(PROTOCOL, diagnostics_router(keypair.public_key, agent=AGENT))
        self.sessions = Counter("node_diagnostic_sessions", "Diagnostic channels served",
                                registry=registry)
        self.open_sessions = Gauge("node_diagnostic_sessions_open",
                                   "Diagnostic channels open now", registry=registry)

    async def serve_channel(self, channel, connection) -> None:
        self.sessions.inc()
        with self.open_sessions.track_inprogress():
            await super().serve_channel(channel, connection)


async def _run_node(keypair: KeyPair, storage: Path, host: str, port: int,
                    db_allow: frozenset[bytes] | None,
                    metrics: tuple[str, int] | None,
                    db_readers: frozenset[bytes] = frozenset()) -> None:
    registry = CollectorRegistry()
    Info("node", "This node", registry=registry).info({"key": keypair.hex, "agent": AGENT})
    # The network's first node: nobody can probe it, and we vouch for it.
    swarm = Swarm(keypair, config=SwarmConfig(host=host, port=port, dht_persistent=True),
                  services=[DiagnosticsService(keypair, registry)])

    async def start(nursery: trio.Nursery) -> None:
        bound_host, bound_port = await nursery.start(swarm.run)
        database = await nursery.start(functools.partial(
            run_database_service, storage, swarm=swarm, allow=db_allow or frozenset(),
            readers=db_readers))
        if metrics is not None:
            assert swarm.dht is not None
            everything = combined_registry(registry, dht_registry(swarm.dht),
                                           database.db.metrics.registry,
                                           swarm.metrics.registry)
            served = await nursery.start(functools.partial(
                serve_metrics, everything, host=metrics[0], port=metrics[1]))
            log.info("node.metrics url=http://%s:%d/metrics", *served)
        log.info("node.started storage=%s key=%s address=%s:%d services=%s",
                 storage, keypair.hex, bound_host, bound_port, ",".join(swarm.host.services))
        where = f"{bound_host}:{bound_port}"
        err.print(f"node listening on {where} key {keypair.hex}", markup=False)
        err.print(f"try: cosmicac ping {keypair.hex} --address {where}", markup=False)
        err.print(f"dht bootstrap listening on {where}", markup=False)
        err.print(f"shared database {format_key(database.db.bootstrap)} on {where}"
                  f" (this node is its admin; cosmicac db status --storage {storage})",
                  markup=False)
        err.print(f"a replica joins with: PROXY_AUTOBASE_KEY={format_key(database.db.bootstrap)}"
                  f" cosmicac db serve --storage DIR --bootstrap {where}", markup=False)
        err.print(f"and replicates once admitted: cosmicac db add-writer <its key> --storage "
                  f"{storage} (or start this node with --db-allow <its key>; --db-reader "
                  "<its key> for a read-only replica)", markup=False)

    stopped_by = await run_until_signalled(start)
    log.info("node.stopping signal=%s", stopped_by)
    log.info("node.stopped")


def ping(
    key: str = typer.Argument(..., help="The peer's public key (64 hex characters)."),
    address: str = typer.Option(..., "--address", "-a", help="HOST:PORT of the peer."),
    count: int = count_option(4, "--count", "-c", maximum=100_000),
    interval_s: float = seconds_option(0.2, "--interval", "-i", inclusive=True,
                                       maximum=3600.0),
    timeout_s: float = seconds_option(5.0, "--timeout", "-W", minimum=0.01, inclusive=True,
                                      maximum=3600.0),
    output: OutputFormat = typer.Option(OutputFormat.text, "--output", "-o"),
) -> None:
    """Ping a peer over the whole stack (secret stream, channel, RPC) and identify it.

    Example: cosmicac ping 9f2c...e1 --address 127.0.0.1:49737 --count 3
    """
    remote, target = parse_peer(key, address, what="peer key")
    result = trio.run(_ping, remote, target, count, interval_s, timeout_s, output)
    if result["received"] < result["sent"]:
        raise typer.Exit(1)


async def _ping(remote, target, count, interval_s, timeout_s, output) -> dict:
    host, port = target
    started = time.perf_counter()
    try:
        connection = await dial_tcp(host, port, KeyPair.generate(), remote)
    except OSError as exc:
        fail(f"cannot connect to {host}:{port}: {connect_failure_reason(exc)}")
    except HandshakeError as exc:
        fail(f"handshake with {host}:{port} failed: {exc}")
    connect_ms = (time.perf_counter() - started) * 1000
    rtts: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(connection.run)
        channel = await connection.open_channel(PROTOCOL)
        client = RpcClient(channel, name="ping")
        await nursery.start(client.run)
        identity = await client.call(IDENTIFY, IdentifyParams(), timeout_s=timeout_s)
        if output is OutputFormat.text:
            err.print(f"connected to {identity.agent} at {host}:{port} in {connect_ms:.2f} ms",
                      markup=False)
        payload = PingPayload(data=b"\x00" * 32)
        for sequence in range(count):
            began = time.perf_counter()
            try:
                await client.call(PING, payload, timeout_s=timeout_s)
            except RpcError as exc:
                if output is OutputFormat.text:
                    err.print(f"seq={sequence} {exc.code}: {exc}", markup=False)
            else:
                rtts.append((time.perf_counter() - began) * 1000)
                if output is OutputFormat.text:
                    typer.echo(f"reply from {identity.public_key[:12]} seq={sequence} "
                               f"time={rtts[-1]:.3f} ms")
            if sequence + 1 < count:
                await trio.sleep(interval_s)
        await client.aclose()
        await connection.aclose()
        nursery.cancel_scope.cancel()
    result = {
        "peer": identity.public_key,
        "agent": identity.agent,
        "connect_ms": round(connect_ms, 3),
        "sent": count,
        "received": len(rtts),
    }
    if rtts:
        result.update(
            min_ms=round(min(rtts), 3),
            avg_ms=round(statistics.fmean(rtts), 3),
            max_ms=round(max(rtts), 3),
        )
    if output is OutputFormat.json:
        print_json(result)
    else:
        summary = {k: v for k, v in result.items() if k.endswith("_ms") and k != "connect_ms"}
        typer.echo(f"{result['sent']} sent, {result['received']} received"
                   + (f", rtt {json.dumps(summary)}" if summary else ""))
    return result
