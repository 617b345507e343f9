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
* :class:`EndOfStream` — the peer half-closed; nothing may follow it;
* :class:`Migrate` — the peer's frames continue on another path of this session
  (named by its 16-byte id); nothing may follow it on this path, and the
  driver reads on from the new one (the cipher states carry on unchanged);
* :class:`Ack` — the peer has received this many of our frames (sent only
  while a standby path is kept, so we may forget what it has).

After the active path died, the driver calls :meth:`Transport.expect_resume`
and reads the standby path: the peer's first frame there is RESUME (not
encrypted: the nonces of the frames lost with the dead path are unknown here),
naming the index of the frame that follows it; frames we already have are
skipped unread, and decryption carries on at our next nonce.

A frame that fails to authenticate, a length over the Noise limit, a frame too
short to hold a tag, an unknown type, or anything after END raises
:class:`~p2p.errors.RemoteProtocolError`; the transport is then dead (the
cipher states are out of step and nothing later can be trusted).

Speed: both directions work in place. A write is encrypted straight into one
output buffer (``encrypt_into``), and every complete DATA frame buffered by a
read is decrypted into one plaintext buffer (``decrypt_into``), so a 256 KiB
read costs one allocation and one event, not one per frame. The cipher is
ChaCha20-Poly1305 keyed with the two keys of Noise's ``Split()``, with the
nonce layout of Noise's ``CipherState`` (32 zero bits, 64-bit little-endian
counter).

Bytes-in/bytes-out: :meth:`Transport.receive_data` then :meth:`next_event`
until :data:`NEED_DATA`; :meth:`send_data` / :meth:`send_keepalive` /
:meth:`send_end` return bytes for the driver to write.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from ..errors import LocalProtocolError, RemoteProtocolError
from ._wire import HEADER_BYTES, MAX_NOISE_MESSAGE_BYTES, TAG_BYTES, FrameType, pack_header

__all__ = [
    "MAX_PLAINTEXT_BYTES",
    "NEED_DATA",
    "PATH_ID_BYTES",
    "Ack",
    "Data",
    "EndOfStream",
    "KeepAlive",
    "Migrate",
    "Transport",
]

MAX_PLAINTEXT_BYTES: Final = MAX_NOISE_MESSAGE_BYTES - TAG_BYTES
#: A path of a session is named by this many bytes (the MIGRATE frame's body).
PATH_ID_BYTES: Final = 16
#: Noise spec §11.4: a nonce of 2**64-1 is reserved; stop before it.
MAX_NONCE: Final = 2**64 - 1

_AD = {t: bytes([t]) for t in FrameType}
_AD_DATA: Final = _AD[FrameType.DATA]
_DATA_TYPE: Final = int(FrameType.DATA)
_pack_nonce = struct.Struct("<4xQ").pack
_pack_header = struct.Struct("<I").pack_into
# Compact the receive buffer once this many consumed bytes sit in front of it.
_COMPACT_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Data:
    data: bytes | bytearray


@dataclass(frozen=True, slots=True)
class KeepAlive:
    pass


@dataclass(frozen=True, slots=True)
class EndOfStream:
    pass


@dataclass(frozen=True, slots=True)
class Migrate:
    path_id: bytes


@dataclass(frozen=True, slots=True)
class Ack:
    count: int


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by :meth:`Transport.next_event` when a whole frame is not buffered yet.
NEED_DATA: Final = _NeedData()
_KEEPALIVE: Final = KeepAlive()
_END: Final = EndOfStream()


class Transport:
    """Encrypts outgoing and decrypts incoming frames of one secret stream.

    Args:
        send_key: the 32-byte key of our sending direction (from Noise Split()).
        receive_key: the key of the peer's sending direction.
    """

    def __init__(self, send_key: bytes, receive_key: bytes, *,
                 initiator: bool | None = None) -> None:
        #: A secret only the two ends of this session know, for proving a new
        #: path belongs to it (p2p.punch). Derived one-way from both
        #: directions' keys, ordered by role so both ends agree; None when the
        #: role is not given. (The Noise handshake hash would not do: it hashes
        #: the transcript, which anyone on the path saw.)
        self.path_secret: bytes | None = None
        self._initiator = initiator
        #: After expect_resume(): the next frame must be the peer's RESUME.
        self._expect_resume = False
        #: Frames the peer resent that we already have: skipped unread.
        self._skip = 0
        if initiator is not None:
            first, second = (send_key, receive_key) if initiator else (receive_key, send_key)
            self.path_secret = hashlib.blake2b(first + second, digest_size=32,
                                               person=b"cac-path-secret1").digest()
        self._send_cipher = ChaCha20Poly1305(send_key)
        self._receive_cipher = ChaCha20Poly1305(receive_key)
        self._send_nonce = 0
        self._receive_nonce = 0
        self._buffer = bytearray()
        self._offset = 0
        self._end_sent = False
        self._end_received = False
        self._failed: RemoteProtocolError | None = None
        self.frames_sent = 0
        self.frames_received = 0

    # -- sending -----------------------------------------------------------

    def send_data(self, data: bytes | bytearray | memoryview) -> bytearray:
        """Return the frames that carry ``data`` (empty for empty data).

        Raises:
            LocalProtocolError: after :meth:`send_end`, or when the nonce space
                is exhausted (after 2**64 frames).
        """
        if self._end_sent:
            raise LocalProtocolError("cannot send data after the stream's end was sent")
        size = len(data)
        frames = -(-size // MAX_PLAINTEXT_BYTES)
        self._reserve_nonces(frames)
        out = bytearray(size + frames * (HEADER_BYTES + TAG_BYTES))
        encrypt_into = self._send_cipher.encrypt_into
        nonce = self._send_nonce
        with memoryview(data) as source, memoryview(out) as target:
            position = 0
            for start in range(0, size, MAX_PLAINTEXT_BYTES):
                chunk = source[start : start + MAX_PLAINTEXT_BYTES]
                length = len(chunk) + TAG_BYTES
                _pack_header(out, position, length | (_DATA_TYPE << 24))
                body = position + HEADER_BYTES
                encrypt_into(_pack_nonce(nonce), chunk, _AD_DATA, target[body : body + length])
                nonce += 1
                position = body + length
        self._send_nonce = nonce
        self.frames_sent += frames
        return out

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

    def send_migrate(self, path_id: bytes) -> bytes:
        """Return the MIGRATE frame naming the path our next frames take.

        Raises:
            LocalProtocolError: after :meth:`send_end`, or a path id that is
                not :data:`PATH_ID_BYTES` long.
        """
        if self._end_sent:
            raise LocalProtocolError("cannot move a stream whose end was sent")
        if len(path_id) != PATH_ID_BYTES:
            raise LocalProtocolError(f"a path id is {PATH_ID_BYTES} bytes, not {len(path_id)}")
        return self._control(FrameType.MIGRATE, path_id)

    def send_ack(self, count: int) -> bytes:
        """Return an ACK frame: we have received ``count`` of the peer's frames."""
        if self._end_sent:
            raise LocalProtocolError("cannot acknowledge after the stream's end was sent")
        return self._control(FrameType.ACK, count.to_bytes(8, "little"))

    def resume_frame(self, first_index: int) -> bytes:
        """The RESUME frame that starts a standby path: the frames that follow it are
        ours from ``first_index`` on (resent as they were first sent)."""
        body = first_index.to_bytes(8, "little") + self._resume_mac(first_index, self._initiator)
        return pack_header(len(body), FrameType.RESUME) + body

    def expect_resume(self, buffered: bytes = b"") -> None:
        """The active path died: forget its partial frame; what comes next (after
        ``buffered``, bytes already read from the standby path) starts with the
        peer's RESUME."""
        self._buffer = bytearray(buffered)
        self._offset = 0
        self._expect_resume = True
        self._skip = 0

    def take_buffered(self) -> bytes:
        """Remove and return the bytes buffered after the last whole frame."""
        rest = bytes(self._buffer[self._offset:])
        self._buffer.clear()
        self._offset = 0
        return rest

    def _resume_mac(self, first_index: int, sender_is_initiator: bool | None) -> bytes:
        if self.path_secret is None or sender_is_initiator is None:
            raise LocalProtocolError("a stream without roles cannot resume")
        role = b"I" if sender_is_initiator else b"R"
        return hashlib.blake2b(role + first_index.to_bytes(8, "little"), digest_size=16,
                               key=self.path_secret, person=b"cac-resume-1").digest()

    @property
    def end_sent(self) -> bool:
        return self._end_sent

    def _control(self, frame_type: FrameType, body: bytes = b"") -> bytes:
        self._reserve_nonces(1)
        sealed = self._send_cipher.encrypt(_pack_nonce(self._send_nonce), body, _AD[frame_type])
        self._send_nonce += 1
        self.frames_sent += 1
        return pack_header(len(sealed), frame_type) + sealed

    def _reserve_nonces(self, count: int) -> None:
        if self._send_nonce + count >= MAX_NONCE:  # pragma: no cover - 2**64 frames
            raise LocalProtocolError("nonce space exhausted; open a new stream")

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

    def next_event(self) -> Data | KeepAlive | EndOfStream | Migrate | Ack | _NeedData:
        """Return the next complete event, or :data:`NEED_DATA`.

        Consecutive DATA frames that are all buffered come out as one
        :class:`Data` event. Frames before a bad one are still delivered; the
        bad one raises on the following call.

        Raises:
            RemoteProtocolError: codes ``DECRYPT_FAILED``, ``FRAME_TOO_LARGE``,
                ``FRAME_TOO_SHORT``, ``UNKNOWN_FRAME_TYPE``, ``DATA_AFTER_END``,
                ``BAD_MIGRATE`` (a MIGRATE whose body is not a path id).
                The transport stays failed; every later call raises it again.
        """
        if self._failed is not None:
            raise self._failed
        if (self._expect_resume or self._skip) and not self._resume_and_skip():
            return NEED_DATA
        buffer = self._buffer
        available = len(buffer)
        position = self._offset
        data_frames: list[tuple[int, int]] = []
        plaintext_bytes = 0
        control: tuple[int, int] | None = None
        while available - position >= HEADER_BYTES:
            header = int.from_bytes(buffer[position : position + HEADER_BYTES], "little")
            length = header & 0xFFFFFF
            frame_type = header >> 24
            problem = _check_header(length, frame_type)
            if problem is None and self._end_received:
                problem = ("frame received after the peer ended the stream", "DATA_AFTER_END")
            if problem is not None:
                if data_frames:
                    break  # deliver what came before it first
                self._fail(*problem)
            end = position + HEADER_BYTES + length
            if available < end:
                break
            if frame_type != _DATA_TYPE:
                if not data_frames:
                    control = (position, frame_type)
                break
            data_frames.append((position + HEADER_BYTES, length))
            plaintext_bytes += length - TAG_BYTES
            position = end
        if data_frames:
            return self._decrypt_data(data_frames, plaintext_bytes)
        if control is not None:
            return self._decrypt_control(*control)
        return NEED_DATA

    def _resume_and_skip(self) -> bool:
        """Read the peer's RESUME, then pass over frames we already have. False
        while more bytes are needed."""
        buffer = self._buffer
        if self._expect_resume:
            if len(buffer) - self._offset < HEADER_BYTES + _RESUME_BODY:
                return False
            header = int.from_bytes(buffer[self._offset : self._offset + HEADER_BYTES], "little")
            if header >> 24 != FrameType.RESUME or header & 0xFFFFFF != _RESUME_BODY:
                self._fail("the standby path did not start with RESUME", "BAD_RESUME")
            body = bytes(buffer[self._offset + HEADER_BYTES :
                                self._offset + HEADER_BYTES + _RESUME_BODY])
            first = int.from_bytes(body[:8], "little")
            peer = None if self._initiator is None else not self._initiator
            if not hmac.compare_digest(body[8:], self._resume_mac(first, peer)):
                self._fail("RESUME failed authentication", "BAD_RESUME")
            if first > self._receive_nonce:
                self._fail(f"the peer resumes at frame {first}; frames from "
                           f"{self._receive_nonce} on were lost", "RESUME_GAP")
            self._offset += HEADER_BYTES + _RESUME_BODY
            self._expect_resume = False
            self._skip = self._receive_nonce - first
        while self._skip:
            if len(buffer) - self._offset < HEADER_BYTES:
                return False
            length = int.from_bytes(buffer[self._offset : self._offset + 3], "little")
            if length > MAX_NOISE_MESSAGE_BYTES:
                self._fail(f"frame of {length} bytes exceeds the Noise limit", "FRAME_TOO_LARGE")
            if len(buffer) - self._offset < HEADER_BYTES + length:
                return False
            self._offset += HEADER_BYTES + length
            self._skip -= 1
        self._after_consume()
        return True

    def _decrypt_data(self, frames: list[tuple[int, int]], plaintext_bytes: int) -> Data:
        out = bytearray(plaintext_bytes)
        decrypt_into = self._receive_cipher.decrypt_into
        nonce = self._receive_nonce
        written = 0
        failed = False
        with memoryview(self._buffer) as source, memoryview(out) as target:
            for start, length in frames:
                size = length - TAG_BYTES
                try:
                    decrypt_into(
                        _pack_nonce(nonce),
                        source[start : start + length],
                        _AD_DATA,
                        target[written : written + size],
                    )
                except InvalidTag:
                    failed = True
                    break
                nonce += 1
                written += size
                self._offset = start + length
        self.frames_received += nonce - self._receive_nonce
        self._receive_nonce = nonce
        self._after_consume()
        if failed:
            if written == 0:
                self._fail(*_DECRYPT_FAILED)
            self._failed = RemoteProtocolError(_DECRYPT_FAILED[0], code=_DECRYPT_FAILED[1])
            del out[written:]
        return Data(out)

    def _decrypt_control(self, position: int, frame_type: int
                         ) -> KeepAlive | EndOfStream | Migrate | Ack:
        length = int.from_bytes(self._buffer[position : position + 3], "little")
        start = position + HEADER_BYTES
        try:
            plaintext = self._receive_cipher.decrypt(
                _pack_nonce(self._receive_nonce),
                bytes(self._buffer[start : start + length]),
                _AD[frame_type],
            )
        except InvalidTag:
            self._fail(*_DECRYPT_FAILED)
        self._receive_nonce += 1
        self.frames_received += 1
        self._offset = start + length
        self._after_consume()
        if frame_type == FrameType.ACK:
            if len(plaintext) != 8:
                self._fail("ACK carries no 8-byte count", "BAD_ACK")
            return Ack(int.from_bytes(plaintext, "little"))
        if frame_type == FrameType.MIGRATE:
            if len(plaintext) != PATH_ID_BYTES:
                self._fail(f"MIGRATE names a path of {len(plaintext)} bytes, not "
                           f"{PATH_ID_BYTES}", "BAD_MIGRATE")
            return Migrate(plaintext)
        if plaintext:
            self._fail("control frame carries a payload", "UNKNOWN_FRAME_TYPE")
        if frame_type == FrameType.KEEPALIVE:
            return _KEEPALIVE
        self._end_received = True
        return _END

    def _after_consume(self) -> None:
        if self._offset == len(self._buffer):
            self._buffer.clear()
            self._offset = 0

    def _fail(self, message: str, code: str) -> None:
        self._failed = RemoteProtocolError(message, code=code)
        raise self._failed


_DECRYPT_FAILED: Final = (
    "frame failed authentication (altered, replayed or out of order)",
    "DECRYPT_FAILED",
)
_KNOWN_TYPES: Final = frozenset({FrameType.DATA, FrameType.KEEPALIVE, FrameType.END,
                                 FrameType.MIGRATE, FrameType.ACK})
#: RESUME's body: the first index (u64) and a 16-byte MAC.
_RESUME_BODY: Final = 24


def _check_header(length: int, frame_type: int) -> tuple[str, str] | None:
    if length > MAX_NOISE_MESSAGE_BYTES:
        return (f"frame of {length} bytes exceeds the Noise limit", "FRAME_TOO_LARGE")
    if frame_type not in _KNOWN_TYPES:
        return (f"unknown frame type {frame_type}", "UNKNOWN_FRAME_TYPE")
    if length < TAG_BYTES:
        return (f"frame of {length} bytes cannot hold a {TAG_BYTES}-byte tag", "FRAME_TOO_SHORT")
    return None
