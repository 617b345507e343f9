"""LAN beacons without I/O: a peer's key and addresses, signed, for a multicast group.

A beacon says "the peer with this key listens at these addresses, as of this
time", signed by that key. Anyone on the LAN may send one, so a receiver
believes only what the signature covers: a peer can announce only its own key,
and nobody can change or extend what it announced. A beacon replayed later is
refused by its time (older than the newest one kept for that key, or outside
``max_skew_ms`` of the receiver's clock).

Wire format (big-endian)::

    magic    4   b"CACL"
    version  1   1
    kind     1   0 announce, 1 query (announce, and ask others to answer now)
    time_ms  8   the sender's wall clock
    key     32   the sender's Ed25519 public key
    count    1   addresses, 1..8
    each:        family 1 (4 or 6), address 4 or 16, port 2 (not 0)
    sig     64   Ed25519 over b"cosmicac-lan-beacon/1" + every byte before it

At most 263 bytes: one datagram, never fragmented.

:class:`LanBook` keeps what beacons said, bounded in count and time, and decides
when a query may be answered (one answer per ``answer_every_s``: a flood of
queries gets one beacon a second, not one each).
"""

from __future__ import annotations

import ipaddress
import struct
from collections import OrderedDict
from dataclasses import dataclass

from ..keys import KEY_BYTES, SIGNATURE_BYTES, KeyPair, verify_signature

__all__ = ["ANNOUNCE", "MAX_ADDRESSES", "MAX_BEACON_BYTES", "QUERY", "Beacon", "BeaconError",
           "LanBook", "decode_beacon", "encode_beacon"]

MAGIC = b"CACL"
VERSION = 1
ANNOUNCE, QUERY = 0, 1
MAX_ADDRESSES = 8
#: What the signature covers besides the beacon: a signature of ours for anything
#: else (a DHT record, a handshake) is never a valid beacon.
DOMAIN = b"cosmicac-lan-beacon/1"
_HEAD = struct.Struct(">4sBBQ32sB")
MAX_BEACON_BYTES = _HEAD.size + MAX_ADDRESSES * (1 + 16 + 2) + SIGNATURE_BYTES

Address = tuple[str, int]


class BeaconError(ValueError):
    """Not a valid beacon; the message says what is wrong."""


@dataclass(frozen=True)
class Beacon:
    kind: int
    time_ms: int
    public_key: bytes
    addresses: tuple[Address, ...]


def encode_beacon(keypair: KeyPair, addresses: tuple[Address, ...] | list[Address], *,
                  time_ms: int, kind: int = ANNOUNCE) -> bytes:
    """A signed beacon of ``keypair``'s key at ``addresses`` (1..8 IP addresses)."""
    if not 1 <= len(addresses) <= MAX_ADDRESSES:
        raise ValueError(f"a beacon names 1 to {MAX_ADDRESSES} addresses, not "
                         f"{len(addresses)}")
    if kind not in (ANNOUNCE, QUERY):
        raise ValueError(f"no beacon kind {kind}")
    body = bytearray(_HEAD.pack(MAGIC, VERSION, kind, time_ms, keypair.public_key,
                                len(addresses)))
    for host, port in addresses:
        ip = ipaddress.ip_address(host)
        if not 0 < port < 65536:
            raise ValueError(f"port {port} of {host}")
        body += bytes([ip.version]) + ip.packed + port.to_bytes(2, "big")
    return bytes(body) + keypair.sign(DOMAIN + bytes(body))


def decode_beacon(data: bytes, *, now_ms: int, max_skew_ms: int = 60_000) -> Beacon:
    """The beacon in ``data``, checked whole (shape, signature, time), or
    :class:`BeaconError` (never another exception)."""
    if not _HEAD.size + 7 + SIGNATURE_BYTES <= len(data) <= MAX_BEACON_BYTES:
        raise BeaconError(f"{len(data)} bytes: not a beacon's size")
    magic, version, kind, time_ms, key, count = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise BeaconError("not a beacon (magic)")
    if version != VERSION:
        raise BeaconError(f"beacon version {version}, not {VERSION}")
    if kind not in (ANNOUNCE, QUERY):
        raise BeaconError(f"no beacon kind {kind}")
    if not 1 <= count <= MAX_ADDRESSES:
        raise BeaconError(f"{count} addresses: 1 to {MAX_ADDRESSES}")
    offset = _HEAD.size
    addresses = []
    for _ in range(count):
        family = data[offset] if offset < len(data) else None
        size = {4: 4, 6: 16}.get(family)  # type: ignore[arg-type]
        if size is None:
            raise BeaconError(f"address family {family}")
        end = offset + 1 + size + 2
        if end > len(data) - SIGNATURE_BYTES:
            raise BeaconError("addresses run past the signature")
        packed = data[offset + 1:offset + 1 + size]
        port = int.from_bytes(data[offset + 1 + size:end], "big")
        if port == 0:
            raise BeaconError("port 0")
        host = str(ipaddress.ip_address(packed))
        addresses.append((host, port))
        offset = end
    if offset != len(data) - SIGNATURE_BYTES:
        raise BeaconError("bytes after the addresses")
    if len(key) != KEY_BYTES or not verify_signature(key, DOMAIN + data[:offset],
                                                     data[offset:]):
        raise BeaconError("bad signature")
    if abs(time_ms - now_ms) > max_skew_ms:
        raise BeaconError(f"time {time_ms} is {abs(time_ms - now_ms)} ms from ours")
    return Beacon(kind, time_ms, key, tuple(addresses))


class LanBook:
    """Peers heard on the LAN: their addresses, kept ``ttl_s`` after their last beacon.

    Times are passed in (seconds, monotonic for expiry; the beacon's own
    ``time_ms`` orders beacons of one key), so the book has no clock.
    """

    def __init__(self, *, ttl_s: float = 30.0, max_peers: int = 1024,
                 answer_every_s: float = 1.0) -> None:
        self.ttl_s, self.max_peers, self.answer_every_s = ttl_s, max_peers, answer_every_s
        #: key -> (addresses, beacon time_ms, expires at)
        self._peers: OrderedDict[bytes, tuple[tuple[Address, ...], int, float]] = OrderedDict()
        self._answered_at: float | None = None
        #: Beacons taken, and refused (stale: replayed or out of order).
        self.learned = 0
        self.stale = 0

    def __len__(self) -> int:
        return len(self._peers)

    def learn(self, beacon: Beacon, now: float) -> bool:
        """Keep ``beacon``'s addresses; False (nothing changes) for one not newer than
        the last kept for its key."""
        held = self._peers.get(beacon.public_key)
        if held is not None and beacon.time_ms <= held[1]:
            self.stale += 1
            return False
        self._peers[beacon.public_key] = (beacon.addresses, beacon.time_ms, now + self.ttl_s)
        self._peers.move_to_end(beacon.public_key)
        while len(self._peers) > self.max_peers:
            self._peers.popitem(last=False)
        self.learned += 1
        return True

    def addresses(self, public_key: bytes, now: float) -> tuple[Address, ...]:
        """Where ``public_key`` said it listens, if it said so within ``ttl_s``."""
        held = self._peers.get(public_key)
        if held is None:
            return ()
        if held[2] <= now:
            del self._peers[public_key]
            return ()
        return held[0]

    def peers(self, now: float) -> list[bytes]:
        """The keys heard within ``ttl_s``."""
        return [key for key, held in self._peers.items() if held[2] > now]

    def may_answer(self, now: float) -> bool:
        """Answer a query now? At most once per ``answer_every_s``."""
        if self._answered_at is not None and now - self._answered_at < self.answer_every_s:
            return False
        self._answered_at = now
        return True
