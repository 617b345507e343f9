"""The settings every platform daemon shares: its peer, its HTTP side, the peers it dials.

- :class:`PeerSettings`: a daemon that is one peer on the swarm (``storage``,
  ``host``, ``port``, ``bootstrap``, ``relays``, ``relay_addresses``,
  ``announce_addresses``). Each
  daemon's settings subclass it with its environment prefix and its default
  port, so ``COSMICAC_ORK__PORT`` and a file's ``port = …`` read as they
  always did: the keys stay flat, at the top of the daemon's settings.
- :class:`HttpSettings`: where a daemon's HTTP side listens (``http.host``,
  ``http.port``); a daemon subclasses it for its default port and its own
  fields (app-node's body limits, wrk-monitor's token, the proxy's budgets).
- :class:`PeerRef`: another daemon a daemon dials, its key and the addresses
  tried before the DHT. Configs keep the flat pair (``ork`` and
  ``ork_addresses``, ``monitor`` and ``monitor_addresses``): :func:`peer_ref`
  builds the reference from it, so no config changes shape.

``cosmicac up`` reads each daemon's default ports from these models
(``cli/up.py``, ``default_ports``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator

from p2p.daemon import AddressList, DaemonSettings, Port, PublicKey, PublicKeyList

__all__ = ["HttpSettings", "PeerRef", "PeerSettings", "UpstreamUrl", "parse_upstream_url",
           "peer_ref"]


class PeerSettings(DaemonSettings):
    """A daemon that is one peer: its folder (identity, state) and its swarm.

    Subclass it with the daemon's prefix and default port::

        class OrkSettings(PeerSettings):
            model_config = SettingsConfigDict(env_prefix="COSMICAC_ORK__")
            port: Port = ORK_PORT

    :func:`nodes.kit.peer.start_peer` builds the swarm from these fields.
    """

    #: The daemon's folder: its identity (``identity``) and its state.
    storage: Path
    #: Address of the swarm's listener (TCP and UDP).
    host: str = "0.0.0.0"
    #: Its port: every daemon names its own default.
    port: Port
    #: DHT bootstrap nodes (``host:port``).
    bootstrap: AddressList = ()
    #: Blind relays to stay reachable through.
    relays: PublicKeyList = ()
    #: Where relays listen (``{key: ["host:port", ...]}``): reached there with no DHT
    #: lookup, so a relay serves peers that reach no DHT node (seeds/relay.txt).
    relay_addresses: dict[PublicKey, AddressList] = {}
    #: Addresses to announce instead of the listener's (a NAT's forward).
    announce_addresses: AddressList | None = None
    #: Beacon this daemon's key and addresses on the LAN's multicast group and learn
    #: the others' (p2p.lan): peers of one LAN meet with no DHT reachable. Off by
    #: default: a beacon reaches every host of the segment.
    lan_discovery: bool = False
    #: Move connections that came through a relay to a direct path when a TCP hole
    #: punch gets through both NATs (p2p.punch), keeping the session; off: relayed
    #: connections stay on the relay.
    hole_punching: bool = True


class HttpSettings(BaseModel):
    """Where a daemon's HTTP side listens (``http.host``, ``http.port``).

    A daemon subclasses it for its default port and its own fields;
    :func:`nodes.kit.peer.serve_http` serves an app on it.
    """

    model_config = {"extra": "forbid"}

    #: Loopback by default: the entry point (or Caddy) is the users' door.
    host: str = "127.0.0.1"
    #: Each daemon names its default; 0: any free port (tests, benchmarks).
    port: Port = 0


@dataclass(frozen=True)
class PeerRef:
    """Another daemon this one dials: its key, and where it listens.

    ``addresses`` (``host:port``) are tried before the DHT; empty: the DHT only.
    """

    key: bytes
    addresses: tuple[tuple[str, int], ...] = ()


def peer_ref(settings: object, name: str) -> PeerRef | None:
    """The peer a flat pair of settings names: ``<name>`` and ``<name>_addresses``.

    ``peer_ref(settings, "ork")`` reads ``settings.ork`` (a key, or None) and
    ``settings.ork_addresses``.

    Returns:
        None when ``<name>`` is unset (the daemon runs without that peer).
    """
    key = getattr(settings, name)
    if key is None:
        return None
    return PeerRef(key, tuple(getattr(settings, f"{name}_addresses", ())))


def parse_upstream_url(value: Any) -> Any:
    """An upstream's base URL, normalised: ``http(s)://host[:port][/path]``, no trailing ``/``.

    Raises:
        ValueError: another scheme, no host, a query or fragment, or a bad port.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r} is not an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError(f"{text!r} names no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r} has a query or fragment; give a base URL")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    return text.rstrip("/")


#: An upstream's base URL (validated, without a trailing ``/``): the entry point's
#: services, the UI's API.
UpstreamUrl = Annotated[str, BeforeValidator(parse_upstream_url)]
