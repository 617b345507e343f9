"""Sans-IO transport of the secret stream: framing and the Noise cipher states.

Theory of operation
-------------------
After the handshake each direction has its own Noise ``CipherState`` (Noise
spec §5.1): ChaChaPoly with a 64-bit counter nonce that both ends advance in
step, so frames can be neither reordered, replayed nor dropped without the
next decryption failing.

Frames use the layout of :mod:`._wire`. Application bytes are cut into pieces
of at most :data:`MAX_PLAINTEXT_BYTES` so each ciphertext fits one Noise
message; the frame type is the AEAD associated data, so an attacker cannot turn
a DATA frame into an END frame. Events, the same on both sides:

* :class:`Data` — application bytes, in order;
* :class:`KeepAlive` — an authenticated empty frame that only proves liveness;
* :class:`EndOfStream` — the peer half-closed; nothing may follow it.

A frame that fails to authenticate, a length over the Noise limit, a frame too
short to hold a tag, an unknown type, or anything after END raises
:class:`~p2p.errors.RemoteProtocolError`; the transport is then dead (the
cipher states are out of step and nothing later can be trusted).

Bytes-in/bytes-out: :meth:`Transport.receive_data` then :meth:`next_event`
until :data:`NEED_DATA`; :meth:`send_data` / :meth:`send_keepalive` /
:meth:`send_end` return bytes for the driver to write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from noise.exceptions import NoiseMaxNonceError
from noise.state import CipherState

from ..errors import LocalProtocolError, RemoteProtocolError
from ._wire import HEADER_BYTES, MAX_NOISE_MESSAGE_BYTES, TAG_BYTES, FrameType, pack_header

__all__ = [
    "MAX_PLAINTEXT_BYTES",
    "NEED_DATA",
    "Data",
    "EndOfStream",
    "KeepAlive",
    "Transport",
]

MAX_PLAINTEXT_BYTES: Final = MAX_NOISE_MESSAGE_BYTES - TAG_BYTES

_AD = {t: bytes([t]) for t in FrameType}
_DATA_HEADER_FULL: Final = pack_header(MAX_NOISE_MESSAGE_BYTES, FrameType.DATA)
# Compact the receive buffer once this many consumed bytes sit in front of it.
_COMPACT_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Data:
    data: bytes


@dataclass(frozen=True, slots=True)
class KeepAlive:
    pass


@dataclass(frozen=True, slots=True)
class EndOfStream:
    pass


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by :meth:`Transport.next_event` when a whole frame is not buffered yet.
NEED_DATA: Final = _NeedData()
_KEEPALIVE: Final = KeepAlive()
_END: Final = EndOfStream()


class Transport:
    """Encrypts outgoing and decrypts incoming frames of one secret stream."""

    def __init__(self, send_cipher: CipherState, receive_cipher: CipherState) -> None:
        self._send_cipher = send_cipher
        self._receive_cipher = receive_cipher
        self._buffer = bytearray()
        self._offset = 0
        self._end_sent = False
        self._end_received = False
        self._failed: RemoteProtocolError | None = None
        self.frames_sent = 0
        self.frames_received = 0

    # -- sending -----------------------------------------------------------

    def send_data(self, data: bytes | bytearray | memoryview) -> bytes:
        """Return the frames that carry ``data`` (b"" for empty data).

        Raises:
            LocalProtocolError: after :meth:`send_end`.
        """
        if self._end_sent:
            raise LocalProtocolError("cannot send data after the stream's end was sent")
        size = len(data)
        if size == 0:
            return b""
        encrypt = self._send_cipher.encrypt_with_ad
        ad = _AD[FrameType.DATA]
        view = memoryview(data)
        if size <= MAX_PLAINTEXT_BYTES:
            ciphertext = self._encrypt(encrypt, ad, view)
            self.frames_sent += 1
            return pack_header(len(ciphertext), FrameType.DATA) + ciphertext
        pieces: list[bytes] = []
        for start in range(0, size, MAX_PLAINTEXT_BYTES):
            chunk = view[start : start + MAX_PLAINTEXT_BYTES]
            ciphertext = self._encrypt(encrypt, ad, chunk)
            if len(ciphertext) == MAX_NOISE_MESSAGE_BYTES:
                pieces.append(_DATA_HEADER_FULL)
            else:
                pieces.append(pack_header(len(ciphertext), FrameType.DATA))
            pieces.append(ciphertext)
        self.frames_sent += len(pieces) // 2
        return b"".join(pieces)

    def send_keepalive(self) -> bytes:
        """Return one KEEPALIVE frame (legal until the end is sent)."""
        if self._end_sent:
            raise LocalProtocolError("cannot send a keep-alive after the stream's end was sent")
        return self._control(FrameType.KEEPALIVE)

    def send_end(self) -> bytes:
        """Return the END frame; afterwards nothing more may be sent."""
        if self._end_sent:
            raise LocalProtocolError("the stream's end was already sent")
        frame = self._control(FrameType.END)
        self._end_sent = True
        return frame

    @property
    def end_sent(self) -> bool:
        return self._end_sent

    def _control(self, frame_type: FrameType) -> bytes:
        ciphertext = self._encrypt(self._send_cipher.encrypt_with_ad, _AD[frame_type], b"")
        self.frames_sent += 1
        return pack_header(len(ciphertext), frame_type) + ciphertext

    @staticmethod
    def _encrypt(encrypt, ad: bytes, plaintext) -> bytes:
        try:
            return encrypt(ad, plaintext)
        except NoiseMaxNonceError as exc:  # pragma: no cover - 2**64 frames
            raise LocalProtocolError("nonce space exhausted; open a new stream") from exc

    # -- receiving ---------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes read from the wire; follow with :meth:`next_event`."""
        if self._offset >= _COMPACT_BYTES:
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame held; non-zero at EOF means truncation."""
        return len(self._buffer) - self._offset

    def next_event(self) -> Data | KeepAlive | EndOfStream | _NeedData:
        """Return the next complete event, or :data:`NEED_DATA`.

        Raises:
            RemoteProtocolError: codes ``DECRYPT_FAILED``, ``FRAME_TOO_LARGE``,
                ``FRAME_TOO_SHORT``, ``UNKNOWN_FRAME_TYPE``, ``DATA_AFTER_END``.
                The transport stays failed; every later call raises it again.
        """
        if self._failed is not None:
            raise self._failed
        buffer = self._buffer
        offset = self._offset
        if len(buffer) - offset < HEADER_BYTES:
            return NEED_DATA
        header = int.from_bytes(buffer[offset : offset + HEADER_BYTES], "little")
        length = header & 0xFFFFFF
        frame_type = header >> 24
        if length > MAX_NOISE_MESSAGE_BYTES:
            self._fail(f"frame of {length} bytes exceeds the Noise limit", "FRAME_TOO_LARGE")
        if frame_type not in _AD or frame_type == FrameType.HANDSHAKE:
            self._fail(f"unknown frame type {frame_type}", "UNKNOWN_FRAME_TYPE")
        if length < TAG_BYTES:
            self._fail(f"frame of {length} bytes cannot hold a {TAG_BYTES}-byte tag",
                       "FRAME_TOO_SHORT")
        end = offset + HEADER_BYTES + length
        if len(buffer) < end:
            return NEED_DATA
        if self._end_received:
            self._fail("frame received after the peer ended the stream", "DATA_AFTER_END")
        with memoryview(buffer) as view:
            ciphertext = view[offset + HEADER_BYTES : end]
            try:
                plaintext = self._receive_cipher.decrypt_with_ad(_AD[frame_type], ciphertext)
            except InvalidTag:
                plaintext = None
            finally:
                ciphertext.release()
        if plaintext is None:
            self._fail("frame failed authentication (altered, replayed or out of order)",
                       "DECRYPT_FAILED")
        self._offset = end
        if end == len(buffer):
            buffer.clear()
            self._offset = 0
        self.frames_received += 1
        if frame_type == FrameType.DATA:
            return Data(plaintext)
        if plaintext:
            self._fail("control frame carries a payload", "UNKNOWN_FRAME_TYPE")
        if frame_type == FrameType.KEEPALIVE:
            return _KEEPALIVE
        self._end_received = True
        return _END

    def _fail(self, message: str, code: str) -> None:
        self._failed = RemoteProtocolError(message, code=code)
        raise self._failed
