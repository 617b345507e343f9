"""``cosmicac relay`` and ``blind-relay``: run the blind relay daemon.

Both commands are this one function, so they take the same options; the
``blind-relay`` script keeps upstream blind-relay-service's spelling
(``blind-relay --storage DIR [--port N]``) for operators following the relay
guide (seeds/relay.txt).

stdout carries exactly two lines, flushed as soon as they are true::

    Using storage at <absolute path>
    Server listening on <relay key, 64 hex>

Logs go to stderr (JSON lines unless it is a terminal).
"""

from __future__ import annotations

import functools
import logging
import resource
import sys
from pathlib import Path

import trio
import typer

from p2p.errors import LocalProtocolError, P2PError
from p2p.keys import KeyPair, load_or_create_keypair
from relay import DEFAULT_PORT, RelayConfig, run_relay
from relay._config import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_PAIRS,
    DEFAULT_MAX_PAIRS_PER_KEY,
    DEFAULT_MAX_RESERVATIONS,
    DEFAULT_PAIR_TIMEOUT_S,
)

from ._args import parse_keys
from ._console import fail
from ._daemon import run_until_signalled
from ._logging import configure_logging
from .dht import parse_bootstrap

__all__ = ["main", "relay"]

log = logging.getLogger("cosmicac.relay")


def parse_allow(values: list[str]) -> frozenset[bytes] | None:
    """Read ``--allow`` values (each may be comma-separated); none means no allow-list."""
    keys = {key for value in values for key in parse_keys(value, what="--allow key")}
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
    storage: Path = typer.Option(
        Path("corestore"), "--storage", envvar="COSMICAC_RELAY_STORAGE",
        help="Identity folder: the same folder always gives the same relay key.",
    ),
    host: str = typer.Option("0.0.0.0", "--host", envvar="COSMICAC_RELAY_HOST",
                             help="Address to listen on (TCP and UDP)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", "-p", envvar="COSMICAC_RELAY_PORT",
                             min=0, max=65535,
                             help="TCP port for relayed streams and UDP port for the DHT "
                                  "(0: any free one)."),
    bootstrap: str = typer.Option(
        "", "--bootstrap", "-b", envvar="COSMICAC_DHT_BOOTSTRAP",
        help="DHT bootstrap nodes HOST:PORT[,HOST:PORT...]; none: a standalone DHT node.",
    ),
    allow: list[str] = typer.Option(
        [], "--allow", envvar="COSMICAC_RELAY_ALLOW",
        help="Key that may reserve (repeatable, or comma-separated); default: any key.",
    ),
    max_reservations: int = typer.Option(DEFAULT_MAX_RESERVATIONS, "--max-reservations",
                                         min=1, envvar="COSMICAC_RELAY_MAX_RESERVATIONS"),
    max_pairs_per_key: int = typer.Option(DEFAULT_MAX_PAIRS_PER_KEY, "--max-pairs-per-key",
                                          min=1, envvar="COSMICAC_RELAY_MAX_PAIRS_PER_KEY"),
    max_pairs: int = typer.Option(DEFAULT_MAX_PAIRS, "--max-pairs", min=1,
                                  envvar="COSMICAC_RELAY_MAX_PAIRS",
                                  help="Pairs (waiting or relaying) on the whole relay."),
    pair_timeout: float = typer.Option(DEFAULT_PAIR_TIMEOUT_S, "--pair-timeout", min=0.001,
                                       envvar="COSMICAC_RELAY_PAIR_TIMEOUT",
                                       help="Seconds for both sides to attach."),
    idle_timeout: float = typer.Option(DEFAULT_IDLE_TIMEOUT_S, "--idle-timeout", min=0.001,
                                       envvar="COSMICAC_RELAY_IDLE_TIMEOUT",
                                       help="Seconds without traffic before a pair is closed."),
    metrics_port: int = typer.Option(0, "--metrics-port", min=0, max=65535,
                                     envvar="COSMICAC_RELAY_METRICS_PORT",
                                     help="Serve Prometheus metrics on this port (0: off)."),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host",
                                     envvar="COSMICAC_RELAY_METRICS_HOST"),
    log_level: str = typer.Option("info", "--log-level", envvar="COSMICAC_LOG_LEVEL"),
) -> None:
    """Run a blind relay: firewalled peers reserve, dialers pair, bytes are forwarded."""
    bootstrap_addresses = parse_bootstrap(bootstrap) if bootstrap.strip() else []
    try:
        config = RelayConfig(
            allow=parse_allow(allow),
            max_reservations=max_reservations,
            max_pairs_per_key=max_pairs_per_key,
            max_pairs=max_pairs,
            max_pending_pairs=max_pairs,
            pair_timeout_s=pair_timeout,
            idle_timeout_s=idle_timeout,
        )
    except LocalProtocolError as exc:
        fail(str(exc), code=2)
    configure_logging(log_level, stream=sys.stderr)
    try:
        keypair = load_or_create_keypair(storage)
    except P2PError as exc:
        fail(str(exc))
    print(f"Using storage at {storage.resolve()}", flush=True)
    _raise_open_files_limit()
    try:
        trio.run(_serve, keypair, host, port, bootstrap_addresses, config, metrics_host,
                 metrics_port)
    except* OSError as group:
        exc = group.exceptions[0]
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


async def _serve(keypair: KeyPair, host, port, bootstrap, config, metrics_host,
                 metrics_port) -> None:
    async def start(nursery: trio.Nursery) -> None:
        await nursery.start(functools.partial(
            run_relay, keypair, host=host, port=port, bootstrap=bootstrap, config=config,
            metrics_host=metrics_host, metrics_port=metrics_port or None,
        ))
        print(f"Server listening on {keypair.hex}", flush=True)

    stopped_by = await run_until_signalled(start)
    log.info("relay.exiting signal=%s", stopped_by)


def main() -> None:
    """The ``blind-relay`` console script."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(relay)
    app(prog_name="blind-relay")


if __name__ == "__main__":
    main()
