"""``cosmicac dht``: run DHT nodes, announce and look up topics."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import trio
import typer
from pydantic_settings import SettingsConfigDict

from nodes.kit.ready import print_ready
from p2p.daemon import AddressList, DaemonSettings, Port
from p2p.dht import (
    DhtNode,
    NatType,
    PeerRecord,
    UdpTransport,
    canonical_address,
    dht_registry,
)
from p2p.errors import KeyFormatError, P2PError
from p2p.keys import KeyPair, format_key, load_or_create_keypair, parse_topic
from p2p.metrics import MetricsBindError, serve_metrics

from ._args import parse_address, port_option
from ._console import err, fail, run_trio
from ._daemon import run_until_signalled
from ._logging import configure_logging

app = typer.Typer(help="The DHT: bootstrap and plain nodes, announce, lookup.",
                  no_args_is_help=True)
log = logging.getLogger("cosmicac.dht")

#: Port of a bootstrap node when none is given (HyperDHT's default).
DEFAULT_BOOTSTRAP_PORT = 49737

BootstrapOption = typer.Option(
    ..., "--bootstrap", "-b", envvar="COSMICAC_DHT_BOOTSTRAP",
    help="Bootstrap nodes as HOST:PORT[,HOST:PORT...].",
)


def parse_bootstrap(text: str) -> list[tuple[str, int]]:
    """Read ``HOST:PORT[,HOST:PORT...]``; a bad entry exits 2 naming it."""
    addresses = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            addresses.append(canonical_address(*parse_address(item)))
        except (typer.BadParameter, KeyFormatError) as exc:
            fail(f"bad bootstrap address {item!r}: {exc}", code=2)
    if not addresses:
        fail("--bootstrap needs at least one HOST:PORT", code=2)
    return addresses


def record_json(record: PeerRecord) -> str:
    return json.dumps({
        "public_key": format_key(record.public_key),
        "addresses": [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in record.addresses],
        "relays": [format_key(relay) for relay in record.relays],
        "seq": record.seq,
        "expires": record.expires,
    })


async def _serve_node(host: str, port: int, bootstrap: list, label: str,
                      metrics: tuple[str, int] | None = None) -> None:
    try:
        transport = await UdpTransport.bind(host, port, dual_stack=host == "::")
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    # A node started without --bootstrap is the network's first: nobody can
    # probe it, and the operator vouches that others reach it.
    node = DhtNode(transport, bootstrap=bootstrap, persistent=True, reachable=not bootstrap)

    async def start(nursery: trio.Nursery) -> None:
        await nursery.start(node.run)
        if metrics is not None:
            try:
                served = await nursery.start(functools.partial(
                    serve_metrics, dht_registry(node), host=metrics[0], port=metrics[1]))
            except OSError as exc:  # MetricsBindError: one line naming the address
                fail(str(exc) if isinstance(exc, MetricsBindError) else
                     f"cannot serve metrics on {metrics[0]}:{metrics[1]}: {exc.strerror or exc}")
            log.info("dht.metrics url=http://%s:%d/metrics", *served)
        bound_host, bound_port = transport.local_address
        node_id = node.core.node_id.hex() if node.core.node_id else "(learning)"
        err.print(f"{label} listening on {bound_host}:{bound_port} node-id {node_id}",
                  markup=False)
        # The machines' line (``cosmicac up`` waits for it): stdout, as every daemon's.
        print_ready(label.replace(" ", "-"), addresses={"udp": (bound_host, bound_port)},
                    note=f"node-id {node_id}")
        log.info("dht.node_started address=%s:%d contacts=%d", bound_host, bound_port,
                 len(node.core.routing))

    stopped_by = await run_until_signalled(start)
    log.info("dht.node_stopped signal=%s", stopped_by)


MetricsPortOption = port_option(
    0, "--metrics-port", envvar="COSMICAC_DHT_METRICS_PORT",
    help="Serve Prometheus metrics on this port (0: off).")
MetricsHostOption = typer.Option("127.0.0.1", "--metrics-host", envvar="COSMICAC_DHT_METRICS_HOST")


def _metrics_address(host: str, port: int) -> tuple[str, int] | None:
    return (host, port) if port else None


class DhtSettings(DaemonSettings):
    """``cosmicac run dht``: a DHT node from a config file and the environment
    (``COSMICAC_DHT__<KEY>``; ``COSMICAC_DHT_HOST``, ``_PORT`` and ``_BOOTSTRAP``, the
    names ``cosmicac bootstrap``'s env file writes, too). Without ``bootstrap`` it is
    the network's first node (a bootstrap node); with it, a plain persistent node."""

    model_config = SettingsConfigDict(env_prefix="COSMICAC_DHT__")
    legacy_env: ClassVar[Mapping[str, str]] = {
        "COSMICAC_LOG_LEVEL": "log_level", "COSMICAC_DHT_HOST": "host",
        "COSMICAC_DHT_PORT": "port", "COSMICAC_DHT_BOOTSTRAP": "bootstrap"}

    host: str = "127.0.0.1"
    port: Port = DEFAULT_BOOTSTRAP_PORT
    bootstrap: AddressList = ()


def run_node(settings: DhtSettings) -> None:
    """Serve the node ``settings`` describe until SIGINT or SIGTERM."""
    configure_logging(settings.log_level)
    metrics = settings.metrics
    label = "dht node" if settings.bootstrap else "dht bootstrap"
    run_trio(_serve_node, settings.host, settings.port, list(settings.bootstrap), label,
             (metrics.host, metrics.port) if metrics.port else None)


@app.command("bootstrap")
def bootstrap(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = port_option(DEFAULT_BOOTSTRAP_PORT, "--port", "-p"),
    log_level: str = typer.Option("info", "--log-level", envvar="COSMICAC_LOG_LEVEL"),
    metrics_port: int = MetricsPortOption,
    metrics_host: str = MetricsHostOption,
) -> None:
    """Run a persistent node that others join through.

    Example: cosmicac dht bootstrap --host 0.0.0.0 --port 49737
    """
    configure_logging(log_level)
    run_trio(_serve_node, host, port, [], "dht bootstrap",
             _metrics_address(metrics_host, metrics_port))


@app.command("node")
def node(
    bootstrap: str = BootstrapOption,
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = port_option(0, "--port", "-p", help="UDP port (0: any free one)."),
    log_level: str = typer.Option("info", "--log-level", envvar="COSMICAC_LOG_LEVEL"),
    metrics_port: int = MetricsPortOption,
    metrics_host: str = MetricsHostOption,
) -> None:
    """Run a plain persistent node that joined through --bootstrap.

    Example: cosmicac dht node --bootstrap 10.0.0.2:49737
    """
    configure_logging(log_level)
    run_trio(_serve_node, host, port, parse_bootstrap(bootstrap), "dht node",
             _metrics_address(metrics_host, metrics_port))


def _topic(text: str) -> bytes:
    try:
        return parse_topic(text)
    except KeyFormatError as exc:
        fail(str(exc), code=2)


@app.command("announce")
def announce(
    topic: str = typer.Argument(..., help="64 hex characters, or any string (hashed)."),
    bootstrap: str = BootstrapOption,
    storage: Path | None = typer.Option(
        None, "--storage", envvar="COSMICAC_STORAGE",
        help="Announce with the identity kept here (a fresh key otherwise).",
    ),
    address: list[str] = typer.Option(
        [], "--address", "-a", help="HOST:PORT to put in the record (repeatable); "
        "default: this node's own address.",
    ),
    host: str = typer.Option("127.0.0.1", "--host"),
) -> None:
    """Announce TOPIC until interrupted (then unannounce); prints the key.

    Example: cosmicac dht announce my-topic --bootstrap 10.0.0.2:49737 --address 10.0.0.7:5000
    """
    topic_bytes = _topic(topic)
    addresses = [parse_address(a) for a in address]
    try:
        keypair = load_or_create_keypair(storage) if storage else KeyPair.generate()
    except P2PError as exc:
        fail(str(exc))
    trio.run(_announce, topic_bytes, parse_bootstrap(bootstrap), keypair, addresses, host)


async def _announce(topic, bootstrap, keypair, addresses, host) -> None:
    node = DhtNode(await UdpTransport.bind(host), bootstrap=bootstrap)

    async def start(nursery: trio.Nursery) -> None:
        stored = await nursery.start(functools.partial(
            node.announce, topic, keypair, addresses=addresses or None
        ))
        typer.echo(keypair.hex)
        err.print(f"announced on {stored} nodes; Ctrl-C to unannounce and stop", markup=False)

    async with trio.open_nursery() as outer:
        await outer.start(node.run)
        # The signal cancels the announcer only: the node keeps running while
        # the announcer's cleanup unannounces, then it stops.
        await run_until_signalled(start)
        outer.cancel_scope.cancel()


@app.command("lookup")
def lookup(
    topic: str = typer.Argument(..., help="64 hex characters, or any string (hashed)."),
    bootstrap: str = BootstrapOption,
    host: str = typer.Option("127.0.0.1", "--host"),
) -> None:
    """Print one JSON line per verified record of TOPIC; exit 1 if none.

    Example: cosmicac dht lookup my-topic --bootstrap 10.0.0.2:49737
    """
    found = trio.run(_lookup, _topic(topic), parse_bootstrap(bootstrap), host)
    if not found:
        err.print("no records found", markup=False)
        raise typer.Exit(1)


async def _lookup(topic, bootstrap, host) -> int:
    node = DhtNode(await UdpTransport.bind(host), bootstrap=bootstrap)
    found = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)
        async with contextlib.aclosing(node.lookup(topic)) as records:
            async for record in records:
                typer.echo(record_json(record))
                found += 1
        nursery.cancel_scope.cancel()
    return found


@app.command("nat")
def nat(
    bootstrap: str = BootstrapOption,
    host: str = typer.Option("0.0.0.0", "--host", help="Address to send from."),
    as_json: bool = typer.Option(False, "--json", help="One JSON line instead of text."),
) -> None:
    """Which NAT this machine sits behind, as the DHT's nodes see it.

    open (no NAT), consistent (one public address and port for every peer: a
    hole can be punched to it), random (another port per peer: only a
    consistent peer can punch to it), or unknown (fewer than two nodes answered).
    Ask nodes at two or more addresses. Exits 1 when no node answered.

    Example: cosmicac dht nat --bootstrap 10.0.0.2:49737 --json
    """
    kind, observations = trio.run(_nat, parse_bootstrap(bootstrap), host)
    if not observations:
        fail("no DHT node answered: cannot tell (check --bootstrap, and that UDP reaches it)")
    seen = sorted({f"{h}:{p}" for h, p in observations.values()})
    if as_json:
        typer.echo(json.dumps({"nat": kind.value, "nodes": len(observations), "seen": seen}))
    else:
        typer.echo(f"nat {kind.value}: {len(observations)} node(s) saw "
                   f"{', '.join(seen)}")


async def _nat(bootstrap: list[tuple[str, int]], host: str
               ) -> tuple[NatType, dict[tuple[str, int], tuple[str, int]]]:
    node = DhtNode(await UdpTransport.bind(host, 0), bootstrap=bootstrap)
    async with trio.open_nursery() as nursery:
        with trio.move_on_after(10):  # bootstrapping asks each node (and retries)
            await nursery.start(node.run)
        kind, observations = node.nat_type(), node.core.observations
        nursery.cancel_scope.cancel()
    return kind, observations
