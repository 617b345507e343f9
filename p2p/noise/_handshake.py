"""Sans-IO Noise XX handshake with Ed25519 identities.

Theory of operation
-------------------
Pattern ``Noise_XX_25519_ChaChaPoly_BLAKE2b`` (Noise spec §7.5)::

    -> e
    <- e, ee, s, es   + responder identity payload
    -> s, se          + initiator identity payload

The Noise static keys are X25519 keys derived from each peer's Ed25519 identity
(see :mod:`p2p.keys`). Each identity payload carries the sender's Ed25519 public
key and a proof::

    0        1                          33                              97
    +--------+--------------------------+-------------------------------+
    | ver u8 | Ed25519 public key (32)  | Ed25519 signature (64)        |
    +--------+--------------------------+-------------------------------+

    signature = Sign(PROOF_CONTEXT || role || h)

where ``role`` is ``b"R"`` or ``b"I"`` and ``h`` is the Noise handshake hash
*before* the message that carries the payload. ``h`` already covers the
prologue and the initiator's fresh ephemeral key, so a proof is bound to this
handshake and cannot be replayed in another. The receiver checks that

1. the Ed25519 key maps to the Noise static key the peer just proved it holds
   (the DH tokens ``es``/``se`` prove possession of the X25519 secret), and
2. the signature verifies,

and, on the initiator, that the key is the one the dialer expected: the
initiator pins the responder's key *before* it reveals its own identity in
message 3, so a dial to the wrong peer fails closed without leaking who dialed.

The prologue names the protocol and its version; peers with different
prologues cannot complete a handshake (message 2 fails to authenticate).

The core takes bytes and returns bytes: :meth:`Handshake.initiate` gives the
initiator's first frame, :meth:`Handshake.receive_data` consumes frames and
returns the frames to send back. Once :attr:`Handshake.complete`,
:meth:`Handshake.transport` hands over the cipher states (and any bytes that
arrived after the last handshake frame) to a :class:`~._transport.Transport`.
"""

from __future__ import annotations

import functools
from enum import Enum

from cryptography.exceptions import InvalidTag
from noise.backends.default.keypairs import KeyPair25519
from noise.connection import NoiseConnection
from noise.exceptions import NoiseHandshakeError, NoiseInvalidMessage, NoiseValueError

from ..errors import HandshakeError, KeyFormatError
from ..keys import (
    KEY_BYTES,
    SIGNATURE_BYTES,
    KeyPair,
    format_key,
    public_key_to_x25519,
    verify_signature,
)
from ._transport import Transport
from ._wire import HEADER_BYTES, MAX_NOISE_MESSAGE_BYTES, FrameType, pack_header

__all__ = ["NOISE_PROTOCOL_NAME", "PROLOGUE", "Handshake", "HandshakePhase"]

NOISE_PROTOCOL_NAME = b"Noise_XX_25519_ChaChaPoly_BLAKE2b"
#: Names this protocol and its version; bumped on any incompatible change.
PROLOGUE = b"cosmicac/secret-stream/1"
PROOF_CONTEXT = b"cosmicac/secret-stream/identity-proof/1"
PAYLOAD_VERSION = 1
PAYLOAD_BYTES = 1 + KEY_BYTES + SIGNATURE_BYTES
#: Handshake messages of XX with our payload are < 200 bytes; anything far
#: larger is not a handshake and is refused before any crypto runs.
MAX_HANDSHAKE_FRAME_BYTES = 1024


class HandshakePhase(Enum):
    #: Initiator: message 1 not produced yet. Responder: waiting for message 1.
    START = "start"
    #: Initiator waits for message 2.
    WAIT_RESPONSE = "wait-response"
    #: Responder waits for message 3.
    WAIT_FINAL = "wait-final"
    #: Keys are agreed; call transport().
    COMPLETE = "complete"
    #: An error was raised; the handshake cannot continue.
    FAILED = "failed"


class Handshake:
    """One side of the XX handshake, as a pure state machine.

    Args:
        keypair: our identity.
        initiator: True for the dialer.
        expected_remote_key: the Ed25519 key the dialer expects; required for
            the initiator unless ``None`` is passed deliberately to accept any.
        prologue: protocol name and version, the same on both sides.
    """

    def __init__(
        self,
        keypair: KeyPair,
        *,
        initiator: bool,
        expected_remote_key: bytes | None = None,
        prologue: bytes = PROLOGUE,
    ) -> None:
        if expected_remote_key is not None and len(expected_remote_key) != KEY_BYTES:
            raise KeyFormatError(
                f"expected remote key must be {KEY_BYTES} bytes, got {len(expected_remote_key)}"
            )
        self.keypair = keypair
        self.initiator = initiator
        self.expected_remote_key = expected_remote_key
        self.phase = HandshakePhase.START
        self.remote_public_key: bytes | None = None
        self.handshake_hash: bytes | None = None
        self._buffer = bytearray()
        self._noise = NoiseConnection.from_name(NOISE_PROTOCOL_NAME)
        self._noise.set_prologue(prologue)
        self._noise.noise_protocol.keypairs["s"] = _static_keypair(keypair)
        if initiator:
            self._noise.set_as_initiator()
        else:
            self._noise.set_as_responder()
        self._noise.start_handshake()

    @property
    def complete(self) -> bool:
        return self.phase is HandshakePhase.COMPLETE

    def initiate(self) -> bytes:
        """Return the initiator's first frame (``-> e``) to send."""
        if not self.initiator or self.phase is not HandshakePhase.START:
            raise HandshakeError("initiate() is only for a fresh initiator", code="MISUSE")
        message = self._noise.write_message(b"")
        self.phase = HandshakePhase.WAIT_RESPONSE
        return _frame(message)

    def receive_data(self, data: bytes) -> bytes:
        """Consume bytes from the peer; return the bytes to send back (maybe b"").

        Raises:
            HandshakeError: the peer's message is malformed, fails to
                authenticate, carries a bad identity proof, or proves a key
                other than the expected one, or anything else in its bytes
                makes a library raise (``BAD_MESSAGE``, the library's error
                chained as ``__cause__``). The handshake is then FAILED. Nothing
                else is raised for any bytes from the peer.
        """
        if self.phase is HandshakePhase.FAILED:
            raise HandshakeError("the handshake already failed", code="MISUSE")
        self._buffer += data
        out = bytearray()
        try:
            while self.phase is not HandshakePhase.COMPLETE:
                message = self._next_frame()
                if message is None:
                    break
                out += self._on_message(message)
        except HandshakeError:
            self.phase = HandshakePhase.FAILED
            raise
        except Exception as exc:
            # The boundary: every byte here came from the peer, so whatever
            # noiseprotocol, cryptography or nacl raise on input we did not
            # foresee (any type: they document none) fails this handshake, never
            # the process. _read and _write map the cases we know with a reason.
            self.phase = HandshakePhase.FAILED
            raise HandshakeError(
                f"handshake message rejected ({type(exc).__name__}: {exc})", code="BAD_MESSAGE"
            ) from exc
        return bytes(out)

    def transport(self) -> Transport:
        """Hand the agreed keys (and bytes already received past the handshake) over.

        Raises:
            HandshakeError: the handshake is not complete.
        """
        if not self.complete:
            raise HandshakeError("the handshake is not complete", code="MISUSE")
        protocol = self._noise.noise_protocol
        transport = Transport(protocol.cipher_state_encrypt.k, protocol.cipher_state_decrypt.k,
                              initiator=self.initiator)
        if self._buffer:
            transport.receive_data(bytes(self._buffer))
            self._buffer.clear()
        return transport

    # -- internals ---------------------------------------------------------

    def _next_frame(self) -> bytes | None:
        if len(self._buffer) < HEADER_BYTES:
            return None
        header = int.from_bytes(self._buffer[:HEADER_BYTES], "little")
        length, frame_type = header & 0xFFFFFF, header >> 24
        if frame_type != FrameType.HANDSHAKE:
            raise HandshakeError(
                f"expected a handshake frame, got frame type {frame_type}", code="BAD_MESSAGE"
            )
        if length > MAX_HANDSHAKE_FRAME_BYTES:
            raise HandshakeError(
                f"handshake frame of {length} bytes exceeds {MAX_HANDSHAKE_FRAME_BYTES}",
                code="BAD_MESSAGE",
            )
        if len(self._buffer) < HEADER_BYTES + length:
            return None
        message = bytes(self._buffer[HEADER_BYTES : HEADER_BYTES + length])
        del self._buffer[: HEADER_BYTES + length]
        return message

    def _handshake_hash_now(self) -> bytes:
        # noiseprotocol keeps h in its symmetric state; the proof signs it.
        return bytes(self._noise.noise_protocol.symmetric_state.h)

    def _on_message(self, message: bytes) -> bytes:
        if self.initiator and self.phase is HandshakePhase.WAIT_RESPONSE:
            h_before = self._handshake_hash_now()
            payload, remote_static = self._read(message)
            self._check_identity(payload, remote_static, h_before, role=b"R")
            h_mine = self._handshake_hash_now()
            reply = self._write(self._identity_payload(h_mine, role=b"I"))
            self._finish()
            return _frame(reply)
        if not self.initiator and self.phase is HandshakePhase.START:
            payload, _ = self._read(message)
            if payload:
                raise HandshakeError("message 1 must carry no payload", code="BAD_MESSAGE")
            h_mine = self._handshake_hash_now()
            reply = self._write(self._identity_payload(h_mine, role=b"R"))
            self.phase = HandshakePhase.WAIT_FINAL
            return _frame(reply)
        if not self.initiator and self.phase is HandshakePhase.WAIT_FINAL:
            h_before = self._handshake_hash_now()
            payload, remote_static = self._read(message)
            self._check_identity(payload, remote_static, h_before, role=b"I")
            self._finish()
            return b""
        raise HandshakeError(f"unexpected handshake message in phase {self.phase.value}",
                             code="BAD_MESSAGE")

    def _read(self, message: bytes) -> tuple[bytes, bytes | None]:
        """Read one Noise message; return its payload and the remote static key.

        The final message makes noiseprotocol drop its handshake state, so the
        state object is held here to read the remote static key afterwards.
        """
        state = self._noise.noise_protocol.handshake_state
        try:
            payload = bytes(self._noise.read_message(message))
        except (InvalidTag, NoiseInvalidMessage) as exc:
            raise HandshakeError(
                "handshake message failed to authenticate (the peer speaks another "
                "protocol version, or the message was altered)",
                code="BAD_MESSAGE",
            ) from exc
        except (NoiseHandshakeError, NoiseValueError, ValueError, IndexError) as exc:
            # ValueError also covers a low-order key in ee/es/se (see _write).
            raise HandshakeError(f"malformed handshake message: {exc}", code="BAD_MESSAGE") from exc
        remote_static = getattr(state.rs, "public_bytes", None)
        return payload, remote_static

    def _write(self, payload: bytes) -> bytearray:
        """Write our next message; its DH tokens take the peer's keys as input.

        Message 2 computes ``ee`` and ``es`` with the initiator's ephemeral key,
        which arrived in the clear and unauthenticated in message 1. X25519 with
        a low-order point (32 zero bytes, for one) gives an all-zero shared
        secret, which cryptography refuses with ``ValueError`` (Noise spec §12.1:
        DH may signal an error for an invalid public key). The peer's fault.
        """
        try:
            return self._noise.write_message(payload)
        except (NoiseHandshakeError, NoiseValueError, ValueError) as exc:
            raise HandshakeError(
                f"the peer's key is unusable (a low-order point?): {exc}", code="BAD_MESSAGE"
            ) from exc

    def _identity_payload(self, h: bytes, *, role: bytes) -> bytes:
        proof = self.keypair.sign(PROOF_CONTEXT + role + h)
        return bytes([PAYLOAD_VERSION]) + self.keypair.public_key + proof

    def _check_identity(
        self, payload: bytes, remote_static: bytes | None, h_before: bytes, *, role: bytes
    ) -> None:
        if len(payload) != PAYLOAD_BYTES or payload[0] != PAYLOAD_VERSION:
            raise HandshakeError(
                f"identity payload of {len(payload)} bytes (version "
                f"{payload[0] if payload else None}); expected {PAYLOAD_BYTES} bytes, version "
                f"{PAYLOAD_VERSION}",
                code="BAD_PAYLOAD",
            )
        public_key = payload[1 : 1 + KEY_BYTES]
        signature = payload[1 + KEY_BYTES :]
        try:
            mapped = public_key_to_x25519(public_key)
        except KeyFormatError as exc:
            raise HandshakeError(str(exc), code="BAD_PAYLOAD") from exc
        if mapped != remote_static:
            raise HandshakeError(
                f"peer claims key {format_key(public_key)} but its Noise static key belongs "
                "to another identity",
                code="BAD_PROOF",
            )
        if not verify_signature(public_key, PROOF_CONTEXT + role + h_before, signature):
            raise HandshakeError(
                f"identity proof of {format_key(public_key)} does not verify", code="BAD_PROOF"
            )
        if self.expected_remote_key is not None and public_key != self.expected_remote_key:
            raise HandshakeError(
                f"expected remote key {format_key(self.expected_remote_key)}, "
                f"but the peer proved key {format_key(public_key)}",
                code="KEY_MISMATCH",
                expected=self.expected_remote_key,
                actual=public_key,
            )
        self.remote_public_key = public_key

    def _finish(self) -> None:
        self.handshake_hash = bytes(self._noise.get_handshake_hash())
        self.phase = HandshakePhase.COMPLETE


@functools.lru_cache(maxsize=64)
def _static_keypair(keypair: KeyPair) -> KeyPair25519:
    # Building the X25519 key object costs ~45 µs; a node reuses its identity.
    return KeyPair25519.from_private_bytes(keypair.x25519_private)


def _frame(message: bytes | bytearray) -> bytes:
    if len(message) > MAX_NOISE_MESSAGE_BYTES:  # pragma: no cover - XX messages are small
        raise HandshakeError("handshake message too large", code="MISUSE")
    return pack_header(len(message), FrameType.HANDSHAKE) + bytes(message)
