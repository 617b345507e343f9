"""View checkpoints: a fresh replica becomes usable without replaying every entry.

An admin replica makes, every so often (:class:`~._replication.ReplicationConfig`:
every ``checkpoint_every`` counted entries, at most once per
``checkpoint_min_interval_s``), a *checkpoint* of what it has applied: for each
writer how many entries its causal gate released (and their clocks), where it
stopped, the writer's own signed head covering them, how many the view holds;
the admin entries; and every row of the view. A fresh replica fetches it from
a peer (``crdt.checkpoint``, ``crdt.checkpoint_page``), checks it, installs
it — the view as the admin had it, the gate restored as after replaying those
entries — and is usable at once. Replication then fetches the logs as before:
entries the checkpoint covers are stored (chain and signatures checked) but
not replayed, and the rest are applied as they arrive.

Wire form (sans-IO here; the replicator moves the bytes)::

    header     msgpack [FORMAT, db, signer, made_ms, writers, state_size,
                        clocks_size, page_hashes, view_digest]
               writers: [[key, released, log_length, head_hash, head_signature,
                          applied, stop | nil], ...] sorted by key
    signature  Ed25519 by ``signer`` over SIGNING_DOMAIN ‖ header
    state      msgpack [[[writer, index, payload], ...], [rows of each view table]]
               (the admin entries, the view)
    clocks     zlib of every writer's released clocks (int64 little-endian, in
               the header's writer order)
    pages      the state, then the clocks, each cut into PAGE_BYTES pieces;
               page_hashes[i] = BLAKE2b(page i)

The state comes first and is all a replica needs to answer reads: it
installs the view, then fetches the clocks (eight bytes per entry before
compression: most of a large checkpoint) and restores its gate, writes
waiting meanwhile.

What a replica refuses (:class:`CheckpointRefused`, ``code``), falling back to
the full catch-up: ``MALFORMED`` (does not decode, or breaks a rule below),
``WRONG_DB``, ``BAD_SIGNATURE``, ``NOT_AN_ADMIN`` (the signer is not an admin
by the replica's own admission — for a fresh replica, only the database's
creator — nor by the checkpoint's), ``BAD_HEAD`` (a writer's head is not signed
by that writer), ``BAD_DIGEST`` (a page or the view's rows do not hash to
what the header says), ``STALE`` (not ahead of what the replica has) and
``MISMATCH`` (it contradicts what the replica released: other clocks, or past
a stop). A writer's signed head binds the checkpoint to its log: once the
replica's copy reaches that length its chain hash must be the head's, or the
checkpoint is dropped and every entry replayed (:meth:`~._base.Base.ingest`).

Trust: the rows are the admin's computation, not re-derived; the admin is
trusted with the database anyway (it admits and removes writers).
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgpack

from p2p.keys import KeyPair, verify_signature
from p2p.log import GENESIS_HASH, Head

from ._admission import Admission, compute_admission, has_admin_ops
from ._entries import Entry, EntryId, decode_entry
from ._errors import BadEntry, CrdtError
from ._view import TABLE_COLUMNS

__all__ = [
    "FORMAT",
    "PAGE_BYTES",
    "Checkpoint",
    "CheckpointHeader",
    "CheckpointRefused",
    "CheckpointState",
    "CheckpointWriter",
    "build_checkpoint",
    "decode_clocks",
    "decode_header",
    "decode_state",
    "verify_header",
    "verify_page",
]

FORMAT = 1
#: One page per ``crdt.checkpoint_page`` answer (a mux message is at most 512 KiB).
PAGE_BYTES = 256 * 1024
#: A body of at most 1,024 pages (256 MiB): the most a replica holds while installing.
MAX_PAGES = 1024
#: Writers a checkpoint may name (as many as ``heads`` lists).
MAX_WRITERS = 1024
#: An encoded header: writers, page hashes and the rest fit in a mux message.
MAX_HEADER_BYTES = 400 * 1024
SIGNING_DOMAIN = b"cosmicac/crdt/checkpoint/v1\x00"
#: Clocks a replica unpacks at most (8 bytes per entry: 128 million entries).
MAX_CLOCK_BYTES = 1 << 30
_PAGE_PERSON = b"cacl-ckpt-page"
_VIEW_PERSON = b"cacl-ckpt-view"
_MAX_INT = 2**63 - 1
_KEY = 32


class CheckpointRefused(CrdtError):
    """A checkpoint this replica will not install (``code`` says why; see the module doc).

    The replica goes on with the full catch-up instead.
    """

    code = "CHECKPOINT_REFUSED"


@dataclass(frozen=True, slots=True)
class CheckpointWriter:
    """One writer in a checkpoint."""

    key: bytes
    #: Entries its gate released; their clocks are in the body.
    released: int
    #: The writer's signed head covering them (``log_length >= released``).
    log_length: int
    head_hash: bytes
    head_signature: bytes
    #: Entries of it the view holds (the counted ones: ``released`` within its cap).
    applied: int
    #: (index, code) where the gate stopped it, if it did.
    stop: tuple[int, str] | None

    @property
    def head(self) -> Head | None:
        if not self.log_length:
            return None
        return Head(self.log_length, self.head_hash, self.head_signature)


@dataclass(frozen=True, slots=True)
class CheckpointHeader:
    db: bytes
    signer: bytes
    made_ms: int
    writers: tuple[CheckpointWriter, ...]
    state_size: int
    clocks_size: int
    page_hashes: tuple[bytes, ...]
    view_digest: bytes

    @property
    def state_pages(self) -> int:
        return -(-self.state_size // PAGE_BYTES)

    @property
    def clock_pages(self) -> range:
        """Indexes of the pages holding the clocks."""
        return range(self.state_pages, len(self.page_hashes))

    @property
    def released(self) -> int:
        """Entries it covers, over every writer."""
        return sum(w.released for w in self.writers)

    def encode(self) -> bytes:
        return msgpack.packb([
            FORMAT, self.db, self.signer, self.made_ms,
            [[w.key, w.released, w.log_length, w.head_hash, w.head_signature, w.applied,
              list(w.stop) if w.stop else None] for w in self.writers],
            self.state_size, self.clocks_size, list(self.page_hashes), self.view_digest,
        ], use_bin_type=True)


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """A checked state (the view and admin entries): what to install first."""

    admin_entries: list[tuple[EntryId, Entry]]
    admin_payloads: list[tuple[bytes, int, bytes]]
    tables: list[list[tuple[Any, ...]]]
    admission: Admission


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A checkpoint as made and served: the signed header and the body's pages."""

    header: CheckpointHeader
    header_bytes: bytes
    signature: bytes
    pages: list[bytes] = field(repr=False)

    @cached_property
    def id(self) -> bytes:
        """Names this checkpoint when its pages are asked for."""
        return checkpoint_id(self.header_bytes)


def checkpoint_id(header_bytes: bytes) -> bytes:
    return hashlib.blake2b(header_bytes, digest_size=32).digest()


def _page_hash(page: bytes) -> bytes:
    return hashlib.blake2b(page, digest_size=32, person=_PAGE_PERSON).digest()


def view_digest(tables: Sequence[Sequence[Sequence[Any]]]) -> bytes:
    """The digest of a view's rows (table order of ``TABLE_COLUMNS``, rows in key order)."""
    return hashlib.blake2b(msgpack.packb([[list(r) for r in rows] for rows in tables],
                                         use_bin_type=True),
                           digest_size=32, person=_VIEW_PERSON).digest()


def _little_endian(clocks: array) -> bytes:
    if sys.byteorder == "big":  # pragma: no cover - no big-endian machine here
        clocks = array("q", clocks)
        clocks.byteswap()
    return clocks.tobytes()


def _clocks_from(data: bytes) -> array:
    clocks = array("q")
    clocks.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover
        clocks.byteswap()
    return clocks


# -- making -----------------------------------------------------------------------------


def build_checkpoint(keypair: KeyPair, db: bytes, made_ms: int,
                     writers: Sequence[CheckpointWriter], clocks: dict[bytes, array],
                     admin: Sequence[tuple[bytes, int, bytes]],
                     tables: Sequence[Sequence[tuple[Any, ...]]]) -> Checkpoint:
    """Encode, page and sign a checkpoint of the given state (the admin's side)."""
    writers = tuple(sorted(writers, key=lambda w: w.key))
    state = msgpack.packb([
        [list(item) for item in admin],
        [[list(row) for row in rows] for rows in tables],
    ], use_bin_type=True)
    # Level 1: as small as 6 for rising clocks (1.5 MB per million), ten times faster.
    clock_bytes = zlib.compress(b"".join(_little_endian(clocks[w.key]) for w in writers), 1)
    pages = [part[at:at + PAGE_BYTES] for part in (state, clock_bytes)
             for at in range(0, len(part), PAGE_BYTES)]
    if len(pages) > MAX_PAGES:
        raise CheckpointRefused(f"a checkpoint is at most {MAX_PAGES} pages of {PAGE_BYTES} "
                                f"bytes, this one is {len(pages)}", code="TOO_LARGE")
    header = CheckpointHeader(db, keypair.public_key, made_ms, writers, len(state),
                              len(clock_bytes), tuple(_page_hash(p) for p in pages),
                              view_digest(tables))
    header_bytes = header.encode()
    return Checkpoint(header, header_bytes, keypair.sign(SIGNING_DOMAIN + header_bytes), pages)


# -- checking ---------------------------------------------------------------------------


def _malformed(what: str) -> CheckpointRefused:
    return CheckpointRefused(f"malformed checkpoint: {what}", code="MALFORMED")


def _is_int(value: Any, low: int = 0) -> bool:
    return type(value) is int and low <= value <= _MAX_INT


def _is_bytes(value: Any, size: int) -> bool:
    return isinstance(value, bytes) and len(value) == size


def decode_header(data: bytes) -> CheckpointHeader:
    """Decode a header (hostile bytes); nothing is verified but its shape.

    Raises:
        CheckpointRefused: ``MALFORMED`` or ``TOO_LARGE``.
    """
    if not isinstance(data, bytes):
        raise _malformed("the header is not bytes")
    if len(data) > MAX_HEADER_BYTES:
        raise CheckpointRefused(f"a checkpoint header is at most {MAX_HEADER_BYTES} bytes",
                                code="TOO_LARGE")
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise _malformed(f"the header does not decode ({exc})") from None
    if not isinstance(document, list) or len(document) != 9:
        raise _malformed("the header is not an array of 9")
    (version, db, signer, made_ms, writers, state_size, clocks_size, page_hashes,
     digest) = document
    if version != FORMAT or type(version) is not int:
        raise _malformed(f"format {version!r}, this code reads {FORMAT}")
    if not (_is_bytes(db, _KEY) and _is_bytes(signer, _KEY) and _is_int(made_ms)
            and _is_int(state_size) and _is_int(clocks_size) and _is_bytes(digest, 32)):
        raise _malformed("a bad db, signer, time, size or digest")
    if not isinstance(writers, list) or len(writers) > MAX_WRITERS:
        raise _malformed(f"writers is not a list of at most {MAX_WRITERS}")
    if not isinstance(page_hashes, list) or len(page_hashes) > MAX_PAGES:
        raise _malformed(f"page_hashes is not a list of at most {MAX_PAGES}")
    if not all(_is_bytes(h, 32) for h in page_hashes):
        raise _malformed("a page hash is not 32 bytes")
    if len(page_hashes) != -(-state_size // PAGE_BYTES) + -(-clocks_size // PAGE_BYTES):
        raise _malformed(f"{len(page_hashes)} pages do not hold {state_size} + {clocks_size} "
                         "bytes")
    decoded = []
    for item in writers:
        if not isinstance(item, list) or len(item) != 7:
            raise _malformed("a writer is not an array of 7")
        key, released, log_length, head_hash, signature, applied, stop = item
        if not (_is_bytes(key, _KEY) and _is_int(released) and _is_int(log_length)
                and _is_bytes(head_hash, 32) and isinstance(signature, bytes)
                and _is_int(applied)):
            raise _malformed("a writer's fields have the wrong types")
        if not applied <= released <= log_length:
            raise _malformed("a writer has applied > released or released > its log")
        if log_length and len(signature) != 64:
            raise _malformed("a writer's head signature is not 64 bytes")
        if not log_length and (signature or head_hash != GENESIS_HASH):
            raise _malformed("an empty writer log with a head")
        if stop is not None:
            if not (isinstance(stop, list) and len(stop) == 2 and _is_int(stop[0])
                    and isinstance(stop[1], str) and 0 < len(stop[1]) <= 32):
                raise _malformed("a writer's stop is not [index, code]")
            if stop[0] < released:
                raise _malformed("a writer stopped inside what it released")
            stop = (stop[0], stop[1])
        decoded.append(CheckpointWriter(key, released, log_length, head_hash, signature,
                                        applied, stop))
    keys = [w.key for w in decoded]
    if keys != sorted(set(keys)):
        raise _malformed("writers are not sorted by key, or repeat")
    if sum(w.released for w in decoded) * 8 > MAX_CLOCK_BYTES:
        raise CheckpointRefused("a checkpoint of more entries than a replica unpacks",
                                code="TOO_LARGE")
    return CheckpointHeader(db, signer, made_ms, tuple(decoded), state_size, clocks_size,
                            tuple(page_hashes), digest)


def verify_header(header: CheckpointHeader, header_bytes: bytes, signature: bytes,
                  db: bytes) -> None:
    """Check what the header alone can prove: its database, the signer's
    signature, and every writer's signature of its own head.

    Whether the signer is an admin is the installing replica's call
    (:meth:`~._base.Base.install_checkpoint`) and :func:`decode_body`'s.

    Raises:
        CheckpointRefused: ``WRONG_DB``, ``BAD_SIGNATURE`` or ``BAD_HEAD``.
    """
    if header.db != db:
        raise CheckpointRefused("the checkpoint is of another database", code="WRONG_DB")
    if not (isinstance(signature, bytes)
            and verify_signature(header.signer, SIGNING_DOMAIN + header_bytes, signature)):
        raise CheckpointRefused("the checkpoint is not signed by the key it names",
                                code="BAD_SIGNATURE")
    for writer in header.writers:
        head = writer.head
        if head is not None and not head.verify(writer.key):
            raise CheckpointRefused(f"the head of writer {writer.key.hex()[:12]} is not "
                                    "signed by that writer", code="BAD_HEAD")


def verify_page(header: CheckpointHeader, index: int, page: bytes) -> None:
    """Raises CheckpointRefused (``BAD_DIGEST``) unless ``page`` is page ``index``."""
    if not (0 <= index < len(header.page_hashes)) or not isinstance(page, bytes):
        raise CheckpointRefused(f"no page {index}", code="BAD_DIGEST")
    if index < header.state_pages:
        size, at = header.state_size, index
    else:
        size, at = header.clocks_size, index - header.state_pages
    expected = min(PAGE_BYTES, size - at * PAGE_BYTES)
    if len(page) != expected or _page_hash(page) != header.page_hashes[index]:
        raise CheckpointRefused(f"page {index} does not hash to what the header says",
                                code="BAD_DIGEST")


def decode_state(header: CheckpointHeader, state: bytes) -> CheckpointState:
    """Decode and check the state (admin entries, view rows) from pages that passed
    :func:`verify_page`.

    Raises:
        CheckpointRefused: ``MALFORMED``, ``BAD_DIGEST`` (the rows do not hash
            to the header's view digest) or ``NOT_AN_ADMIN`` (the signer is not
            an admin by the checkpoint's own admin entries).
    """
    if len(state) != header.state_size:
        raise CheckpointRefused("the state is not the size the header says", code="BAD_DIGEST")
    try:
        document = msgpack.unpackb(state, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise _malformed(f"the state does not decode ({exc})") from None
    if not isinstance(document, list) or len(document) != 2:
        raise _malformed("the state is not an array of 2")
    admin_items, tables = document
    tables = _decode_tables(tables)
    if view_digest(tables) != header.view_digest:
        raise CheckpointRefused("the view's rows do not hash to the header's digest",
                                code="BAD_DIGEST")
    admin_entries, admin_payloads = _decode_admin(header, admin_items)
    admission = compute_admission(header.db, admin_entries)
    if not admission.is_admin(header.signer):
        raise CheckpointRefused("the signer is not an admin by the checkpoint's own "
                                "admin entries", code="NOT_AN_ADMIN")
    for writer in header.writers:
        if writer.applied != admission.counted_length(writer.key, writer.released):
            raise _malformed(f"writer {writer.key.hex()[:12]}: the view holds "
                             f"{writer.applied} entries, its admission counts another number")
    return CheckpointState(admin_entries, admin_payloads, tables, admission)


def decode_clocks(header: CheckpointHeader, state: CheckpointState,
                  data: bytes) -> dict[bytes, array]:
    """Unpack the clocks from pages that passed :func:`verify_page`.

    Raises:
        CheckpointRefused: ``MALFORMED`` (they do not unpack to one clock per
            released entry, or an admin entry's clock differs).
    """
    size = 8 * sum(w.released for w in header.writers)
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(data, size + 1)
    except zlib.error as exc:
        raise _malformed(f"the clocks do not unpack ({exc})") from None
    if len(raw) != size or not inflate.eof or inflate.unconsumed_tail or inflate.unused_data:
        raise _malformed("the clocks are not one per released entry")
    clocks: dict[bytes, array] = {}
    at = 0
    for writer in header.writers:
        # Not checked entry by entry (a released log's clocks rise): the admin
        # vouches for them, and a million would cost a pass in Python.
        clocks[writer.key] = _clocks_from(raw[at:at + 8 * writer.released])
        at += 8 * writer.released
        if writer.released and clocks[writer.key][0] < 1:
            raise _malformed("a clock below 1")
    for where, entry in state.admin_entries:
        if entry.clock != clocks[where.writer][where.index]:
            raise _malformed("an admin entry's clock is not the one released")
    return clocks


def _decode_tables(tables: Any) -> list[list[tuple[Any, ...]]]:
    if not isinstance(tables, list) or len(tables) != len(TABLE_COLUMNS):
        raise _malformed(f"the view is not {len(TABLE_COLUMNS)} tables")
    out = []
    for (name, columns), rows in zip(TABLE_COLUMNS.items(), tables, strict=True):
        if not isinstance(rows, list):
            raise _malformed(f"table {name} is not a list")
        checked = []
        for row in rows:
            if not isinstance(row, list) or len(row) != columns:
                raise _malformed(f"a row of {name} is not {columns} values")
            for value in row:
                if not (value is None or isinstance(value, str | bytes)
                        or (type(value) is int and -_MAX_INT - 1 <= value <= _MAX_INT)):
                    raise _malformed(f"a value of {name} is not an integer, text or bytes")
            checked.append(tuple(row))
        out.append(checked)
    return out


def _decode_admin(header: CheckpointHeader, items: Any
                  ) -> tuple[list[tuple[EntryId, Entry]], list[tuple[bytes, int, bytes]]]:
    if not isinstance(items, list):
        raise _malformed("the admin entries are not a list")
    released = {w.key: w.released for w in header.writers}
    entries, payloads, seen = [], [], set()
    for item in items:
        if not (isinstance(item, list) and len(item) == 3 and _is_bytes(item[0], _KEY)
                and _is_int(item[1]) and isinstance(item[2], bytes)):
            raise _malformed("an admin entry is not [writer, index, payload]")
        writer, index, payload = item
        if index >= released.get(writer, 0) or (writer, index) in seen:
            raise _malformed("an admin entry outside what was released, or twice")
        seen.add((writer, index))
        try:
            entry = decode_entry(payload)
        except BadEntry as exc:
            raise _malformed(f"an admin entry does not decode ({exc})") from None
        if entry.db != header.db or not has_admin_ops(entry):
            raise _malformed("an admin entry of another database, or without admin ops")
        entries.append((EntryId(writer, index), entry))
        payloads.append((writer, index, payload))
    return entries, payloads
