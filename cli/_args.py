"""Parsing of the arguments several commands share, with usage errors (exit 2).

Every numeric option is declared through one of the helpers below, so its
range is checked before the command runs: a port is 0..65535 (never wrapped
modulo 65536 by the socket layer), a count is positive, a duration is a
finite number of seconds above its floor. A bad value is a usage error
(exit 2) naming the option, never a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from ._console import fail

if TYPE_CHECKING:
    from p2p.daemon import DaemonSettings

# The p2p stack is imported by the helpers that use it, not here: every command
# imports this module for its options, and the stack (trio, the daemon kit) costs
# ~0.2 s of start-up a jobs or models command never needs.
S = TypeVar("S", bound="DaemonSettings")

__all__ = [
    "config_option",
    "count_option",
    "load_settings_or_exit",
    "parse_address",
    "parse_key",
    "parse_keys",
    "parse_peer",
    "port_option",
    "seconds_option",
    "wildcard_for",
]

MAX_PORT = 65535


def config_option() -> Any:
    """``--config FILE``: a daemon's settings file (TOML, or JSON by its suffix)."""
    return typer.Option(
        None, "--config", dir_okay=False,
        help="Settings file (TOML, or JSON if it ends in .json); COSMICAC_<DAEMON>__<KEY> "
             "environment variables override it, and options override both.")


def load_settings_or_exit(cls: type[S], config_file: Path | None,
                          overrides: Mapping[str, Any]) -> S:
    """:func:`p2p.daemon.load_settings`; a bad setting exits 2 naming its key."""
    from p2p.daemon import ConfigError, load_settings

    try:
        return load_settings(cls, config_file=config_file, overrides=overrides)
    except ConfigError as exc:
        fail(str(exc), code=2)


def port_option(default: int | None, *flags: str, help: str | None = None,
                envvar: str | None = None) -> Any:
    """A TCP/UDP port option: 0..65535 (0 means "any free port" or "off")."""
    return typer.Option(default, *flags, min=0, max=MAX_PORT, envvar=envvar, help=help)


def count_option(default: int | None, *flags: str, help: str | None = None,
                 minimum: int = 1, maximum: int | None = None,
                 envvar: str | None = None) -> Any:
    """A whole-number option of at least ``minimum`` (1: counts, limits)."""
    return typer.Option(default, *flags, min=minimum, max=maximum, envvar=envvar, help=help)


def seconds_option(default: float | None, *flags: str, help: str | None = None,
                   minimum: float = 0.0, inclusive: bool = False,
                   maximum: float = 365 * 86400.0, envvar: str | None = None) -> Any:
    """A duration in seconds: finite, above ``minimum`` (or equal, if
    ``inclusive``), at most ``maximum`` (a year by default)."""

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        low_ok = value >= minimum if inclusive else value > minimum
        if not math.isfinite(value) or not low_ok or value > maximum:
            bound = f"at least {minimum:g}" if inclusive else f"more than {minimum:g}"
            raise typer.BadParameter(f"must be a number of seconds, {bound} and at most "
                                     f"{maximum:g}, got {value!r}")
        return value

    return typer.Option(default, *flags, callback=check, envvar=envvar, help=help)


def parse_key(text: str, *, what: str) -> bytes:
    """Read one public key; a bad one exits 2 naming ``what``."""
    from p2p.errors import KeyFormatError
    from p2p.keys import parse_public_key

    try:
        return parse_public_key(text, what=what)
    except KeyFormatError as exc:
        fail(str(exc), code=2)


def parse_keys(text: str, *, what: str) -> list[bytes]:
    """Read comma-separated public keys (empty items ignored); a bad one exits 2."""
    return [parse_key(item.strip(), what=what) for item in text.split(",") if item.strip()]


def wildcard_for(bootstrap: list[tuple[str, int]] | tuple[tuple[str, int], ...]) -> str:
    """Listen on every address of the bootstrap's family (peers must reach us)."""
    return "::" if ":" in bootstrap[0][0] else "0.0.0.0"


def parse_address(text: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` for IPv6).

    Raises:
        typer.BadParameter: with what is wrong.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise typer.BadParameter(f"expected HOST:PORT, got {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        port = int(port_text)
    except ValueError:
        raise typer.BadParameter(f"port must be a number, got {port_text!r}") from None
    if not 0 < port < 65536:
        raise typer.BadParameter(f"port must be between 1 and 65535, got {port}")
    return host, port


def parse_peer(key: str, address: str, *, what: str) -> tuple[bytes, tuple[str, int]]:
    """Read a peer's key and ``host:port``; a bad one exits 2 with the reason."""
    remote_key = parse_key(key, what=what)
    try:
        target = parse_address(address)
    except typer.BadParameter as exc:
        fail(str(exc), code=2)
    return remote_key, target

