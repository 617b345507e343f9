"""The replication protocol: three RPC methods on channel ``cosmicac-db/1``.

Carried by :mod:`p2p.rpc` over swarm connections, so each side knows the
other's key from the Noise handshake. Every call names the database (its
bootstrap key): a peer serving another database answers ``WRONG_DB``.

``heads``  what the server has: ``[writer, length]`` for every log it keeps.
           With ``known`` (the answer the caller got last time) and
           ``wait_s``, the server answers as soon as something changed, or
           after ``wait_s`` with the same lengths (a long poll: no
           notifications needed, and nothing is sent while nothing changes).
``fetch``  entries of one writer's log from ``start``: whole runs between
           signed heads, about ``max_bytes`` of them, with the head that ends
           them; a run larger than ``max_bytes`` comes in pieces whose last
           carries the head.
``join``   ask to be admitted as a writer: an admin whose allow-list holds
           the caller's key appends ``add_writer`` for it.
``checkpoint``       the newest view checkpoint this admin made (its
                     signed header; see :mod:`._checkpoint`), to fast-forward
                     a fresh replica; ``NO_CHECKPOINT`` if it has none.
``checkpoint_page``  one page of a checkpoint's body, by the header's hash.
``admin``  the operator's ``cosmicac db add-writer|remove-writer`` on a
           running replica: the request is signed with the replica's own
           identity (:func:`admin_message`), so only whoever holds its storage
           folder can make it, over a connection with any key.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from p2p.keys import KEY_BYTES
from p2p.rpc import Method

__all__ = [
    "ADMIN",
    "CHECKPOINT",
    "CHECKPOINT_PAGE",
    "FETCH",
    "HEADS",
    "JOIN",
    "PROTOCOL",
    "AdminParams",
    "AdminResult",
    "CheckpointPageParams",
    "CheckpointPageResult",
    "CheckpointParams",
    "CheckpointResult",
    "FetchParams",
    "FetchResult",
    "HeadModel",
    "HeadsParams",
    "HeadsResult",
    "JoinParams",
    "JoinResult",
    "admin_message",
]

PROTOCOL = "cosmicac-db/1"
#: Writers one database may have (bounds every ``heads`` answer).
MAX_WRITERS = 1024
#: The most entry bytes one ``fetch`` answer carries (a mux message is <= 512 KiB).
MAX_FETCH_BYTES = 384 * 1024
MAX_WAIT_S = 60.0

Bytes32 = Annotated[bytes, Field(strict=True, min_length=KEY_BYTES, max_length=KEY_BYTES)]
Length = Annotated[int, Field(strict=True, ge=0, le=2**63 - 1)]


class HeadsParams(BaseModel):
    db: Bytes32
    known: list[tuple[Bytes32, Length]] | None = Field(default=None, max_length=MAX_WRITERS)
    wait_s: float = Field(default=0.0, ge=0.0, le=MAX_WAIT_S)


class HeadsResult(BaseModel):
    lengths: list[tuple[Bytes32, Length]] = Field(max_length=MAX_WRITERS)


class FetchParams(BaseModel):
    db: Bytes32
    writer: Bytes32
    start: Length
    max_bytes: int = Field(default=256 * 1024, ge=1024, le=MAX_FETCH_BYTES)


class HeadModel(BaseModel):
    length: Length
    head_hash: Annotated[bytes, Field(strict=True, min_length=32, max_length=32)]
    signature: Annotated[bytes, Field(strict=True, min_length=64, max_length=64)]


class FetchResult(BaseModel):
    entries: list[bytes] = Field(max_length=100_000)
    head: HeadModel | None = None


class JoinParams(BaseModel):
    db: Bytes32


class JoinResult(BaseModel):
    #: ``added``: an add_writer entry was appended for the caller;
    #: ``already``: the caller is a writer already.
    status: Literal["added", "already"]


class AdminParams(BaseModel):
    db: Bytes32
    action: Literal["add_writer", "remove_writer"]
    writer: Bytes32
    admin: bool = False
    #: The replica's own signature of :func:`admin_message` for this request.
    signature: Annotated[bytes, Field(strict=True, min_length=64, max_length=64)]


class AdminResult(BaseModel):
    #: ``added``, ``already`` (a writer already), or ``removed``.
    status: Literal["added", "already", "removed"]
    #: For ``removed``: how many of the writer's entries go on counting.
    length: int | None = None


class CheckpointParams(BaseModel):
    db: Bytes32


class CheckpointResult(BaseModel):
    #: The encoded header (decoded and checked by :mod:`._checkpoint`).
    header: Annotated[bytes, Field(strict=True, max_length=400 * 1024)]
    signature: Annotated[bytes, Field(strict=True, min_length=64, max_length=64)]


class CheckpointPageParams(BaseModel):
    db: Bytes32
    #: BLAKE2b-256 of the header.
    checkpoint: Bytes32
    page: Annotated[int, Field(strict=True, ge=0, lt=1024)]


class CheckpointPageResult(BaseModel):
    data: Annotated[bytes, Field(strict=True, max_length=256 * 1024)]


def admin_message(db: bytes, caller: bytes, action: str, writer: bytes, admin: bool) -> bytes:
    """What the replica's identity signs to ask itself for a writer change.

    The caller's connection key is in it, so a signature seen on the wire is
    no use to anyone else.
    """
    return (b"cosmicac/db-admin/v1\0" + db + caller + action.encode() + b"\0" + writer
            + struct.pack(">?", admin))


HEADS = Method("crdt.heads", params=HeadsParams, result=HeadsResult)
FETCH = Method("crdt.fetch", params=FetchParams, result=FetchResult)
JOIN = Method("crdt.join", params=JoinParams, result=JoinResult)
ADMIN = Method("crdt.admin", params=AdminParams, result=AdminResult)
CHECKPOINT = Method("crdt.checkpoint", params=CheckpointParams, result=CheckpointResult)
CHECKPOINT_PAGE = Method("crdt.checkpoint_page", params=CheckpointPageParams,
                         result=CheckpointPageResult)
