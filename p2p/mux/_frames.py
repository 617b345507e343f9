"""Frame codec of the channel multiplexer (sans-IO, no state beyond a read buffer).

Every frame on the byte stream has the same small header::

     0                   1                   2
    +-------------------+---------+-------------------+--------------------+
    | length (varint)   | type u8 | channel (varint)  | body ...           |
    +-------------------+---------+-------------------+--------------------+
                        |<------------------ length bytes ---------------->|

``varint`` is unsigned LEB128 (7 bits per byte, low group first, high bit set on
every byte but the last), at most 9 bytes, minimal encoding not required.
``length`` counts the type byte, the channel varint and the body. A one-byte RPC
message on channel 5 therefore costs 3 header bytes.

Bodies by type (``channel`` is explained per type):

``DATA`` (0)   channel = receiver's channel number::

    +-----------------------------+
    | message bytes (rest)        |
    +-----------------------------+

``OPEN`` (1)   channel = *sender's* channel number::

    +-----------------+---------------------+-----------+---------------------+
    | window (varint) | name_len (varint)   | name utf8 | id bytes (rest)     |
    +-----------------+---------------------+-----------+---------------------+

``ACCEPT`` (2) channel = receiver's (the opener's) channel number::

    +-----------------------------+-----------------+
    | acceptor's channel (varint) | window (varint) |
    +-----------------------------+-----------------+

``REJECT`` (3) channel = receiver's (the opener's) channel number::

    +---------------+
    | reason (u8)   |
    +---------------+

``CREDIT`` (4) channel = receiver's channel number::

    +--------------------------+
    | extra bytes (varint)     |
    +--------------------------+

``END`` (5) and ``CLOSE`` (6): channel = receiver's channel number, empty body.

``MUX_CREDIT`` (7) channel = 0 (the frame is for the whole mux)::

    +--------------------------+
    | extra bytes (varint)     |
    +--------------------------+

Connection-level credit (HTTP/2's WINDOW_UPDATE on stream 0, QUIC's
MAX_DATA): each side's first frame grants its whole receive budget, later ones
return what its application consumed. A message costs ``len +
MESSAGE_OVERHEAD_BYTES`` of it, as of its channel's credit.

The decoder never raises anything but :class:`MuxProtocolError`; a frame whose
declared length exceeds ``max_frame_bytes`` is refused as soon as its length is
read, before it is buffered.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from p2p.mux._errors import MuxProtocolError

__all__ = [
    "MAX_CHANNEL_ID_BYTES",
    "MAX_PROTOCOL_NAME_BYTES",
    "MAX_VARINT_BYTES",
    "MESSAGE_OVERHEAD_BYTES",
    "Accept",
    "Close",
    "Credit",
    "Data",
    "End",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "MuxCredit",
    "Open",
    "Reject",
    "RejectReason",
    "data_header",
    "encode_frame",
    "encode_varint",
]

#: A varint longer than this is malformed (9 bytes carry 63 bits).
MAX_VARINT_BYTES = 9
#: Protocol names are short ASCII-ish identifiers ("rpc", "shell/1").
MAX_PROTOCOL_NAME_BYTES = 255
#: Channel ids are keys or small tags; 255 bytes leaves room for two 32-byte keys.
MAX_CHANNEL_ID_BYTES = 255
#: What one buffered message costs the receiver beyond its payload (a ``bytes``
#: object is 33 bytes plus its data, and its inbox slot 8 more). A message costs
#: ``len + MESSAGE_OVERHEAD_BYTES`` of channel and of mux credit, so windows and
#: the receive budget bound memory even when a peer sends empty messages.
MESSAGE_OVERHEAD_BYTES = 64


class FrameType(IntEnum):
    """The type byte of a frame."""

    DATA = 0
    OPEN = 1
    ACCEPT = 2
    REJECT = 3
    CREDIT = 4
    END = 5
    CLOSE = 6
    MUX_CREDIT = 7


class RejectReason(IntEnum):
    """Why an open was refused (the REJECT frame's reason byte)."""

    UNKNOWN_PROTOCOL = 1
    TOO_MANY_CHANNELS = 2
    BACKLOG_FULL = 3
    DUPLICATE_CHANNEL = 4


@dataclass(slots=True)
class Data:
    """One whole channel message."""

    channel: int
    payload: bytes


@dataclass(slots=True)
class Open:
    """The sender opened ``channel`` for (protocol, id) and grants ``window`` bytes."""

    channel: int
    protocol: str
    id: bytes
    window: int


@dataclass(slots=True)
class Accept:
    """Answer to an OPEN: ``channel`` (the opener's) is paired with ``remote_channel``."""

    channel: int
    remote_channel: int
    window: int


@dataclass(slots=True)
class Reject:
    """Answer to an OPEN: the open of ``channel`` (the opener's) is refused."""

    channel: int
    reason: int


@dataclass(slots=True)
class Credit:
    """The receiver may now be sent ``amount`` more message bytes on ``channel``."""

    channel: int
    amount: int


@dataclass(slots=True)
class End:
    """The sender will send no more messages on ``channel`` (half-close)."""

    channel: int


@dataclass(slots=True)
class Close:
    """The sender closed ``channel``: it sends nothing more and discards what arrives."""

    channel: int


@dataclass(slots=True)
class MuxCredit:
    """The receiver may now be sent ``amount`` more bytes over the whole mux."""

    amount: int


Frame = Data | Open | Accept | Reject | Credit | End | Close | MuxCredit


# ---------------------------------------------------------------------------
# Encoding

# Single-byte varints are by far the most common; precompute them.
_SMALL = [bytes((i,)) for i in range(128)]


def encode_varint(value: int) -> bytes:
    """Encode an unsigned int as LEB128.

    Args:
        value: 0 <= value < 2**63.

    Returns:
        The encoded bytes.

    Raises:
        ValueError: if ``value`` is out of range.
    """
    if 0 <= value < 128:
        return _SMALL[value]
    if value < 0 or value >= 1 << 63:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def data_header(channel: int, payload_len: int) -> bytes:
    """Return the header of a DATA frame; the payload follows it unchanged.

    Kept apart from :func:`encode_frame` so that a large payload is copied only
    once, when the writer joins its batch.
    """
    if channel < 128:
        n = payload_len + 2
        if n < 128:
            return bytes((n, 0, channel))
        return encode_varint(n) + bytes((0, channel))
    ch = encode_varint(channel)
    return encode_varint(payload_len + 1 + len(ch)) + b"\x00" + ch


def encode_frame(frame: Frame) -> bytes:
    """Encode one frame, header included.

    Raises:
        ValueError: if a field is out of range (a local bug, never peer input).
    """
    if isinstance(frame, Data):
        return data_header(frame.channel, len(frame.payload)) + frame.payload
    if isinstance(frame, Open):
        name = frame.protocol.encode("utf-8")
        if len(name) > MAX_PROTOCOL_NAME_BYTES or len(frame.id) > MAX_CHANNEL_ID_BYTES:
            raise ValueError("protocol name or channel id too long")
        body = encode_varint(frame.window) + encode_varint(len(name)) + name + bytes(frame.id)
        ftype = FrameType.OPEN
    elif isinstance(frame, Accept):
        body = encode_varint(frame.remote_channel) + encode_varint(frame.window)
        ftype = FrameType.ACCEPT
    elif isinstance(frame, Reject):
        body = bytes((frame.reason,))
        ftype = FrameType.REJECT
    elif isinstance(frame, Credit):
        body = encode_varint(frame.amount)
        ftype = FrameType.CREDIT
    elif isinstance(frame, End):
        body = b""
        ftype = FrameType.END
    elif isinstance(frame, Close):
        body = b""
        ftype = FrameType.CLOSE
    elif isinstance(frame, MuxCredit):
        inner = bytes((FrameType.MUX_CREDIT, 0)) + encode_varint(frame.amount)
        return encode_varint(len(inner)) + inner
    else:  # pragma: no cover - typing guards this
        raise TypeError(f"not a frame: {frame!r}")
    inner = bytes((ftype,)) + encode_varint(frame.channel) + body
    return encode_varint(len(inner)) + inner


# ---------------------------------------------------------------------------
# Decoding


def _bad(code: str, message: str) -> MuxProtocolError:
    return MuxProtocolError(message, code=code)


def _varint(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Decode a varint at ``buf[pos:end]``; return (value, new pos).

    Returns (-1, pos) if the buffer ends inside the varint.
    """
    if pos < end:
        b = buf[pos]
        if b < 0x80:  # fast path: one byte
            return b, pos + 1
    value = 0
    shift = 0
    i = pos
    while i < end:
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7
        if i - pos >= MAX_VARINT_BYTES:
            raise _bad("BAD_VARINT", "varint longer than 9 bytes")
    if i - pos >= MAX_VARINT_BYTES:
        raise _bad("BAD_VARINT", "varint longer than 9 bytes")
    return -1, pos


def _body_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value, npos = _varint(buf, pos, end)
    if value < 0:
        raise _bad("BAD_FRAME", "frame ends inside a varint")
    return value, npos


class FrameDecoder:
    """Turns stream bytes into frames, keeping any partial frame for the next feed.

    Args:
        max_frame_bytes: largest ``length`` accepted; longer frames are refused
            with code ``FRAME_TOO_LARGE`` before they are buffered.
    """

    __slots__ = ("_buf", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame held since the last feed."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Parse every complete frame in the buffered bytes plus ``data``.

        Returns:
            The frames, in stream order (possibly none).

        Raises:
            MuxProtocolError: the bytes are not valid framing; the decoder must
                not be used again.
        """
        if self._buf:
            self._buf += data
            src: bytes | bytearray = self._buf
        else:
            src = data if isinstance(data, bytes | bytearray) else bytes(data)
        frames: list[Frame] = []
        end = len(src)
        pos = 0
        max_frame = self.max_frame_bytes
        with memoryview(src) as mv:
            while pos < end:
                length, body = _varint(mv, pos, end)
                if length < 0:
                    break
                if length > max_frame:
                    raise _bad("FRAME_TOO_LARGE", f"frame of {length} bytes > {max_frame}")
                if length < 2:
                    raise _bad("BAD_FRAME", f"frame of {length} bytes has no room for a header")
                fend = body + length
                if fend > end:
                    break
                frames.append(_parse(mv, body, fend))
                pos = fend
        if src is self._buf:
            del self._buf[:pos]
        elif pos < end:
            self._buf += src[pos:]
        return frames


def _parse(mv: memoryview, pos: int, end: int) -> Frame:
    ftype = mv[pos]
    channel, pos = _body_varint(mv, pos + 1, end)
    if ftype == 0:
        return Data(channel, bytes(mv[pos:end]))
    if ftype == 1:
        window, pos = _body_varint(mv, pos, end)
        name_len, pos = _body_varint(mv, pos, end)
        if name_len > MAX_PROTOCOL_NAME_BYTES or pos + name_len > end:
            raise _bad("BAD_FRAME", "bad protocol name length in OPEN")
        try:
            name = str(mv[pos : pos + name_len], "utf-8")
        except UnicodeDecodeError as exc:
            raise _bad("BAD_FRAME", "protocol name is not UTF-8") from exc
        pos += name_len
        if end - pos > MAX_CHANNEL_ID_BYTES:
            raise _bad("BAD_FRAME", "channel id too long in OPEN")
        return Open(channel, name, bytes(mv[pos:end]), window)
    if ftype == 2:
        remote, pos = _body_varint(mv, pos, end)
        window, pos = _body_varint(mv, pos, end)
        if pos != end:
            raise _bad("BAD_FRAME", "trailing bytes in ACCEPT")
        return Accept(channel, remote, window)
    if ftype == 3:
        if end - pos != 1:
            raise _bad("BAD_FRAME", "REJECT body must be one byte")
        return Reject(channel, mv[pos])
    if ftype == 4:
        amount, pos = _body_varint(mv, pos, end)
        if pos != end:
            raise _bad("BAD_FRAME", "trailing bytes in CREDIT")
        return Credit(channel, amount)
    if ftype == 5 or ftype == 6:
        if pos != end:
            raise _bad("BAD_FRAME", "END/CLOSE frames have no body")
        return End(channel) if ftype == 5 else Close(channel)
    if ftype == 7:
        if channel != 0:
            raise _bad("BAD_FRAME", "MUX_CREDIT must name channel 0")
        amount, pos = _body_varint(mv, pos, end)
        if pos != end:
            raise _bad("BAD_FRAME", "trailing bytes in MUX_CREDIT")
        return MuxCredit(amount)
    raise _bad("UNKNOWN_FRAME_TYPE", f"unknown frame type {ftype}")
