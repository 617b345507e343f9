"""The DHT's UDP wire codec: one datagram carries exactly one message.

Theory of operation
-------------------
This module owns the bytes of every DHT datagram and nothing else: it neither
sends, nor keeps time, nor decides what a node answers. :func:`encode` turns a
:class:`Request` or :class:`Response` into one msgpack array; :func:`decode`
turns a datagram back into one, or raises :class:`DhtDecodeError` (a
``RemoteProtocolError``, code ``DECODE_ERROR``) and nothing else, whatever the
bytes. The driver drops such a datagram, counts it and keeps serving
(STYLE.md, "Errors").

Messages are validated when they are built, so a message that exists is one
that encodes, and ``decode(encode(m)) == m`` for every message ``m`` (arrays in
``value`` come back as lists). Building an invalid message locally raises
:class:`DhtUsageError`; the same checks on a decoded datagram raise
:class:`DhtDecodeError`.

Wire format (version 1)
-----------------------
Every datagram is a msgpack array of fixed length. ``nil`` marks an absent
optional field; the array length never varies, so extra or missing fields are
refused. Addresses are ``pack_address`` bytes: 4 IPv4 bytes or 16 IPv6 bytes,
then a big-endian u16 port (6 or 18 bytes; IPv4-mapped IPv6 is always sent as
IPv4, and the unspecified, multicast and broadcast addresses and port 0 are
refused)::

    Request  = [0, 1, tid, command, target, sender_id, token, value]          8 items
    Response = [1, 1, tid, responder_id, observed, token, closer, error, value] 9 items

    +--------------+-------------------+------------------------------------------------+
    | field        | msgpack type      | meaning                                        |
    +==============+===================+================================================+
    | type         | uint 0 / 1        | 0 = Request, 1 = Response                      |
    | version      | uint 1            | VERSION; any other value is refused            |
    | tid          | uint32            | request id; the response echoes it             |
    | command      | uint 0..6         | PING 0, FIND_NODE 1, ANNOUNCE 2,               |
    |              |                   | UNANNOUNCE 3, LOOKUP 4, PING_BACK 5, PROBE 6   |
    | target       | nil | bin 20 | 32 | PING: nil; FIND_NODE: a 20-byte node id;      |
    |              |                   | PING_BACK/PROBE: a 20-byte nonce;              |
    |              |                   | ANNOUNCE/UNANNOUNCE/LOOKUP: a 32-byte topic    |
    | sender_id    | nil | bin 20       | set only by a persistent, reachable sender;    |
    |              |                   | receivers check it with ``node_id_for``        |
    | token        | nil | bin 16       | Request: the write token the target gave us    |
    |              | bin 16            | Response: a fresh token for the asker          |
    | value        | nil | array        | Request: nil for PING/FIND_NODE/LOOKUP, an     |
    |              |                   | array for ANNOUNCE (a record's wire list) and  |
    |              |                   | UNANNOUNCE ([public_key, seq, signature]).     |
    |              |                   | Response: nil or an array (e.g. LOOKUP: a list |
    |              |                   | of record wire lists). Validated by the node.  |
    | responder_id | nil | bin 20       | like sender_id, for the responder              |
    | observed     | bin 6 | 18         | the asker's address as the responder saw it    |
    | closer       | array of bin 6|18 | at most MAX_CLOSER contacts' addresses; their  |
    |              |                   | ids are recomputed, never read from the wire   |
    | error        | nil | str          | a stable code, ``[A-Z][A-Z0-9_]{0,63}``        |
    |              |                   | (INVALID_TOKEN, BAD_RECORD, TOO_MANY ...)      |
    +--------------+-------------------+------------------------------------------------+

``value`` may hold nil, bool, int (msgpack's 64-bit range), float, str, bin,
arrays and maps with str or bin keys, nested at most 16 deep; msgpack
extension types (timestamps included) are refused.

Size discipline
---------------
A datagram is at most :data:`MAX_DATAGRAM_BYTES` (1,400, under the 1,500-byte
Ethernet MTU with room for IPv6/UDP headers and tunnels; HyperDHT keeps its
replies under the same bound). A response with 20 IPv6 closer contacts and no
value takes about 450 bytes. :func:`encode` raises :class:`DhtMessageTooLarge`
rather than emit a bigger datagram, and :func:`decode` refuses one; the node
caps the records of a reply with :func:`value_budget_bytes` and
:func:`fit_records` before building it.

Shortfalls: the codec does not check the shape of ``value`` beyond the above;
records are verified by ``_records``. Address decoding and packing use two
bounded caches (a DHT sees the same contacts over and over); a hostile stream
of fresh addresses only evicts entries.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import KeyFormatError
from ._contact import ID_BYTES, Contact, canonical_address, node_id_for
from ._errors import DhtDecodeError, DhtMessageTooLarge, DhtUsageError
from ._tokens import TOKEN_BYTES

__all__ = [
    "MAX_CLOSER",
    "MAX_DATAGRAM_BYTES",
    "MAX_TID",
    "TOPIC_BYTES",
    "VERSION",
    "Command",
    "Message",
    "Request",
    "Response",
    "decode",
    "encode",
    "encode_with_records",
    "fit_records",
    "value_budget_bytes",
]

#: Wire version; bumped on any incompatible change to the arrays above.
VERSION = 1
#: Largest datagram we send or accept (bytes).
MAX_DATAGRAM_BYTES = 1400
#: Most closer contacts one response may carry (Kademlia's k = 20).
MAX_CLOSER = 20
#: Largest request id (u32).
MAX_TID = 2**32 - 1
#: Topics (ANNOUNCE/UNANNOUNCE/LOOKUP targets) are 32 bytes.
TOPIC_BYTES = 32

_REQUEST, _RESPONSE = 0, 1
_REQUEST_LEN, _RESPONSE_LEN = 8, 9
_ERROR_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_MAX_VALUE_DEPTH = 16
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack can carry
# Packed-address caches: entries are ~200 bytes, so 4,096 of each is under 2 MiB.
_ADDRESS_CACHE_SIZE = 4096
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


class Command(enum.IntEnum):
    """What a request asks for."""

    #: Are you alive? (also tells the asker its observed address)
    PING = 0
    #: Which nodes do you know closest to ``target`` (a node id)?
    FIND_NODE = 1
    #: Store this signed record under ``target`` (needs a token).
    ANNOUNCE = 2
    #: Drop the record of this key under ``target`` (signed; needs a token).
    UNANNOUNCE = 3
    #: Which records do you hold under ``target``?
    LOOKUP = 4
    #: Reachability check: besides replying, send a PROBE carrying ``target``
    #: (a 20-byte nonce) to my observed address from a *different* socket.
    PING_BACK = 5
    #: The probe a PING_BACK asked for; never answered.
    PROBE = 6


_TARGET_BYTES = {
    Command.PING: None,
    Command.FIND_NODE: ID_BYTES,
    Command.ANNOUNCE: TOPIC_BYTES,
    Command.UNANNOUNCE: TOPIC_BYTES,
    Command.LOOKUP: TOPIC_BYTES,
    Command.PING_BACK: ID_BYTES,
    Command.PROBE: ID_BYTES,
}
_NEEDS_VALUE = frozenset({Command.ANNOUNCE, Command.UNANNOUNCE})
_COMMANDS = {int(command): command for command in Command}  # Command(n) is an enum call


class _Invalid(Exception):
    """A field breaks the format; becomes DhtUsageError or DhtDecodeError."""


@dataclass(frozen=True, slots=True)
class Request:
    """A request from an asker; answered by a :class:`Response` with the same ``tid``.

    Raises:
        DhtUsageError: a field breaks the wire format (see the module docstring).
    """

    #: Request id (u32), echoed by the response.
    tid: int
    command: Command
    #: PING: None; FIND_NODE: a 20-byte node id; others: a 32-byte topic.
    target: bytes | None = None
    #: 20-byte id, only when the sender claims to be persistent and reachable.
    sender_id: bytes | None = None
    #: 16-byte write token (ANNOUNCE/UNANNOUNCE; a node refuses them without one).
    token: bytes | None = None
    #: Command payload: a record's wire list (ANNOUNCE),
    #: ``[public_key, seq, signature]`` (UNANNOUNCE), else None.
    value: Any = None

    def __post_init__(self) -> None:
        try:
            _check_request(self)
        except _Invalid as exc:
            raise DhtUsageError(f"invalid request: {exc}", code="BAD_MESSAGE") from None


@dataclass(frozen=True, slots=True)
class Response:
    """A responder's answer to the :class:`Request` with the same ``tid``.

    Raises:
        DhtUsageError: a field breaks the wire format (see the module docstring).
    """

    tid: int
    #: 20-byte id, only when the responder is persistent and reachable.
    responder_id: bytes | None
    #: The asker's address as the responder saw it (how a node learns its own).
    observed: tuple[str, int]
    #: A fresh 16-byte write token for the asker.
    token: bytes
    #: Up to MAX_CLOSER contacts closer to the target; only addresses cross the wire.
    closer: tuple[Contact, ...] = ()
    #: A stable error code (INVALID_TOKEN, BAD_RECORD, TOO_MANY ...) or None.
    error: str | None = None
    #: Reply payload, e.g. a list of record wire lists for LOOKUP.
    value: Any = None

    def __post_init__(self) -> None:
        try:
            _check_response(self)
        except _Invalid as exc:
            raise DhtUsageError(f"invalid response: {exc}", code="BAD_MESSAGE") from None


Message = Request | Response

_packer = msgpack.Packer(use_bin_type=True, autoreset=True)


def encode(msg: Message) -> bytes:
    """Encode one message as one datagram.

    Args:
        msg: a :class:`Request` or :class:`Response` (already validated when built).

    Returns:
        The datagram, at most :data:`MAX_DATAGRAM_BYTES` long.

    Raises:
        DhtMessageTooLarge: the datagram would exceed ``MAX_DATAGRAM_BYTES``;
            shrink ``value`` first (:func:`fit_records`).
        DhtUsageError: ``msg`` is not a message.
    """
    data = _pack_wire(_to_wire(msg))
    if len(data) > MAX_DATAGRAM_BYTES:
        raise DhtMessageTooLarge(
            f"{type(msg).__name__} encodes to {len(data)} bytes > {MAX_DATAGRAM_BYTES}"
        )
    return data


def decode(data: bytes) -> Message:
    """Decode one datagram.

    Args:
        data: the datagram's bytes, exactly as received.

    Returns:
        The :class:`Request` or :class:`Response` it carries. Contacts in
        ``closer`` carry ids recomputed from their addresses. ``sender_id`` and
        ``responder_id`` are returned as claimed; the node checks them against
        the datagram's source with ``id_matches``.

    Raises:
        DhtDecodeError: the datagram is not a well-formed message (not msgpack,
            trailing bytes, wrong types or lengths, unknown type, version or
            command, bad addresses, too many contacts, too large ...). Drop it.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DhtDecodeError(f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_DATAGRAM_BYTES:
        raise DhtDecodeError(f"datagram of {len(data)} bytes > {MAX_DATAGRAM_BYTES}")
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True)
    except Exception as exc:  # msgpack raises many types; translate them once, here
        raise DhtDecodeError(f"not msgpack: {type(exc).__name__}: {exc}") from None
    try:
        return _from_wire(obj)
    except _Invalid as exc:
        raise DhtDecodeError(str(exc)) from None
    except DhtUsageError as exc:  # a field check in __post_init__
        raise DhtDecodeError(exc.message) from None


def value_budget_bytes(msg: Message) -> int:
    """How many bytes ``msg``'s ``value`` may take so that the message still fits.

    Args:
        msg: the message as it will be sent (its current ``value`` is ignored).

    Returns:
        The largest encoded size of ``value`` (msgpack, headers included) for
        which :func:`encode` succeeds; may be negative if nothing fits.
    """
    wire = _to_wire(msg)
    wire[-1] = None
    bare = _pack_wire(wire)
    return MAX_DATAGRAM_BYTES - (len(bare) - 1)  # -1: the nil placeholder


def fit_records(records_wire: Sequence[Any], budget_bytes: int) -> list[Any]:
    """The longest prefix of ``records_wire`` whose msgpack array fits the budget.

    Typical use in a LOOKUP reply::

        reply = Response(tid, my_id, observed, token, closer)
        reply = replace(reply, value=fit_records(wires, value_budget_bytes(reply)))

    Args:
        records_wire: record wire lists, in order of preference.
        budget_bytes: bytes available for the whole array (see
            :func:`value_budget_bytes`).

    Returns:
        A new list, possibly empty, whose encoding is at most ``budget_bytes``
        (an empty list takes 1 byte).

    Raises:
        DhtUsageError: a record holds something msgpack cannot encode.
    """
    fitted: list[Any] = []
    body = 0
    for record in records_wire:
        try:
            size = len(_packer.pack(record))
        except (TypeError, ValueError, OverflowError) as exc:
            raise DhtUsageError(f"record cannot be encoded: {exc}") from None
        count = len(fitted) + 1
        header = 1 if count <= 15 else 3 if count <= 0xFFFF else 5
        if header + body + size > budget_bytes:
            break
        body += size
        fitted.append(record)
    return fitted


def encode_with_records(bare: Response, records_wire: Sequence[Any]) -> tuple[bytes, int]:
    """Encode ``bare`` (its ``value`` nil) carrying the longest prefix of
    ``records_wire`` that fits, as ``encode(replace(bare, value=fit_records(...)))``
    would, but packing the message and each record once.

    ``value`` is the message's last item, so the datagram is ``bare``'s bytes
    without their final nil, then the records' msgpack array.

    Args:
        bare: a response whose ``value`` is None (validated when built).
        records_wire: record wire lists in order of preference; plain data
            (see ``value`` in the module docstring), e.g. ``PeerRecord.to_wire()``.

    Returns:
        The datagram and how many records it carries.

    Raises:
        DhtUsageError: ``bare`` has a value, or a record is not plain data.
        DhtMessageTooLarge: ``bare`` alone does not fit.
    """
    if bare.value is not None:
        raise DhtUsageError("encode_with_records takes a response without value")
    head = encode(bare)[:-1]  # the nil placeholder goes; the array takes its place
    budget = MAX_DATAGRAM_BYTES - len(head)
    packed: list[bytes] = []
    body = 0
    for record in records_wire:
        try:
            _check_plain(record, 1)
        except _Invalid as exc:
            raise DhtUsageError(f"record is not plain data: {exc}") from None
        one = _pack_wire(record)
        count = len(packed) + 1
        header = 1 if count <= 15 else 3 if count <= 0xFFFF else 5
        if header + body + len(one) > budget:
            break
        body += len(one)
        packed.append(one)
    count = len(packed)
    # fixarray, else array 16 (a datagram holds at most ~700 records)
    header_bytes = bytes([0x90 | count]) if count <= 15 else b"\xdc" + count.to_bytes(2, "big")
    return b"".join([head, header_bytes, *packed]), count


# -- encoding --------------------------------------------------------------------------


def _pack_wire(wire: list[Any]) -> bytes:
    try:
        return _packer.pack(wire)
    except (TypeError, ValueError, OverflowError) as exc:  # e.g. a lone surrogate in a str
        raise DhtUsageError(f"message cannot be encoded: {exc}") from None


def _to_wire(msg: Message) -> list[Any]:
    if type(msg) is Request:
        return [
            _REQUEST,
            VERSION,
            msg.tid,
            int(msg.command),
            msg.target,
            msg.sender_id,
            msg.token,
            msg.value,
        ]
    if type(msg) is Response:
        return [
            _RESPONSE,
            VERSION,
            msg.tid,
            msg.responder_id,
            _pack(*msg.observed),
            msg.token,
            # Checked when the response was built: straight to the cache.
            [_pack_cached(c.host, c.port) for c in msg.closer],
            msg.error,
            msg.value,
        ]
    raise DhtUsageError(f"not a DHT message: {type(msg).__name__}")


# -- decoding --------------------------------------------------------------------------


def _from_wire(obj: Any) -> Message:
    if type(obj) is not list or len(obj) < 2:
        raise _Invalid("message is not an array of at least two items")
    kind, version = obj[0], obj[1]
    if type(version) is not int or version != VERSION:
        raise _Invalid(f"unknown version {version!r}")
    if type(kind) is int and kind == _REQUEST and len(obj) == _REQUEST_LEN:
        _, _, tid, command, target, sender_id, token, value = obj
        if type(command) is not int or command not in _TARGET_BYTES:
            raise _Invalid(f"unknown command {command!r}")
        return Request(tid, _COMMANDS[command], target, sender_id, token, value)
    if type(kind) is int and kind == _RESPONSE and len(obj) == _RESPONSE_LEN:
        _, _, tid, responder_id, observed, token, closer, error, value = obj
        if type(closer) is not list or len(closer) > MAX_CLOSER:
            raise _Invalid(f"closer must be an array of at most {MAX_CLOSER} addresses")
        response = object.__new__(Response)
        for name, field_value in zip(
            _RESPONSE_FIELDS,
            (tid, responder_id, _unpack(observed).address, token,
             tuple([_unpack(raw) for raw in closer]), error, value),
            strict=True,
        ):
            object.__setattr__(response, name, field_value)
        # The closer contacts were just unpacked (and so checked): the rest of
        # the fields get the checks of Response.__post_init__.
        _check_response(response, closer_checked=True)
        return response
    raise _Invalid(f"unknown message type {kind!r} or wrong length {len(obj)}")


# -- field checks (shared by construction and decoding) ---------------------------------


def _check_request(msg: Request) -> None:
    _check_tid(msg.tid)
    command = msg.command
    if type(command) is not Command:
        if type(command) is not int or command not in _TARGET_BYTES:
            raise _Invalid(f"unknown command {command!r}")
        command = Command(command)
        object.__setattr__(msg, "command", command)
    size = _TARGET_BYTES[command]
    if size is None:
        if msg.target is not None:
            raise _Invalid(f"{command.name} takes no target")
    else:
        _check_bytes(msg.target, size, "target")
    if msg.sender_id is not None:
        _check_bytes(msg.sender_id, ID_BYTES, "sender_id")
    if msg.token is not None:
        _check_bytes(msg.token, TOKEN_BYTES, "token")
    if command in _NEEDS_VALUE:
        if not isinstance(msg.value, list | tuple):
            raise _Invalid(f"{command.name} needs an array value")
        _check_plain(msg.value, 0)
    elif msg.value is not None:
        raise _Invalid(f"{command.name} takes no value")


_RESPONSE_FIELDS = ("tid", "responder_id", "observed", "token", "closer", "error", "value")


def _check_response(msg: Response, *, closer_checked: bool = False) -> None:
    _check_tid(msg.tid)
    if msg.responder_id is not None:
        _check_bytes(msg.responder_id, ID_BYTES, "responder_id")
    observed = msg.observed
    if type(observed) is not tuple:
        if not isinstance(observed, list) or len(observed) != 2:
            raise _Invalid("observed must be a (host, port) pair")
        observed = tuple(observed)
        object.__setattr__(msg, "observed", observed)
    if len(observed) != 2:
        raise _Invalid("observed must be a (host, port) pair")
    _pack(*observed)
    _check_bytes(msg.token, TOKEN_BYTES, "token")
    closer = msg.closer
    if type(closer) is not tuple:
        if not isinstance(closer, list):
            raise _Invalid("closer must be a sequence of contacts")
        closer = tuple(closer)
        object.__setattr__(msg, "closer", closer)
    if len(closer) > MAX_CLOSER:
        raise _Invalid(f"{len(closer)} closer contacts > {MAX_CLOSER}")
    if not closer_checked:
        for contact in closer:
            if not isinstance(contact, Contact):
                raise _Invalid(f"closer holds {type(contact).__name__}, not Contact")
            host, port = contact.host, contact.port
            if type(host) is not str or type(port) is not int:
                raise _Invalid("an address is a (str host, int port) pair")
            _pack_cached(host, port)  # _pack inlined: every reply checks k contacts
    if msg.error is not None and (
        type(msg.error) is not str or not _ERROR_CODE.fullmatch(msg.error)
    ):
        raise _Invalid("error must be a code like INVALID_TOKEN")
    if msg.value is not None:
        if not isinstance(msg.value, list | tuple):
            raise _Invalid("response value must be an array or nil")
        _check_plain(msg.value, 0)


def _check_tid(tid: Any) -> None:
    if type(tid) is not int or not 0 <= tid <= MAX_TID:
        raise _Invalid("tid must be an unsigned 32-bit int")


def _check_bytes(value: Any, size: int, field: str) -> None:
    if type(value) is not bytes or len(value) != size:
        raise _Invalid(f"{field} must be {size} bytes")


def _check_plain(value: Any, depth: int) -> None:
    """Refuse what would not come back unchanged from msgpack (or at all)."""
    if depth > _MAX_VALUE_DEPTH:
        raise _Invalid(f"value nested deeper than {_MAX_VALUE_DEPTH}")
    t = type(value)
    if value is None or t is bool or t is float or t is str or t is bytes:
        return
    if t is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise _Invalid("int in value out of msgpack's 64-bit range")
        return
    if t is list or t is tuple:
        for item in value:
            _check_plain(item, depth + 1)
        return
    if t is dict:
        for key, item in value.items():
            if type(key) is not str and type(key) is not bytes:
                raise _Invalid("map keys in value must be str or bytes")
            _check_plain(item, depth + 1)
        return
    raise _Invalid(f"value holds a {t.__name__}")


# -- addresses ---------------------------------------------------------------------------


def _pack(host: Any, port: Any) -> bytes:
    if type(host) is not str or type(port) is not int:
        raise _Invalid("an address is a (str host, int port) pair")
    return _pack_cached(host, port)


@functools.lru_cache(maxsize=_ADDRESS_CACHE_SIZE)
def _pack_cached(host: str, port: int) -> bytes:
    try:
        canonical = canonical_address(host, port)
    except KeyFormatError as exc:
        raise _Invalid(str(exc)) from None
    if canonical != (host, port):
        raise _Invalid(f"address {host!r} is not canonical (use Contact.at)")
    ip = ipaddress.ip_address(host)
    _check_usable(ip, port)
    return ip.packed + port.to_bytes(2, "big")


def _unpack(raw: Any) -> Contact:
    if type(raw) is not bytes:
        raise _Invalid("an address must be bin 6 or bin 18")
    return _unpack_cached(raw)


@functools.lru_cache(maxsize=_ADDRESS_CACHE_SIZE)
def _unpack_cached(raw: bytes) -> Contact:
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    if len(raw) == 6:
        ip = ipaddress.IPv4Address(raw[:4])
    elif len(raw) == 18:
        ip = ipaddress.IPv6Address(raw[:16])
        if ip.ipv4_mapped is not None:
            raise _Invalid("IPv4-mapped IPv6 address must be sent as IPv4")
    else:
        raise _Invalid(f"an address must be 6 or 18 bytes, got {len(raw)}")
    port = int.from_bytes(raw[-2:], "big")
    _check_usable(ip, port)
    host = str(ip)
    return Contact(node_id_for(host, port), host, port)


def _check_usable(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> None:
    # No node can be reached at these, so an address naming one is junk or an attack.
    if port == 0:
        raise _Invalid("port 0")
    if ip.is_unspecified or ip.is_multicast or ip == _BROADCAST:
        raise _Invalid(f"{ip} is not a unicast address")
