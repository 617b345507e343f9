"""Contacts and address-derived node IDs (DESIGN.md §3.4; HyperDHT's rule).

A node's ID is the 160-bit BLAKE2b hash of the address its peers observe, so a
node cannot choose where it sits in the key space (no placing oneself next to a
target), and every ID in a routing table names a reachable address. Receivers
recompute the ID from the datagram's source address and ignore a claimed ID
that does not match.

Addresses are canonicalised before hashing: IPv4 as its 4 packed bytes, IPv6
(including IPv4-mapped forms, which are folded to IPv4) as 16 bytes, then the
port as 2 big-endian bytes. Host names are not addresses and are refused.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from typing import NamedTuple

from ..errors import KeyFormatError

__all__ = ["ID_BYTES", "Contact", "canonical_address", "node_id_for", "pack_address"]

#: Kademlia node IDs are 160 bits (the `kademlia` package's routing table).
ID_BYTES = 20
_ID_PERSON = b"cosmicac-dht-id"  # BLAKE2b personalisation (≤ 16 bytes)


class Contact(NamedTuple):
    """A DHT node as others see it: its ID and the address the ID derives from."""

    id: bytes
    host: str
    port: int

    @classmethod
    def at(cls, host: str, port: int) -> Contact:
        host, port = canonical_address(host, port)
        return cls(node_id_for(host, port), host, port)

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


# Parsing an address with ipaddress costs ~20 us and a DHT node meets the same
# few thousand addresses again and again: cache the pure functions (bounded).
_CACHE_SIZE = 8192


@functools.lru_cache(maxsize=_CACHE_SIZE)
def canonical_address(host: str, port: int) -> tuple[str, int]:
    """Return the address in one canonical spelling (IPv4-mapped IPv6 → IPv4).

    Raises:
        KeyFormatError: ``host`` is not an IP address or ``port`` is out of range.
    """
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0] if isinstance(host, str) else host)
    except ValueError:
        raise KeyFormatError(f"{host!r} is not an IP address") from None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not isinstance(port, int) or not 0 < port < 65536:
        raise KeyFormatError(f"port must be 1-65535, got {port!r}")
    return (str(ip), port)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def pack_address(host: str, port: int) -> bytes:
    """The canonical binary form of an address: IP bytes then a u16 port."""
    host, port = canonical_address(host, port)
    return ipaddress.ip_address(host).packed + port.to_bytes(2, "big")


@functools.lru_cache(maxsize=_CACHE_SIZE)
def node_id_for(host: str, port: int) -> bytes:
    """The 160-bit node ID of the node observed at ``host:port``."""
    return hashlib.blake2b(
        pack_address(host, port), digest_size=ID_BYTES, person=_ID_PERSON
    ).digest()
