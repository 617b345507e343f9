"""Parsing of the arguments several commands share, with usage errors (exit 2)."""

from __future__ import annotations

import typer

from p2p.errors import KeyFormatError
from p2p.keys import parse_public_key

from ._console import fail

__all__ = ["parse_address", "parse_key", "parse_keys", "parse_peer", "wildcard_for"]


def parse_key(text: str, *, what: str) -> bytes:
    """Read one public key; a bad one exits 2 naming ``what``."""
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
