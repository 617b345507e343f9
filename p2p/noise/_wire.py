"""Framing shared by the handshake and the transport of the secret stream.

Every message on the wire, handshake or transport, is one frame::

    0               3        4
    +---------------+--------+----------------------------------+
    | length u24 LE | type   | body: `length` bytes             |
    +---------------+--------+----------------------------------+

``length`` counts the body only. A Noise message is at most 65,535 bytes
(Noise spec §3), so a larger length is a protocol error (``FRAME_TOO_LARGE``);
the 24-bit field exists so that such a length is *detected*, not silently
wrapped. For transport frames the type byte is the AEAD's associated data, so it
is authenticated although it travels in the clear.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "HEADER_BYTES",
    "MAX_NOISE_MESSAGE_BYTES",
    "TAG_BYTES",
    "FrameType",
    "pack_header",
]

HEADER_BYTES = 4
#: Noise spec §3: "all Noise messages must be less than or equal to 65535 bytes".
MAX_NOISE_MESSAGE_BYTES = 65535
#: ChaChaPoly authentication tag.
TAG_BYTES = 16


class FrameType(IntEnum):
    #: A Noise handshake message (XX: three of them).
    HANDSHAKE = 0x00
    #: Application bytes.
    DATA = 0x01
    #: An empty message sent when the link has been quiet; swallowed on receipt.
    KEEPALIVE = 0x02
    #: The sender will send no more data (half-close); the receiver sees EOF.
    END = 0x03
    #: The sender moved its frames to another path of the same session: this is
    #: its last frame on this one (body: the new path's 16-byte id, encrypted).
    MIGRATE = 0x04
    #: How many frames the sender has received from us (u64 LE, encrypted), so we
    #: may forget them: sent only while a standby path is kept (see README).
    ACK = 0x05
    #: Not encrypted: the first frame on a standby path after the active one died:
    #: index (u64 LE) of the frame that follows it, and a MAC under the path secret.
    RESUME = 0x06


def pack_header(length: int, frame_type: int) -> bytes:
    return (length | (frame_type << 24)).to_bytes(4, "little")
