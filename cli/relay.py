"""``cosmicac relay`` and ``blind-relay``: run the blind relay daemon.

Both commands are this one function, so they take the same options; the
``blind-relay`` script keeps upstream blind-relay-service's spelling
(``blind-relay --storage DIR [--port N]``) for operators following the relay
guide (seeds/relay.txt).

Settings come from :class:`relay.RelaySettings` on the daemon kit
(:mod:`p2p.daemon`): ``--config FILE``, then ``COSMICAC_RELAY__<KEY>``
environment variables, then these options.

stdout carries two lines, flushed as soon as they are true::

    Using storage at <absolute path>
    Server listening on <relay key, 64 hex>

and, from ``cosmicac relay`` only (``blind-relay`` prints exactly upstream's two),
the ready line every daemon prints (:mod:`nodes.kit.ready`)::

    relay ready key=<relay key> tcp=<host>:<port> udp=<host>:<port>

Logs go to stderr (JSON lines unless it is a terminal).
"""

from __future__ import annotations

import functools
import logging
import resource
from pathlib import Path

import typer

from nodes.kit.ready import print_ready
from p2p.daemon import Daemon, DaemonError, run_daemon
from p2p.errors import P2PError
from p2p.keys import load_or_create_keypair
from relay import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_PAIRS,
    DEFAULT_MAX_PAIRS_PER_KEY,
    DEFAULT_MAX_RESERVATIONS,
    DEFAULT_PAIR_TIMEOUT_S,
    DEFAULT_PORT,
    RelaySettings,
    run_relay,
)

from ._args import (
    config_option,
    count_option,
    load_settings_or_exit,
    parse_keys,
    port_option,
    seconds_option,
)
from .dht import parse_bootstrap

__all__ = ["main", "parse_allow", "relay", "run_relay_daemon"]

log = logging.getLogger("cosmicac.relay")

#: Set by the ``blind-relay`` script: its stdout stays exactly upstream's two lines.
_upstream_stdout = False


def parse_allow(values: list[str] | None, *, what: str = "--allow key"
                ) -> frozenset[bytes] | None:
    """Read ``--allow`` values (each may be comma-separated); none means no allow-list."""
    keys = {key for value in values or () for key in parse_keys(value, what=what)}
    return frozenset(keys) if keys else None


def _raise_open_files_limit() -> None:
    # Every relayed pair is two sockets; the usual soft limit of 1,024 would cap
    # a relay near 500 pairs. Servers commonly lift it to the hard limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def relay(
    config: Path | None = config_option(),
    storage: Path | None = typer.Option(
        None, "--storage",
        help="Identity folder: the same folder always gives the same relay key. "
             "(default: ./corestore)"),
    host: str | None = typer.Option(None, "--host",
                                    help="Address to listen on (TCP and UDP). (default: 0.0.0.0)"),
    port: int | None = port_option(
        None, "--port", "-p",
        help=f"TCP port for relayed streams and UDP port for the DHT (0: any free one). "
             f"(default: {DEFAULT_PORT})"),
    bootstrap: str | None = typer.Option(
        None, "--bootstrap", "-b",
        help="DHT bootstrap nodes HOST:PORT[,HOST:PORT...]; none: a standalone DHT node."),
    allow: list[str] | None = typer.Option(
        None, "--allow",
        help="Key that may reserve (repeatable, or comma-separated); default: any key."),
    max_reservations: int | None = count_option(
        None, "--max-reservations", help=f"(default: {DEFAULT_MAX_RESERVATIONS})"),
    max_pairs_per_key: int | None = count_option(
        None, "--max-pairs-per-key", help=f"(default: {DEFAULT_MAX_PAIRS_PER_KEY})"),
    max_pairs: int | None = count_option(
        None, "--max-pairs",
        help=f"Pairs (waiting or relaying) on the whole relay. (default: {DEFAULT_MAX_PAIRS})"),
    pair_timeout: float | None = seconds_option(
        None, "--pair-timeout",
        help=f"Seconds for both sides to attach. (default: {DEFAULT_PAIR_TIMEOUT_S:g})"),
    idle_timeout: float | None = seconds_option(
        None, "--idle-timeout",
        help=f"Seconds without traffic before a pair is closed. "
             f"(default: {DEFAULT_IDLE_TIMEOUT_S:g})"),
    metrics_port: int | None = port_option(
        None, "--metrics-port", help="Serve Prometheus metrics on this port (0: off)."),
    metrics_host: str | None = typer.Option(None, "--metrics-host",
                                            help="(default: 127.0.0.1)"),
    log_level: str | None = typer.Option(None, "--log-level", help="(default: info)"),
) -> None:
    """Run a blind relay: firewalled peers reserve, dialers pair, bytes are forwarded.

    Every option can also be set in the --config file or as an environment
    variable COSMICAC_RELAY__<KEY> (relay/README.md lists the keys).

    Example: cosmicac relay --port 49737 --bootstrap 203.0.113.5:49737 --metrics-port 9108
    """
    allowed = parse_allow(allow)
    settings = load_settings_or_exit(RelaySettings, config, {
        "storage": storage,
        "host": host,
        "port": port,
        "bootstrap": tuple(parse_bootstrap(bootstrap)) if bootstrap is not None
        and bootstrap.strip() else None,
        "allow": tuple(allowed) if allowed else None,
        "max_reservations": max_reservations,
        "max_pairs_per_key": max_pairs_per_key,
        "max_pairs": max_pairs,
        "pair_timeout_s": pair_timeout,
        "idle_timeout_s": idle_timeout,
        "metrics.port": metrics_port,
        "metrics.host": metrics_host,
        "log_level": log_level,
    })
    run_relay_daemon(settings)


def run_relay_daemon(settings: RelaySettings) -> None:
    """Serve the relay ``settings`` describe until SIGINT or SIGTERM (``cosmicac relay``,
    ``blind-relay`` and ``cosmicac run relay``)."""
    _raise_open_files_limit()
    run_daemon(settings, _start, name="relay", errors={
        OSError: lambda exc: f"cannot listen on {settings.host}:{settings.port}: "
                             f"{exc.strerror or exc}",
    })


async def _start(daemon: Daemon[RelaySettings]) -> None:
    settings = daemon.settings
    try:
        keypair = load_or_create_keypair(daemon.storage)
    except P2PError as exc:
        raise DaemonError(str(exc)) from None
    print(f"Using storage at {daemon.storage}", flush=True)
    addresses = await daemon.nursery.start(functools.partial(
        run_relay, keypair, host=settings.host, port=settings.port,
        bootstrap=settings.bootstrap, config=settings.relay_config(),
    ))
    daemon.metrics.add(addresses.registry)
    print(f"Server listening on {keypair.hex}", flush=True)
    if not _upstream_stdout:
        print_ready("relay", key=keypair.hex,
                    addresses={"tcp": addresses.tcp, "udp": addresses.dht})


def main() -> None:
    """The ``blind-relay`` console script."""
    global _upstream_stdout
    _upstream_stdout = True
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(relay)
    app(prog_name="blind-relay")


if __name__ == "__main__":
    main()
