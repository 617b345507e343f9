"""The ready line: what a daemon prints once it serves, and its parser.

Every daemon ``cosmicac up`` runs (the DHT bootstrap, the relay, wrk-monitor,
app-node, wrk-ork, the worker, proxy-inference, the entry point) prints one
line on **stdout** when it is ready::

    wrk-ork ready key=<64 hex> swarm=127.0.0.1:49740 (1 racks)
    app-node ready key=<64 hex> swarm=127.0.0.1:49742 http=127.0.0.1:49751 database=<64 hex>
    entry ready http=127.0.0.1:5173 api=http://127.0.0.1:49751 inference=… monitor=off

- the daemon's name, then the word ``ready``;
- ``key=``: its swarm public key (64 lowercase hex), when it has one;
- ``<name>=<value>`` fields, in the order written: an address a daemon listens
  on is ``<role>=<host>:<port>`` (``swarm``, ``http``, ``udp``...; an IPv6 host in
  brackets); other facts a client needs (a URL, a key) are values without blanks;
- optionally `` (`` a note for people ``)``, which machines must not read.

stdout because that is where the daemons' lines always went, and where
``cosmicac up``'s supervisor reads (their log records go to stderr, as JSON
lines off a terminal). The supervisor, the tests and the benchmarks find the
line with :func:`parse_ready` / :func:`find_ready` and nothing else.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["ReadyLine", "find_ready", "format_ready", "parse_ready", "print_ready"]

_NAME = re.compile(r"[a-z][a-z0-9-]*")
_FIELD = re.compile(r"[a-z][a-z0-9_]*")
_KEY = re.compile(r"[0-9a-f]{64}")
_LINE = re.compile(r"(?P<daemon>[a-z][a-z0-9-]*) ready(?P<fields>(?: [a-z][a-z0-9_]*=\S+)*)"
                   r"(?: \((?P<note>.*)\))?")


@dataclass(frozen=True)
class ReadyLine:
    """A daemon's ready line, typed."""

    daemon: str
    #: Its swarm public key, 64 hex; None for a daemon without one.
    key: str | None = None
    #: Its other fields by name, as written (addresses ``host:port``).
    fields: Mapping[str, str] = field(default_factory=dict)
    #: For people only.
    note: str = ""

    @property
    def addresses(self) -> dict[str, tuple[str, int]]:
        """Every field that is an address, by role."""
        found = {}
        for name, value in self.fields.items():
            address = _address(value)
            if address is not None:
                found[name] = address
        return found

    def address(self, role: str) -> tuple[str, int]:
        """The ``(host, port)`` of ``role``.

        Raises:
            KeyError: the line has no such address.
        """
        address = _address(self.fields[role])
        if address is None:
            raise KeyError(f"{self.daemon}'s {role} is not an address: {self.fields[role]}")
        return address

    def port(self, role: str) -> int:
        return self.address(role)[1]

    def url(self, role: str = "http", path: str = "") -> str:
        """``http://host:port`` + ``path``, for the address of ``role``."""
        host, port = self.address(role)
        return f"http://{_host(host)}:{port}{path}"


def format_ready(line: ReadyLine) -> str:
    """The text of ``line`` (no newline).

    Raises:
        ValueError: a name, key or value that :func:`parse_ready` would not read back.
    """
    if not _NAME.fullmatch(line.daemon):
        raise ValueError(f"not a daemon name: {line.daemon!r}")
    parts = [line.daemon, "ready"]
    if line.key is not None:
        if not _KEY.fullmatch(line.key):
            raise ValueError(f"not a 64-hex key: {line.key!r}")
        parts.append(f"key={line.key}")
    for name, value in line.fields.items():
        if not _FIELD.fullmatch(name) or name == "key" or not value or any(
                c.isspace() for c in value):
            raise ValueError(f"not a field of a ready line: {name}={value!r}")
        parts.append(f"{name}={value}")
    text = " ".join(parts)
    if line.note:
        text += f" ({' '.join(line.note.split())})"  # one line, whatever the note holds
    return text


def print_ready(daemon: str, *, key: str | None = None,
                addresses: Mapping[str, tuple[str, int]] | None = None,
                facts: Mapping[str, str] | None = None, note: str = "",
                file: TextIO | None = None) -> None:
    """Print ``daemon``'s ready line on stdout (or ``file``), flushed.

    ``addresses``: where it listens, by role (``{"swarm": ("127.0.0.1", 49740)}``);
    ``facts``: other values a client needs (``{"database": "<hex>"}``).
    """
    fields = {role: f"{_host(host)}:{port}" for role, (host, port) in (addresses or {}).items()}
    fields.update(facts or {})
    print(format_ready(ReadyLine(daemon, key, fields, note)),
          file=sys.stdout if file is None else file, flush=True)


def parse_ready(text: str) -> ReadyLine | None:
    """The ready line ``text`` holds (surrounding blanks ignored); None if it is not one."""
    match = _LINE.fullmatch(text.strip())
    if match is None:
        return None
    key = None
    fields: dict[str, str] = {}
    for item in match["fields"].split():
        name, _, value = item.partition("=")
        if name in fields or (name == "key" and key is not None):
            return None  # a field twice: not a line a writer made
        if name == "key":
            if not _KEY.fullmatch(value):
                return None
            key = value
        else:
            fields[name] = value
    return ReadyLine(match["daemon"], key, fields, match["note"] or "")


def find_ready(output: str | Iterable[str], daemon: str | None = None) -> ReadyLine | None:
    """The first ready line (of ``daemon``, if given) in ``output`` (text or lines)."""
    lines = output.splitlines() if isinstance(output, str) else output
    for text in lines:
        line = parse_ready(text)
        if line is not None and (daemon is None or line.daemon == daemon):
            return line
    return None


def _address(value: str) -> tuple[str, int] | None:
    host, colon, port = value.rpartition(":")
    if not colon or not host or "/" in host or not port.isdigit() or int(port) > 65535:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
