"""Proving a new path belongs to a session, without I/O.

A hole punch ends with a bare TCP connection between two hosts. Before a
session moves onto it (:meth:`p2p.noise.SecretStream.migrate`), each end proves
it holds the session's path secret (derived from both directions' keys, which
only the two ends have), so a stranger who connects, or replays what it saw on
another path, never gets a session moved onto its socket::

    HELLO  magic "cacP" | version 1 | role "I"/"R" | hint 16 | nonce 16   (38 bytes)
    PROOF  BLAKE2b-256(key = secret, role | own nonce | peer's nonce | hint)  (32 bytes)

Both ends send HELLO at once (a simultaneous open has no dialler), then PROOF
once the peer's HELLO is in. A PROOF covers the peer's fresh nonce, so an old
one is worth nothing; ``hint`` names the session (a hash of the secret) so a
host knows which session a path is for without trying them all. The path's id
(the MIGRATE frame's body) is a hash of both nonces, the same at both ends.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Final

from ..errors import P2PError

__all__ = [
    "HELLO_BYTES",
    "PROOF_BYTES",
    "PathProofError",
    "check_proof",
    "make_hello",
    "make_proof",
    "parse_hello",
    "path_id",
    "session_hint",
]

MAGIC: Final = b"cacP"
VERSION: Final = 1
NONCE_BYTES: Final = 16
HINT_BYTES: Final = 16
_HELLO = struct.Struct(f">4sBc{HINT_BYTES}s{NONCE_BYTES}s")
HELLO_BYTES: Final = _HELLO.size
PROOF_BYTES: Final = 32
ROLES: Final = (b"I", b"R")


class PathProofError(P2PError):
    """The other end of a new path is not the other end of our session."""

    code = "BAD_PATH_PROOF"


def session_hint(secret: bytes) -> bytes:
    return hashlib.blake2b(secret, digest_size=HINT_BYTES, person=b"cac-path-hint-1").digest()


def make_hello(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    if role not in ROLES or len(nonce) != NONCE_BYTES:
        raise ValueError("role is b'I' or b'R' and the nonce 16 bytes")
    return _HELLO.pack(MAGIC, VERSION, role, session_hint(secret), nonce)


def parse_hello(data: bytes, secret: bytes, *, peer_role: bytes) -> bytes:
    """The peer's nonce from its HELLO.

    Raises:
        PathProofError: not a HELLO, another version, the wrong role, or
            another session's hint.
    """
    if len(data) != HELLO_BYTES:
        raise PathProofError(f"a HELLO is {HELLO_BYTES} bytes, not {len(data)}")
    magic, version, role, hint, nonce = _HELLO.unpack(data)
    if magic != MAGIC:
        raise PathProofError("not a path HELLO (bad magic)")
    if version != VERSION:
        raise PathProofError(f"path proof version {version} is not ours ({VERSION})")
    if role != peer_role:
        raise PathProofError(f"the peer claims role {role!r}; expected {peer_role!r}")
    if not hmac.compare_digest(hint, session_hint(secret)):
        raise PathProofError("the HELLO is for another session")
    return nonce


def make_proof(secret: bytes, role: bytes, own_nonce: bytes, peer_nonce: bytes) -> bytes:
    return hashlib.blake2b(role + own_nonce + peer_nonce + session_hint(secret),
                           digest_size=PROOF_BYTES, key=secret,
                           person=b"cac-path-proof1").digest()


def check_proof(proof: bytes, secret: bytes, *, peer_role: bytes, peer_nonce: bytes,
                own_nonce: bytes) -> None:
    """Raises PathProofError unless ``proof`` is the peer's over our fresh nonce."""
    expected = make_proof(secret, peer_role, peer_nonce, own_nonce)
    if len(proof) != PROOF_BYTES or not hmac.compare_digest(proof, expected):
        raise PathProofError("the peer's path proof does not verify")


def path_id(initiator_nonce: bytes, responder_nonce: bytes) -> bytes:
    return hashlib.blake2b(initiator_nonce + responder_nonce, digest_size=16,
                           person=b"cac-path-id-1").digest()
