"""Signed peer records: what an announcer stores under a topic (DESIGN.md §3.4).

Theory of operation
-------------------
A peer record says "the peer with this Ed25519 key can be reached at these
addresses, or through these relays". The announcer signs it; storing nodes keep
it until ``expires``; a looker-up gets it back and checks the signature itself.

Upstream HyperDHT (holepunch.md §1.6) signs over the *storing node's* ID and the
write token, so only the storing node can check a record and lookups return
unsigned records. Here the signature covers only a namespace, the topic and the
record, so **any** node and any looker-up verifies it end to end. What stops a
captured record from being replayed:

* ``expires`` (unix seconds) is bounded: :func:`verify_record` refuses a record
  that expires more than ``max_ttl_s`` (20 minutes, upstream's record cache
  ``maxAge``) plus :data:`CLOCK_SKEW_S` ahead, so a capture dies with the record;
* ``seq`` (uint64) grows with every announce of the same key; stores keep the
  highest ``seq`` per key and never take an older one back (``_storage.py``);
* the topic is in the signed bytes, so a record for topic A never verifies for B.

Encoding (msgpack, deterministic: ints use their shortest form, bytes are ``bin``)::

    signed bytes  = NS_ANNOUNCE (32) || topic (32) || msgpack(body)

    body          = [ public_key, addresses, relays, seq, expires ]
    wire record   = [ public_key, addresses, relays, seq, expires, signature ]

    +------------+---------------------------------------------------------+
    | public_key | bin 32: the announcer's Ed25519 public key              |
    | addresses  | array (0..4) of bin 6 (IPv4 ‖ port u16 BE)              |
    |            |                 or bin 18 (IPv6 ‖ port u16 BE)          |
    |            | = _contact.pack_address; IPv4-mapped IPv6 is refused    |
    |            | (it must be sent as IPv4), no duplicates, port 1-65535  |
    | relays     | array (0..3) of bin 32: relay public keys, no duplicates|
    | seq        | uint 0 .. 2**64-1                                       |
    | expires    | uint 0 .. 2**64-1, unix seconds                         |
    | signature  | bin 64: Ed25519 over the signed bytes above             |
    +------------+---------------------------------------------------------+

A record with 2 addresses and 3 relays encodes in about 250 bytes, so a reply
can carry several records in one datagram (DESIGN.md: datagrams well under
1,400 bytes).

Because the wire form is canonical (exactly one encoding per record),
:meth:`PeerRecord.from_wire` followed by re-encoding reproduces the bytes the
announcer signed; decoding refuses every non-canonical form instead of
normalising it.

Unannounce: ``signature = sign(NS_UNANNOUNCE || topic || msgpack([public_key,
seq]))``; it retires the stored record of that key whose ``seq`` is not higher.

Shortcomings: addresses are not checked for being routable (``0.0.0.0``,
multicast and private ranges pass); choosing what to announce is the node's job.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import KeyFormatError
from ..keys import KEY_BYTES, SIGNATURE_BYTES, KeyPair, derive_topic, verify_signature
from ._contact import canonical_address, pack_address
from ._errors import DhtDecodeError, DhtUsageError, RecordRejected

__all__ = [
    "CLOCK_SKEW_S",
    "MAX_ADDRESSES",
    "MAX_RECORD_TTL_S",
    "MAX_RELAYS",
    "NS_ANNOUNCE",
    "NS_UNANNOUNCE",
    "TOPIC_BYTES",
    "PeerRecord",
    "record_topic_for_key",
    "sign_record",
    "sign_unannounce",
    "verify_record",
    "verify_unannounce",
]

#: Signing namespace of ANNOUNCE records: BLAKE2b-256 of a versioned label.
NS_ANNOUNCE = hashlib.blake2b(b"cosmicac/dht/announce/1", digest_size=32).digest()
#: Signing namespace of UNANNOUNCE requests.
NS_UNANNOUNCE = hashlib.blake2b(b"cosmicac/dht/unannounce/1", digest_size=32).digest()

TOPIC_BYTES = 32
#: At most this many addresses per record (e.g. IPv4 + IPv6, public + LAN).
MAX_ADDRESSES = 4
#: At most this many relays per record (upstream stores at most 3 relayAddresses).
MAX_RELAYS = 3
#: Longest lifetime a record may claim: 20 minutes, upstream's record maxAge.
MAX_RECORD_TTL_S = 1200
#: Tolerated clock difference between announcer and verifier, in seconds
#: (upstream accepts a lookup ``bump`` up to 60 s in the future).
CLOCK_SKEW_S = 60
_UINT64_MAX = 2**64 - 1
_IPV4_WIRE_BYTES = 4 + 2
_IPV6_WIRE_BYTES = 16 + 2
#: Recent signature checks remembered by :func:`verify_record` (see there).
_SIGNATURE_CACHE_SIZE = 1024


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """A signed statement "this key is reachable here", stored under a topic.

    Build one with :func:`sign_record` (announcer) or :meth:`from_wire`
    (receiver). The constructor checks every field and canonicalises addresses.

    Raises:
        DhtUsageError: a field has the wrong type, size or count
            (code ``BAD_RECORD_FIELDS`` or ``BAD_ADDRESS``).
    """

    #: The announcer's Ed25519 public key (32 bytes).
    public_key: bytes
    #: Where the announcer listens: canonical ``(ip, port)`` pairs, IPv4 or IPv6, ≤ 4.
    addresses: tuple[tuple[str, int], ...]
    #: Public keys (32 bytes each) of relays that forward to the announcer, ≤ 3.
    relays: tuple[bytes, ...]
    #: Announce sequence number (uint64); a higher one replaces a lower one.
    seq: int
    #: Unix time in whole seconds after which the record is dead.
    expires: int
    #: Ed25519 signature (64 bytes) over NS_ANNOUNCE ‖ topic ‖ the encoded body.
    signature: bytes

    def __post_init__(self) -> None:
        _check_bytes(self.public_key, KEY_BYTES, "public_key")
        _check_bytes(self.signature, SIGNATURE_BYTES, "signature")
        _check_uint64(self.seq, "seq")
        _check_uint64(self.expires, "expires")
        object.__setattr__(self, "addresses", _canonical_addresses(self.addresses))
        object.__setattr__(self, "relays", _canonical_relays(self.relays))

    def encode_body(self) -> bytes:
        """The canonical msgpack encoding of the record without its signature.

        Returns:
            ``msgpack([public_key, [packed addresses], [relays], seq, expires])``.
        """
        return _pack(self._body())

    def to_wire(self) -> list[Any]:
        """The record as a msgpack-able list, signature last.

        Returns:
            ``[public_key, [packed addresses], [relays], seq, expires, signature]``;
            embed it in a message and ``msgpack.packb`` the message.
        """
        return [*self._body(), self.signature]

    @classmethod
    def from_wire(cls, obj: object) -> PeerRecord:
        """Decode a record from a value that ``msgpack.unpackb`` returned.

        Args:
            obj: anything; only the exact canonical wire form is accepted.

        Returns:
            The record. Its signature is *not* checked: call :func:`verify_record`.

        Raises:
            DhtDecodeError: code ``BAD_RECORD`` for any malformed value; no other
                exception escapes, whatever ``obj`` is.
        """
        if not isinstance(obj, list | tuple) or len(obj) != 6:
            raise _bad_record("a record is an array of 6 fields")
        public_key, raw_addresses, raw_relays, seq, expires, signature = obj
        if not isinstance(raw_addresses, list | tuple) or len(raw_addresses) > MAX_ADDRESSES:
            raise _bad_record(f"addresses must be an array of at most {MAX_ADDRESSES}")
        if not isinstance(raw_relays, list | tuple):
            raise _bad_record("relays must be an array")
        addresses = tuple(_unpack_address(raw) for raw in raw_addresses)
        try:
            return cls(public_key, addresses, tuple(raw_relays), seq, expires, signature)
        except DhtUsageError as exc:
            raise _bad_record(exc.message) from None

    def _body(self) -> list[Any]:
        return [
            self.public_key,
            [pack_address(host, port) for host, port in self.addresses],
            list(self.relays),
            self.seq,
            self.expires,
        ]


def sign_record(
    keypair: KeyPair,
    topic: bytes,
    *,
    addresses: Iterable[tuple[str, int]],
    relays: Iterable[bytes] = (),
    seq: int,
    expires: int,
) -> PeerRecord:
    """Make and sign the record that announces ``keypair`` under ``topic``.

    Args:
        keypair: the announcer's identity; its public key goes in the record.
        topic: the 32-byte topic announced under (part of the signed bytes).
        addresses: up to 4 ``(ip, port)`` pairs, IPv4 or IPv6; host names are refused.
        relays: up to 3 relay public keys (32 bytes each).
        seq: uint64; must grow with each announce of this key under this topic,
            refreshes included, or storing nodes ignore the new record.
        expires: unix seconds, at most ``now + MAX_RECORD_TTL_S``.

    Returns:
        The signed record; send ``record.to_wire()``.

    Raises:
        DhtUsageError: a bad topic (``BAD_TOPIC``), address (``BAD_ADDRESS``) or
            other field (``BAD_RECORD_FIELDS``).
    """
    _check_topic(topic)
    unsigned = PeerRecord(
        keypair.public_key,
        tuple(addresses),
        tuple(relays),
        seq,
        expires,
        bytes(SIGNATURE_BYTES),
    )
    signature = keypair.sign(NS_ANNOUNCE + topic + unsigned.encode_body())
    return PeerRecord(
        unsigned.public_key,
        unsigned.addresses,
        unsigned.relays,
        unsigned.seq,
        unsigned.expires,
        signature,
    )


def verify_record(
    record: PeerRecord,
    topic: bytes,
    *,
    now: float,
    max_ttl_s: float = MAX_RECORD_TTL_S,
) -> None:
    """Check that ``record`` is alive, not too long-lived and signed for ``topic``.

    Cheap checks run first so a flood of expired records costs no signature checks.

    Args:
        record: a record from :meth:`PeerRecord.from_wire`.
        topic: the 32-byte topic the record was stored or found under.
        now: the current unix time in seconds (the caller's clock).
        max_ttl_s: the longest lifetime accepted; ``CLOCK_SKEW_S`` is added to it.

    Raises:
        RecordRejected: ``BAD_RECORD`` (not a PeerRecord), ``EXPIRED``
            (``expires <= now``), ``EXPIRES_TOO_FAR`` (``expires > now + max_ttl_s
            + CLOCK_SKEW_S``) or ``BAD_SIGNATURE``. Drop the record and count it.
        DhtUsageError: ``topic`` is not 32 bytes (``BAD_TOPIC``).
    """
    _check_topic(topic)
    if not isinstance(record, PeerRecord):
        raise RecordRejected(f"not a peer record: {type(record).__name__}", code="BAD_RECORD")
    if record.expires <= now:
        raise RecordRejected(
            f"record expired at {record.expires}, now is {now:.0f}", code="EXPIRED"
        )
    if record.expires > now + max_ttl_s + CLOCK_SKEW_S:
        raise RecordRejected(
            f"record expires at {record.expires}, more than {max_ttl_s:g} s after {now:.0f}",
            code="EXPIRES_TOO_FAR",
        )
    signed = NS_ANNOUNCE + topic + record.encode_body()
    if not _signature_valid(record.public_key, signed, record.signature):
        raise RecordRejected("record signature does not verify", code="BAD_SIGNATURE")


@functools.lru_cache(maxsize=_SIGNATURE_CACHE_SIZE)
def _signature_valid(public_key: bytes, signed: bytes, signature: bytes) -> bool:
    # A lookup gets the same record from up to k storing nodes, and an Ed25519
    # check (~80 us) costs more than the rest of handling a reply: remember the
    # outcome, keyed on every signed byte, so each further copy is a dict hit.
    # Bounded (LRU); a flood of distinct records only evicts entries.
    return verify_signature(public_key, signed, signature)


def sign_unannounce(keypair: KeyPair, topic: bytes, seq: int) -> bytes:
    """Sign the retirement of ``keypair``'s record under ``topic``.

    Args:
        keypair: the announcer.
        topic: the 32-byte topic.
        seq: the seq being retired; stores drop the key's record if its seq is
            not higher. Use the seq of the last announce (or higher).

    Returns:
        The 64-byte signature to send in an UNANNOUNCE request.

    Raises:
        DhtUsageError: a bad topic (``BAD_TOPIC``) or seq (``BAD_RECORD_FIELDS``).
    """
    _check_topic(topic)
    _check_uint64(seq, "seq")
    return keypair.sign(_unannounce_signable(keypair.public_key, topic, seq))


def verify_unannounce(public_key: bytes, topic: bytes, seq: int, signature: bytes) -> bool:
    """Check an UNANNOUNCE signature.

    Args:
        public_key: the key whose record is retired.
        topic: the 32-byte topic.
        seq: the seq the request retires.
        signature: the 64-byte signature from :func:`sign_unannounce`.

    Returns:
        True if valid. Never raises: malformed input of any type is just invalid.
    """
    if not (
        _is_bytes(public_key, KEY_BYTES)
        and _is_bytes(topic, TOPIC_BYTES)
        and _is_bytes(signature, SIGNATURE_BYTES)
        and _is_uint64(seq)
    ):
        return False
    return verify_signature(public_key, _unannounce_signable(public_key, topic, seq), signature)


def record_topic_for_key(public_key: bytes) -> bytes:
    """The topic a peer announces itself under, so ``find_peer(key)`` finds it.

    Args:
        public_key: a 32-byte Ed25519 public key.

    Returns:
        ``derive_topic("peer", public_key)`` (32 bytes).

    Raises:
        DhtUsageError: the key is not 32 bytes (``BAD_RECORD_FIELDS``).
    """
    _check_bytes(public_key, KEY_BYTES, "public_key")
    return derive_topic("peer", public_key)


# --- helpers -----------------------------------------------------------------


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _unannounce_signable(public_key: bytes, topic: bytes, seq: int) -> bytes:
    return NS_UNANNOUNCE + topic + _pack([public_key, seq])


def _bad_record(reason: str) -> DhtDecodeError:
    return DhtDecodeError(f"malformed peer record: {reason}", code="BAD_RECORD")


def _is_bytes(value: object, size: int) -> bool:
    return type(value) is bytes and len(value) == size


def _is_uint64(value: object) -> bool:
    return type(value) is int and 0 <= value <= _UINT64_MAX


def _check_bytes(value: object, size: int, name: str) -> None:
    if not _is_bytes(value, size):
        raise DhtUsageError(
            f"{name} must be {size} bytes, got {_describe(value)}", code="BAD_RECORD_FIELDS"
        )


def _check_uint64(value: object, name: str) -> None:
    # bool is an int subclass; True is not a sequence number.
    if not _is_uint64(value):
        raise DhtUsageError(
            f"{name} must be an int in 0..2**64-1, got {_describe(value)}",
            code="BAD_RECORD_FIELDS",
        )


def _check_topic(topic: object) -> None:
    if not _is_bytes(topic, TOPIC_BYTES):
        raise DhtUsageError(
            f"a topic is {TOPIC_BYTES} bytes, got {_describe(topic)}", code="BAD_TOPIC"
        )


def _describe(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return repr(value)
    return type(value).__name__


def _canonical_addresses(addresses: object) -> tuple[tuple[str, int], ...]:
    if not isinstance(addresses, tuple | list):
        raise DhtUsageError("addresses must be a tuple", code="BAD_RECORD_FIELDS")
    if len(addresses) > MAX_ADDRESSES:
        raise DhtUsageError(
            f"at most {MAX_ADDRESSES} addresses, got {len(addresses)}", code="BAD_RECORD_FIELDS"
        )
    result: list[tuple[str, int]] = []
    for entry in addresses:
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            raise DhtUsageError(f"an address is (ip, port), got {entry!r}", code="BAD_ADDRESS")
        host, port = entry
        if not isinstance(host, str) or type(port) is not int:
            raise DhtUsageError(f"an address is (ip, port), got {entry!r}", code="BAD_ADDRESS")
        try:
            canonical = canonical_address(host, port)
        except KeyFormatError as exc:
            raise DhtUsageError(exc.message, code="BAD_ADDRESS") from None
        if canonical in result:
            raise DhtUsageError(f"duplicate address {canonical!r}", code="BAD_ADDRESS")
        result.append(canonical)
    return tuple(result)


def _canonical_relays(relays: object) -> tuple[bytes, ...]:
    if not isinstance(relays, tuple | list):
        raise DhtUsageError("relays must be a tuple", code="BAD_RECORD_FIELDS")
    if len(relays) > MAX_RELAYS:
        raise DhtUsageError(
            f"at most {MAX_RELAYS} relays, got {len(relays)}", code="BAD_RECORD_FIELDS"
        )
    for relay in relays:
        _check_bytes(relay, KEY_BYTES, "a relay key")
    if len(set(relays)) != len(relays):
        raise DhtUsageError("duplicate relay key", code="BAD_RECORD_FIELDS")
    return tuple(relays)


def _unpack_address(raw: object) -> tuple[str, int]:
    """Decode one ``pack_address`` value, refusing every non-canonical form."""
    if type(raw) is not bytes or len(raw) not in (_IPV4_WIRE_BYTES, _IPV6_WIRE_BYTES):
        raise _bad_record("an address is 6 (IPv4) or 18 (IPv6) bytes")
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    if len(raw) == _IPV4_WIRE_BYTES:
        ip = ipaddress.IPv4Address(raw[:4])
    else:
        ip = ipaddress.IPv6Address(raw[:16])
        if ip.ipv4_mapped is not None:
            # pack_address folds these to IPv4; accepting both would give one
            # record two encodings (and two signatures).
            raise _bad_record("an IPv4-mapped IPv6 address must be sent as IPv4")
    port = int.from_bytes(raw[-2:], "big")
    if port == 0:
        raise _bad_record("port 0 is not an address")
    return (str(ip), port)
