"""The on-disk format of a writer log: records, the hash chain, signed heads, scanning.

A log file is a sequence of records, each::

    magic  4 bytes   b"CACL"
    type   1 byte    1 = ENTRY, 2 = HEAD
    length u32 BE    size of the body, at most MAX_BODY (16 MiB)
    crc    u32 BE    CRC32 of type ‖ length ‖ body (so a flipped header byte
                     is caught too, not only a flipped body byte)
    body   msgpack   ENTRY: [index, payload]
                     HEAD:  [length, head_hash, signature]

Entries are hash-chained with BLAKE2b-256 personalised with ``b"cosmicac/log/v1"``::

    hash_i = H(hash_{i-1} ‖ u64 BE index ‖ payload)      hash_{-1} = 32 zero bytes

A batch is written as its ENTRY records followed by one HEAD record whose
signature is the writer's Ed25519 signature of::

    namespace ‖ writer public key ‖ u64 BE length ‖ head_hash

where ``namespace`` says what the log is for, so a head signed for one use
cannot be replayed as another's: ``b"cosmicac/crdt/log-head/v1\\0"``
(:data:`CRDT_NAMESPACE`, the default: a writer's database log) or the queue's
(``p2p.queue``: its protocol and the recipient's key). A daemon signs logs of
several kinds with one identity key; without it, a queue log could be offered
to a database replica as that writer's database log.

The log's durable length is the length of the last valid HEAD. Entries after
it were never acknowledged to anyone.

Telling a crash from damage
===========================

A writer appends a batch with one ``pwrite`` and then fsyncs; a crash (or a
reader looking while the write is under way) leaves a *prefix* of the batch's
bytes. So the only thing a crash can leave at the end of the file is a record
that is **short**: an incomplete header, or a complete header whose body runs
past the end of the file. That is a torn tail: it and any unacknowledged
entries before it (those after the last signed HEAD) are to be cut off (the
scan reports them in ``tail``). Every other bad record is damage and raises
:class:`LogCorrupted` with the record's offset, wherever it sits:

- a record whose declared length is wholly present but whose CRC fails
  (``BAD_CRC``): a prefix of a real record never looks like that. Before this
  rule, a flipped byte in the last signed head made the head look "torn", and
  opening cut every entry it acknowledged;
- a complete header without the magic, with an unknown type or an oversized
  length (``BAD_RECORD``): a crash leaves the header bytes it wrote as written;
- a short last record whose bytes *are* a complete record under a smaller
  length (the CRC matches what is there): its length field was damaged, it was
  not torn (``BAD_RECORD``);
- a bad record followed by a well-formed one (magic + header + complete body
  whose CRC checks): a crash leaves nothing after the tear;
- a record whose CRC checks but whose content is wrong (bad msgpack, broken
  chain, bad signature).

One exception to "short or damage": a run of zero bytes to the end of the file
is a torn tail too. Some filesystems, after power loss, keep a file's new size
but not its new data, which then reads as zeros; no single flipped byte turns a
record (which starts with ``CACL``) into zeros, so this never hides damage to
an acknowledged record.

CRC32 catches every error burst of up to 32 bits, so any single damaged byte in
a file is reported by :func:`verify_file` and refused by opening, never cut as
a torn tail (``tests/p2p/log/test_log.py`` checks every byte of a log).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from p2p.keys import KEY_BYTES, format_key, verify_signature

from ._errors import LogCorrupted, RecordTooLarge

__all__ = [
    "CRDT_NAMESPACE",
    "ENTRY",
    "GENESIS_HASH",
    "HEAD",
    "MAGIC",
    "MAX_BODY",
    "Head",
    "Recovery",
    "VerifyReport",
    "chain_hash",
    "head_message",
    "verify_file",
]

MAGIC = b"CACL"
ENTRY = 1
HEAD = 2
_HEADER = struct.Struct(">4sBII")  # magic, type, body length, crc
MAX_BODY = 16 * 1024 * 1024
GENESIS_HASH = bytes(32)
_HASH_PERSON = b"cosmicac/log/v1"  # BLAKE2b personalisation: at most 16 bytes
#: The head-signature namespace of a database writer's log (the default).
CRDT_NAMESPACE = b"cosmicac/crdt/log-head/v1\x00"
_U64 = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class Head:
    """A signed statement by the writer: "my log has ``length`` entries ending in ``head_hash``"."""

    length: int
    head_hash: bytes
    signature: bytes

    def verify(self, public_key: bytes, namespace: bytes = CRDT_NAMESPACE) -> bool:
        return verify_signature(
            public_key, head_message(public_key, self.length, self.head_hash, namespace),
            self.signature,
        )


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`WriterLog.open` cut off the end of a file after a crash."""

    path: str
    offset: int  # the file now ends here (end of the last valid HEAD)
    dropped_bytes: int
    dropped_entries: int  # complete entries that never got a signed HEAD
    reason: str


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The result of :func:`verify_file`: a file that checks out."""

    path: str
    length: int
    head_hash: bytes
    heads: int
    file_size: int
    tail: Recovery | None  # what opening the file would cut off, if anything


def chain_hash(previous: bytes, index: int, payload: bytes) -> bytes:
    """The hash of entry ``index`` given the hash of the entry before it."""
    h = hashlib.blake2b(digest_size=32, person=_HASH_PERSON)
    h.update(previous)
    h.update(_U64.pack(index))
    h.update(payload)
    return h.digest()


def head_message(public_key: bytes, length: int, head_hash: bytes,
                 namespace: bytes = CRDT_NAMESPACE) -> bytes:
    """The bytes a writer signs in a HEAD record."""
    return namespace + public_key + _U64.pack(length) + head_hash


def _frame(rtype: int, body: bytes) -> bytes:
    if len(body) > MAX_BODY:
        raise RecordTooLarge(f"a log record is at most {MAX_BODY} bytes, this one is {len(body)}")
    type_and_length = bytes([rtype]) + struct.pack(">I", len(body))
    return MAGIC + type_and_length + struct.pack(">I", zlib.crc32(type_and_length + body)) + body


def _encode_entries(
    payloads: Sequence[bytes], first_index: int, previous: bytes
) -> tuple[bytearray, list[int], bytes]:
    """Frame a batch's ENTRY records; return (bytes, offsets within them, new head hash)."""
    buf = bytearray()
    offsets = []
    for k, payload in enumerate(payloads):
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise TypeError(f"log entries are bytes, got {type(payload).__name__}")
        payload = bytes(payload)
        index = first_index + k
        previous = chain_hash(previous, index, payload)
        offsets.append(len(buf))
        buf += _frame(ENTRY, msgpack.packb([index, payload], use_bin_type=True))
    return buf, offsets, previous


def _encode_head(head: Head) -> bytes:
    return _frame(HEAD, msgpack.packb([head.length, head.head_hash, head.signature]))


# --- reading records -------------------------------------------------------------------


def _read_record(data: bytes | mmap.mmap, pos: int) -> tuple[int, bytes, int] | tuple[str, str]:
    """Parse the record at ``pos``: (type, body, end), or (code, problem) if malformed."""
    size = len(data)
    if size - pos < _HEADER.size:
        return "BAD_RECORD", "incomplete record header"
    magic, rtype, length, crc = _HEADER.unpack_from(data, pos)
    if magic != MAGIC:
        return "BAD_RECORD", "no record magic"
    if length > MAX_BODY:
        return "BAD_RECORD", f"record length {length} is over the {MAX_BODY}-byte limit"
    start = pos + _HEADER.size
    end = start + length
    if end > size:
        return "BAD_RECORD", f"record body is cut short ({size - start} of {length} bytes)"
    body = data[start:end]
    if zlib.crc32(data[pos + 4 : pos + 9] + body) != crc:
        return "BAD_CRC", "record checksum does not match"
    return rtype, body, end


def _damage_at_end(data: bytes | mmap.mmap, pos: int) -> tuple[str, str] | None:
    """Why the malformed record at ``pos`` (the last one: nothing well-formed follows)
    is damage, as (code, problem); None if it is a torn write (see the module docstring)."""
    size = len(data)
    if not data[pos:size].strip(b"\0"):
        return None  # zeros to the end: a size that reached the disk before its data
    rest = data[pos : pos + _HEADER.size]
    if len(rest) < _HEADER.size:
        if rest[:4] != MAGIC[: len(rest[:4])]:
            return "BAD_RECORD", "no record magic"
        return None  # an incomplete header: torn
    magic, rtype, length, crc = _HEADER.unpack(rest)
    if magic != MAGIC:
        return "BAD_RECORD", "no record magic (the header is complete, so not torn)"
    if rtype not in (ENTRY, HEAD):
        return "BAD_RECORD", f"unknown record type {rtype}"
    if length > MAX_BODY:
        return "BAD_RECORD", f"record length {length} is over the {MAX_BODY}-byte limit"
    start = pos + _HEADER.size
    if start + length <= size:
        return "BAD_CRC", "record checksum does not match (the whole record is present)"
    present = size - start
    type_and_length = bytes([rtype]) + struct.pack(">I", present)
    if zlib.crc32(type_and_length + data[start:size]) == crc:
        return "BAD_RECORD", (f"record length says {length} bytes, but the {present} bytes "
                              "present are a whole record: the length field is damaged")
    return None  # a body cut short: torn


def _well_formed_record_after(data: bytes | mmap.mmap, start: int) -> bool:
    """True if any offset >= start holds a record whose framing and CRC check out.

    This tells a torn tail (garbage to the end of the file) from damage in the
    middle. A payload that itself contains a framed log record could fool it
    into reporting corruption; that errs on the side of not truncating.
    """
    at = data.find(MAGIC, start)
    while at != -1:
        if isinstance(_read_record(data, at)[0], int):
            return True
        at = data.find(MAGIC, at + 1)
    return False


def _decode_entry(body: bytes) -> tuple[int, bytes]:
    index, payload = msgpack.unpackb(body, raw=False)
    if not isinstance(index, int) or not isinstance(payload, bytes):
        raise ValueError("entry is not [index, payload]")
    return index, payload


def _decode_head(body: bytes) -> Head:
    length, head_hash, signature = msgpack.unpackb(body, raw=False)
    if not (
        isinstance(length, int)
        and isinstance(head_hash, bytes)
        and len(head_hash) == 32
        and isinstance(signature, bytes)
    ):
        raise ValueError("head is not [length, hash, signature]")
    return Head(length, head_hash, signature)


@dataclass
class _Scan:
    entry_offsets: array  # offsets of acknowledged entries only
    head_offsets: array
    head_lengths: array  # the length each head signs, parallel to head_offsets
    length: int
    head_hash: bytes
    last_head: Head | None
    durable_end: int
    tail: Recovery | None


def _scan(path: str, data: bytes | mmap.mmap, public_key: bytes, *,
          every_signature: bool, namespace: bytes = CRDT_NAMESPACE) -> _Scan:
    """Check every record of a log; raise LogCorrupted for anything a crash cannot explain.

    Every record's CRC and the whole chain are always checked. Signatures cost
    ~60 us each, and a log written one entry at a time has a head per entry:
    opening checks only the last head's signature (``every_signature=False``),
    which covers every entry before it through the chain; an earlier head
    whose signature was forged on disk is caught by ``verify_file`` and by any
    replica it is sent to.
    """
    size = len(data)
    entry_offsets = array("Q")
    head_offsets = array("Q")
    head_lengths = array("Q")
    count, chain = 0, GENESIS_HASH
    durable_length, durable_hash, durable_end, last_head = 0, GENESIS_HASH, 0, None
    torn: str | None = None
    pos = 0
    while pos < size:
        record = _read_record(data, pos)
        if isinstance(record[0], str):
            code, problem = record
            if _well_formed_record_after(data, pos + 1):
                raise LogCorrupted(
                    f"{problem}, and valid records follow it", path=path, offset=pos, code=code
                )
            damage = _damage_at_end(data, pos)
            if damage is not None:
                raise LogCorrupted(damage[1], path=path, offset=pos, code=damage[0])
            torn = f"torn record at byte {pos} ({problem})"
            break
        rtype, body, end = record
        if rtype == ENTRY:
            try:
                index, payload = _decode_entry(body)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                raise LogCorrupted(
                    f"unreadable entry: {exc}", path=path, offset=pos, code="BAD_RECORD"
                ) from exc
            if index != count:
                raise LogCorrupted(
                    f"entry has index {index}, expected {count}",
                    path=path,
                    offset=pos,
                    code="BAD_CHAIN",
                )
            chain = chain_hash(chain, index, payload)
            entry_offsets.append(pos)
            count += 1
        elif rtype == HEAD:
            try:
                head = _decode_head(body)
            except (ValueError, TypeError, msgpack.UnpackException) as exc:
                raise LogCorrupted(
                    f"unreadable head: {exc}", path=path, offset=pos, code="BAD_RECORD"
                ) from exc
            if head.length != count or head.head_hash != chain:
                raise LogCorrupted(
                    f"head claims {head.length} entries ending in {head.head_hash.hex()[:16]}…,"
                    f" the file has {count} ending in {chain.hex()[:16]}…",
                    path=path,
                    offset=pos,
                    code="BAD_CHAIN",
                )
            if every_signature and not head.verify(public_key, namespace):
                raise LogCorrupted(
                    f"head is not signed by writer {format_key(public_key)}",
                    path=path,
                    offset=pos,
                    code="BAD_SIGNATURE",
                )
            head_offsets.append(pos)
            head_lengths.append(count)
            durable_length, durable_hash, durable_end, last_head = count, chain, end, head
        else:
            raise LogCorrupted(
                f"unknown record type {rtype}", path=path, offset=pos, code="BAD_RECORD"
            )
        pos = end

    if (last_head is not None and not every_signature
            and not last_head.verify(public_key, namespace)):
        raise LogCorrupted(
            f"head is not signed by writer {format_key(public_key)}",
            path=path,
            offset=head_offsets[-1],
            code="BAD_SIGNATURE",
        )
    tail = None
    if durable_end < size:
        unacknowledged = count - durable_length
        reason = torn or f"{unacknowledged} entries after the last signed head"
        tail = Recovery(path, durable_end, size - durable_end, unacknowledged, reason)
    del entry_offsets[durable_length:]
    return _Scan(
        entry_offsets, head_offsets, head_lengths, durable_length, durable_hash, last_head,
        durable_end, tail,
    )


def _scan_fd(path: str, fd: int, public_key: bytes, *, every_signature: bool = False,
             namespace: bytes = CRDT_NAMESPACE) -> _Scan:
    size = os.fstat(fd).st_size
    if size == 0:
        return _scan(path, b"", public_key, every_signature=every_signature,
                     namespace=namespace)
    # mmap so a large log is paged through, not read into memory at once.
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
        return _scan(path, data, public_key, every_signature=every_signature,
                     namespace=namespace)


def _check_public_key(public_key: bytes) -> bytes:
    if not isinstance(public_key, bytes | bytearray) or len(public_key) != KEY_BYTES:
        raise ValueError(f"a writer public key is {KEY_BYTES} bytes")
    return bytes(public_key)


def verify_file(path: str | os.PathLike[str], public_key: bytes, *,
                namespace: bytes = CRDT_NAMESPACE) -> VerifyReport:
    """Check a log file completely without changing it (for ``db verify``).

    Raises:
        LogCorrupted: the first damaged or forged record (a torn tail is not an
            error: it is reported in ``tail``).
        FileNotFoundError: no such file.
    """
    public_key = _check_public_key(public_key)
    path = os.fspath(path)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        scan = _scan_fd(path, fd, public_key, every_signature=True, namespace=namespace)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return VerifyReport(path, scan.length, scan.head_hash, len(scan.head_offsets), size, scan.tail)
