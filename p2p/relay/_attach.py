"""The attach handshake: a raw TCP connection joins one side of a pairing.

After ``pair`` (see ``_messages.py``) both sides open a plain TCP connection
to the relay's port (the same port as the control connections) and send one
attach request::

    0                         8        9                                   41
    +-------------------------+--------+-----------------------------------+
    | magic "BRELAY/1" (8)    | role u8| token (32)                        |
    +-------------------------+--------+-----------------------------------+
    role: 1 = initiator (the dialer), 2 = responder (the reserved peer)

The relay answers with one status byte once both sides are attached
(``PAIRED`` = 0), or at once / at the pairing timeout with a refusal (below).
After ``PAIRED`` the relay forwards bytes blindly in both directions; the two
peers then run their own Noise handshake through it. A client sends nothing
after the request until it has read the status byte.

Why the magic cannot be mistaken for a secret stream: every secret-stream
frame starts with a 24-bit little-endian length and a type byte (see
``p2p/noise/_wire.py``), and the first frame a dialer sends is a HANDSHAKE
frame (type 0x00) of at most 1,024 bytes (``MAX_HANDSHAKE_FRAME_BYTES`` in
``_handshake.py``), so its third byte is always 0 and its fourth is 0. The
magic's first four bytes read as length ``0x455242`` (4.5 MB, above even the
Noise limit of 65,535) and type ``0x4C`` (no frame type). In practice the two
part at the first byte: message 1 is 32 bytes, so a dialer's first byte is
0x20, never ``B`` (0x42). The listener reads until the bytes either match the
whole magic or stop matching it (:func:`classify`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from ..keys import KEY_BYTES
from ._errors import RefusalCode, RelayProtocolError

__all__ = [
    "ATTACH_MAGIC",
    "ATTACH_REQUEST_BYTES",
    "AttachRequest",
    "AttachStatus",
    "FirstBytes",
    "Role",
    "classify",
    "decode_attach_request",
    "encode_attach_request",
    "status_for",
]

ATTACH_MAGIC = b"BRELAY/1"
TOKEN_BYTES = KEY_BYTES
ATTACH_REQUEST_BYTES = len(ATTACH_MAGIC) + 1 + TOKEN_BYTES


class Role(IntEnum):
    """Which side of a pairing an attach joins."""

    #: The dialer: it called ``pair`` and runs the Noise handshake as initiator.
    INITIATOR = 1
    #: The reserved peer: it got the token on its reservation stream.
    RESPONDER = 2


class AttachStatus(IntEnum):
    """The relay's one-byte answer to an attach request."""

    #: Both sides are attached; from the next byte on, the relay forwards.
    PAIRED = 0
    #: The token is unknown, expired or already used.
    UNKNOWN_TOKEN = 1
    #: The token was issued for the other role.
    WRONG_ROLE = 2
    #: This role of this pairing is attached already.
    ALREADY_ATTACHED = 3
    #: The other side did not attach within the pairing timeout.
    PAIR_TIMEOUT = 4
    #: The role byte is not 1 or 2.
    BAD_ATTACH = 5


def status_for(code: RefusalCode) -> AttachStatus:
    """The status byte that carries ``code`` (attach refusals only)."""
    return AttachStatus[code.value]


@dataclass(frozen=True, slots=True)
class AttachRequest:
    role: Role
    token: bytes


def encode_attach_request(role: Role, token: bytes) -> bytes:
    """The 41 bytes a client sends first on an attach connection."""
    if len(token) != TOKEN_BYTES:
        raise ValueError(f"token must be {TOKEN_BYTES} bytes, got {len(token)}")
    return ATTACH_MAGIC + bytes([Role(role)]) + token


def decode_attach_request(data: bytes) -> AttachRequest:
    """Parse exactly :data:`ATTACH_REQUEST_BYTES` bytes.

    Raises:
        RelayProtocolError: ``BAD_ATTACH`` for a wrong length, magic or role.
    """
    if len(data) != ATTACH_REQUEST_BYTES or not data.startswith(ATTACH_MAGIC):
        raise RelayProtocolError("not an attach request", code=RefusalCode.BAD_ATTACH)
    role_byte = data[len(ATTACH_MAGIC)]
    try:
        role = Role(role_byte)
    except ValueError:
        raise RelayProtocolError(
            f"unknown attach role {role_byte}", code=RefusalCode.BAD_ATTACH
        ) from None
    return AttachRequest(role, bytes(data[len(ATTACH_MAGIC) + 1 :]))


class FirstBytes(Enum):
    """What the first bytes of an accepted connection say it is."""

    #: Too few bytes to tell: read more.
    UNDECIDED = "undecided"
    #: Starts with the attach magic.
    ATTACH = "attach"
    #: Anything else: a secret stream (control connection).
    CONTROL = "control"


def classify(prefix: bytes) -> FirstBytes:
    """Tell an attach from a secret stream by the bytes read so far."""
    if prefix.startswith(ATTACH_MAGIC):
        return FirstBytes.ATTACH
    if ATTACH_MAGIC.startswith(prefix):
        return FirstBytes.UNDECIDED
    return FirstBytes.CONTROL
