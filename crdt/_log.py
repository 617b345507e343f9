"""One writer's append-only, hash-chained, signed log file (DESIGN.md §3.8).

Each writer of a shared database has its own log; a replica stores a copy of
every writer's log. Entries are opaque ``bytes`` (the caller encodes its own
operations). Only the holder of the writer's key pair appends new entries;
anyone with the public key can read and verify the file, and a replica extends
its copy with :meth:`WriterLog.append_verified` using heads the writer signed.

On-disk format
==============

The file is a sequence of records, each::

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

    b"cosmicac/crdt/log-head/v1\\0" ‖ writer public key ‖ u64 BE length ‖ head_hash

The log's durable length is the length of the last valid HEAD. Entries after
it were never acknowledged to anyone.

Recovery on open
================

A damaged record with no well-formed record (magic + header + complete body
whose CRC checks) anywhere after it is a torn tail left by a crash: it and any
unacknowledged entries before it are cut off (the file is truncated to the end
of the last valid HEAD), and :attr:`WriterLog.recovery` says what was dropped.
A damaged record *followed* by a well-formed one cannot come from a crash, so
it raises :class:`LogCorrupted` and the file is left untouched. A record whose
CRC checks but whose content is wrong (bad msgpack, broken chain, bad
signature) cannot come from a crash either and is always :class:`LogCorrupted`.

Blocking file I/O throughout: async callers wrap calls in ``trio.to_thread``.
A handle is not thread-safe; use one at a time.
"""

from __future__ import annotations

import bisect
import enum
import fcntl
import hashlib
import logging
import mmap
import os
import struct
import zlib
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgpack

from p2p.keys import KEY_BYTES, KeyPair, format_key, verify_signature

from ._errors import InvalidBatch, LogCorrupted, LogInUse, NotWriter, RecordTooLarge

__all__ = [
    "GENESIS_HASH",
    "MAX_BODY",
    "FsyncPolicy",
    "Head",
    "Recovery",
    "VerifyReport",
    "WriterLog",
    "chain_hash",
    "head_message",
    "verify_file",
]

log = logging.getLogger(__name__)

MAGIC = b"CACL"
ENTRY = 1
HEAD = 2
_HEADER = struct.Struct(">4sBII")  # magic, type, body length, crc
MAX_BODY = 16 * 1024 * 1024
GENESIS_HASH = bytes(32)
_HASH_PERSON = b"cosmicac/log/v1"  # BLAKE2b personalisation: at most 16 bytes
_HEAD_NAMESPACE = b"cosmicac/crdt/log-head/v1\x00"
_U64 = struct.Struct(">Q")
_READ_SPAN_BYTES = 1 << 20


class FsyncPolicy(enum.Enum):
    """When an append is forced to stable storage before it returns."""

    #: fsync after every batch: a returned append survives power loss.
    ALWAYS = "always"
    #: never fsync: for tests and benchmarks only. NOT durable: an OS crash or
    #: power loss may lose batches that were acknowledged.
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class Head:
    """A signed statement by the writer: "my log has ``length`` entries ending in ``head_hash``"."""

    length: int
    head_hash: bytes
    signature: bytes

    def verify(self, public_key: bytes) -> bool:
        return verify_signature(
            public_key, head_message(public_key, self.length, self.head_hash), self.signature
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


def head_message(public_key: bytes, length: int, head_hash: bytes) -> bytes:
    """The bytes a writer signs in a HEAD record."""
    return _HEAD_NAMESPACE + public_key + _U64.pack(length) + head_hash


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
          every_signature: bool) -> _Scan:
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
            if every_signature and not head.verify(public_key):
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

    if last_head is not None and not every_signature and not last_head.verify(public_key):
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


def _scan_fd(path: str, fd: int, public_key: bytes, *, every_signature: bool = False) -> _Scan:
    size = os.fstat(fd).st_size
    if size == 0:
        return _scan(path, b"", public_key, every_signature=every_signature)
    # mmap so a large log is paged through, not read into memory at once.
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
        return _scan(path, data, public_key, every_signature=every_signature)


def _check_public_key(public_key: bytes) -> bytes:
    if not isinstance(public_key, bytes | bytearray) or len(public_key) != KEY_BYTES:
        raise ValueError(f"a writer public key is {KEY_BYTES} bytes")
    return bytes(public_key)


def verify_file(path: str | os.PathLike[str], public_key: bytes) -> VerifyReport:
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
        scan = _scan_fd(path, fd, public_key, every_signature=True)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    return VerifyReport(path, scan.length, scan.head_hash, len(scan.head_offsets), size, scan.tail)


# --- the log handle --------------------------------------------------------------------


class WriterLog:
    """An open writer log. Build with :meth:`open`; close with :meth:`close` or ``with``."""

    def __init__(
        self,
        path: str,
        fd: int,
        public_key: bytes,
        keypair: KeyPair | None,
        fsync: FsyncPolicy,
        scan: _Scan,
        recovery: Recovery | None,
    ) -> None:
        self.path = path
        self.public_key = public_key
        self.fsync = fsync
        #: What was cut off the end of the file when it was opened, or None.
        self.recovery = recovery
        self._fd: int | None = fd
        self._keypair = keypair
        self._entry_offsets = scan.entry_offsets
        self._head_offsets = scan.head_offsets
        self._head_lengths = scan.head_lengths
        self._length = scan.length
        self._head_hash = scan.head_hash
        self._last_head = scan.last_head
        self._end = scan.durable_end

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        public_key: bytes,
        keypair: KeyPair | None = None,
        *,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        read_only: bool = False,
    ) -> WriterLog:
        """Open (creating if missing) and fully verify the log of writer ``public_key``.

        Pass ``keypair`` to be able to :meth:`append_batch`. A torn tail is cut
        off and described in :attr:`recovery`.

        ``read_only`` opens an existing file without locking or changing it,
        even while a daemon has it open (for ``cosmicac db status``): a tail
        being written is left alone and only described in :attr:`recovery`.

        Raises:
            LogCorrupted: damage a crash cannot explain; the file is unchanged.
            LogInUse: another handle has the file open.
            NotWriter: ``keypair`` is not the key pair of ``public_key``.
        """
        public_key = _check_public_key(public_key)
        if keypair is not None and keypair.public_key != public_key:
            raise NotWriter(f"key pair {keypair.hex} is not writer {format_key(public_key)}")
        path = os.fspath(path)
        if read_only:
            if keypair is not None:
                raise NotWriter("a read-only log cannot be given the writer's key pair")
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                scan = _scan_fd(path, fd, public_key)
            except BaseException:
                os.close(fd)
                raise
            return cls(path, fd, public_key, None, fsync, scan, scan.tail)
        created = not os.path.exists(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                # Two handles appending (or one truncating under another) would
                # interleave records; an exclusive lock makes that an error.
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LogInUse(f"{path} is already open; close the other handle first") from None
            if created and fsync is FsyncPolicy.ALWAYS:
                _fsync_dir(Path(path).parent)  # or the whole file may vanish on power loss
            scan = _scan_fd(path, fd, public_key)
            recovery = scan.tail
            if recovery is not None:
                log.warning(
                    "%s: dropped %d bytes from byte %d (%s); they were never acknowledged",
                    path,
                    recovery.dropped_bytes,
                    recovery.offset,
                    recovery.reason,
                )
                os.ftruncate(fd, recovery.offset)
                if fsync is FsyncPolicy.ALWAYS:
                    os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, public_key, keypair, fsync, scan, recovery)

    # reading

    @property
    def length(self) -> int:
        """How many acknowledged entries the log has."""
        return self._length

    @property
    def head_hash(self) -> bytes:
        """The chain hash of the last entry (GENESIS_HASH when empty)."""
        return self._head_hash

    @property
    def head(self) -> Head | None:
        """The last signed head, or None for an empty log."""
        return self._last_head

    @property
    def is_writer(self) -> bool:
        return self._keypair is not None

    def __len__(self) -> int:
        return self._length

    def entry(self, index: int) -> bytes:
        """The payload of entry ``index`` (0-based), read from disk."""
        if not 0 <= index < self._length:
            raise IndexError(f"entry {index} is out of range (the log has {self._length})")
        offset = self._entry_offsets[index]
        _, payload = _decode_entry(self._read_body(offset, ENTRY))
        return payload

    def entries(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Yield payloads ``start`` (inclusive) to ``end`` (exclusive, default: the end).

        Reads the file in spans of about 1 MiB, not one read per entry.
        """
        stop = self._length if end is None else min(end, self._length)
        index = max(start, 0)
        while index < stop:
            span_end = min(stop, self._span_end(index, _READ_SPAN_BYTES))
            yield from self.read_range(index, span_end)
            index = span_end

    def _span_end(self, start: int, max_bytes: int) -> int:
        """The end of a run of entries from ``start`` that fits in ``max_bytes`` (at least one)."""
        offsets = self._entry_offsets
        limit = offsets[start] + max_bytes
        return max(start + 1, bisect.bisect_right(offsets, limit, start, self._length) - 1)

    def read_range(self, start: int, end: int) -> list[bytes]:
        """The payloads of entries ``start`` to ``end`` (exclusive), in one read."""
        if not 0 <= start <= end <= self._length:
            raise IndexError(
                f"entries {start}..{end} are out of range (the log has {self._length})")
        if start == end:
            return []
        fd = self._require_open()
        first = self._entry_offsets[start]
        last = self._entry_offsets[end - 1]
        header = os.pread(fd, _HEADER.size, last)
        span_end = last + _HEADER.size + (_HEADER.unpack(header)[2] if len(header) == _HEADER.size
                                          else 0)
        data = os.pread(fd, span_end - first, first)
        payloads: list[bytes] = []
        pos = 0
        while pos < len(data):
            record = _read_record(data, pos)
            if isinstance(record[0], str):
                raise LogCorrupted(f"record changed since the log was opened ({record[1]})",
                                   path=self.path, offset=first + pos, code=record[0])
            rtype, body, pos = record
            if rtype == ENTRY:
                payloads.append(_decode_entry(body)[1])
        if len(payloads) != end - start:
            raise LogCorrupted("records changed since the log was opened", path=self.path,
                               offset=first, code="BAD_RECORD")
        return payloads

    def segment(self, start: int, max_bytes: int) -> tuple[list[bytes], Head | None]:
        """Entries from ``start`` for a replica, ending on a signed head when they can.

        Returns as many whole head-to-head runs as fit in about ``max_bytes``
        (and at least the first run) with the head that ends them, so the
        replica can :meth:`append_verified` them at once. A single run larger
        than ``max_bytes`` comes in pieces: every piece but the last has no
        head, and the replica holds them until the head arrives.
        """
        if not 0 <= start < self._length:
            raise IndexError(f"no entries from {start} (the log has {self._length})")
        lengths = self._head_lengths
        first_head = bisect.bisect_right(lengths, start)  # the first head past start
        limit = self._entry_offsets[start] + max_bytes
        # The last head whose entries end within the budget (heads sit right after them).
        within = bisect.bisect_right(self._head_offsets, limit) - 1
        if within >= first_head:
            end = lengths[within]
            return self.read_range(start, end), self._read_head(within)
        end = self._span_end(start, max_bytes)
        if end >= lengths[first_head]:
            return self.read_range(start, lengths[first_head]), self._read_head(first_head)
        return self.read_range(start, end), None

    def head_lengths(self) -> list[int]:
        """The lengths at which the file holds a signed head, oldest first."""
        return list(self._head_lengths)

    def _read_head(self, position: int) -> Head:
        return _decode_head(self._read_body(self._head_offsets[position], HEAD))

    def heads(self) -> Iterator[Head]:
        """Yield every signed head in the file, oldest first."""
        for offset in self._head_offsets:
            yield _decode_head(self._read_body(offset, HEAD))

    def _read_body(self, offset: int, rtype: int) -> bytes:
        fd = self._require_open()
        header = os.pread(fd, _HEADER.size, offset)
        length = _HEADER.unpack(header)[2] if len(header) == _HEADER.size else 0
        record = _read_record(header + os.pread(fd, min(length, MAX_BODY), offset + len(header)), 0)
        if isinstance(record[0], str) or record[0] != rtype:
            # It verified at open: something changed the file under us.
            raise LogCorrupted(
                f"record changed since the log was opened ({record[1]!s:.60})",
                path=self.path,
                offset=offset,
                code="BAD_CRC",
            )
        return record[1]

    # writing

    def append_batch(self, payloads: Sequence[bytes], *, max_run: int | None = None) -> int:
        """Append entries and a signed head; return the new length once durable.

        With ``max_run``, a head is signed after every ``max_run`` entries (so
        replicas can fetch the batch in bounded pieces); the whole batch is
        still one write and one fsync.

        Raises:
            NotWriter: this handle was opened without the writer's key pair.
            RecordTooLarge: a payload does not fit in one record (nothing written).
        """
        if self._keypair is None:
            raise NotWriter(
                f"{self.path} was opened read-only; appending needs the writer's "
                f"key pair for {format_key(self.public_key)}"
            )
        if not payloads:
            return self._length
        run = len(payloads) if max_run is None else max_run
        if run < 1:
            raise ValueError(f"max_run must be >= 1, got {max_run}")
        runs = []
        length, head_hash = self._length, self._head_hash
        for first in range(0, len(payloads), run):
            chunk = payloads[first:first + run]
            buf, offsets, head_hash = _encode_entries(chunk, length, head_hash)
            length += len(chunk)
            signature = self._keypair.sign(head_message(self.public_key, length, head_hash))
            runs.append((buf, offsets, Head(length, head_hash, signature)))
        self._write(runs)
        return length

    def append_verified(self, payloads: Sequence[bytes], head: Head) -> int:
        """Append entries the writer signed elsewhere (replication); return the new length.

        Checks that ``payloads`` extend this log to exactly ``head`` and that the
        writer signed ``head`` before writing anything.

        Raises:
            InvalidBatch: ``BAD_LENGTH``, ``BAD_CHAIN`` or ``BAD_SIGNATURE``; nothing written.
        """
        expected = self._length + len(payloads)
        if head.length != expected:
            raise InvalidBatch(
                f"head says {head.length} entries; this log has {self._length} "
                f"and {len(payloads)} were given",
                code="BAD_LENGTH",
            )
        buf, offsets, new_hash = _encode_entries(payloads, self._length, self._head_hash)
        if new_hash != head.head_hash:
            raise InvalidBatch("the entries do not hash to the head's hash", code="BAD_CHAIN")
        if not head.verify(self.public_key):
            raise InvalidBatch(
                f"head is not signed by writer {format_key(self.public_key)}", code="BAD_SIGNATURE"
            )
        if payloads:
            self._write([(buf, offsets, head)])
        return self._length

    def _write(self, runs: list[tuple[bytearray, list[int], Head]]) -> None:
        """Write runs of (entry records, their offsets, the head after them); fsync once."""
        fd = self._require_open()
        out = bytearray()
        entry_offsets: list[int] = []
        head_offsets: list[int] = []
        for entries, offsets, head in runs:
            entry_offsets.extend(self._end + len(out) + off for off in offsets)
            out += entries
            head_offsets.append(self._end + len(out))
            out += _encode_head(head)
        data = memoryview(out)
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], self._end + written)
            if self.fsync is FsyncPolicy.ALWAYS:
                os.fdatasync(fd)
        except BaseException:
            # Leave no half batch behind for the next append to build on. (If
            # this fails too, the next open treats the rest as a torn tail.)
            try:
                os.ftruncate(fd, self._end)
            except OSError:
                pass
            raise
        head = runs[-1][2]
        self._entry_offsets.extend(entry_offsets)
        self._head_offsets.extend(head_offsets)
        self._head_lengths.extend(run[2].length for run in runs)
        self._end += len(data)
        self._length = head.length
        self._head_hash = head.head_hash
        self._last_head = head

    # lifetime

    def _require_open(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: the log is closed")
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # also releases the lock
            self._fd = None

    def __enter__(self) -> WriterLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        role = "writer" if self.is_writer else "reader"
        return f"WriterLog({self.path!r}, {role}, length={self._length})"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
