"""One writer's append-only, hash-chained, signed log file (DESIGN.md §3.8).

Each writer of a shared database has its own log; a replica stores a copy of
every writer's log. Entries are opaque ``bytes`` (the caller encodes its own
operations). Only the holder of the writer's key pair appends new entries;
anyone with the public key can read and verify the file, and a replica extends
its copy with :meth:`WriterLog.append_verified` using heads the writer signed.
The file format, and how a crash is told from damage, are in :mod:`._records`.

On open, a torn tail is cut off (to the end of the last valid HEAD) and
:attr:`WriterLog.recovery` says what was dropped; damage a crash cannot explain
raises :class:`LogCorrupted` and the file is left untouched.

Blocking file I/O throughout: async callers wrap calls in ``trio.to_thread``.
A handle is not thread-safe; use one at a time.
"""

from __future__ import annotations

import bisect
import enum
import fcntl
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from p2p.keys import KeyPair, format_key

from ._errors import InvalidBatch, LogCorrupted, LogInUse, NotWriter
from ._records import (
    _HEADER,
    CRDT_NAMESPACE,
    ENTRY,
    GENESIS_HASH,
    HEAD,
    MAX_BODY,
    Head,
    Recovery,
    VerifyReport,
    _check_public_key,
    _decode_entry,
    _decode_head,
    _encode_entries,
    _encode_head,
    _read_record,
    _Scan,
    _scan_fd,
    chain_hash,
    head_message,
    verify_file,
)

__all__ = [
    "CRDT_NAMESPACE",
    "GENESIS_HASH",
    "MAX_BODY",
    "FsyncPolicy",
    "Head",
    "PreparedBatch",
    "Recovery",
    "VerifyReport",
    "WriterLog",
    "chain_hash",
    "head_message",
    "verify_file",
]

log = logging.getLogger(__name__)

_READ_SPAN_BYTES = 1 << 20


class FsyncPolicy(enum.Enum):
    """When an append is forced to stable storage before it returns."""

    #: fsync after every batch: a returned append survives power loss.
    ALWAYS = "always"
    #: never fsync: for tests and benchmarks only. NOT durable: an OS crash or
    #: power loss may lose batches that were acknowledged.
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """Entries encoded, chained and signed, not yet written (see
    :meth:`WriterLog.prepare_batch`)."""

    start: int
    runs: list[tuple[bytearray, list[int], Head]]

    @property
    def head(self) -> Head | None:
        return self.runs[-1][2] if self.runs else None


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
        namespace: bytes = CRDT_NAMESPACE,
    ) -> None:
        self.path = path
        self.namespace = namespace
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
        namespace: bytes = CRDT_NAMESPACE,
    ) -> WriterLog:
        """Open (creating if missing) and fully verify the log of writer ``public_key``.

        Pass ``keypair`` to be able to :meth:`append_batch`. A torn tail is cut
        off and described in :attr:`recovery`.

        ``namespace`` is what the heads' signatures are bound to (see
        :mod:`._records`); every handle on one file must pass the same.

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
                scan = _scan_fd(path, fd, public_key, namespace=namespace)
            except BaseException:
                os.close(fd)
                raise
            return cls(path, fd, public_key, None, fsync, scan, scan.tail, namespace)
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
            scan = _scan_fd(path, fd, public_key, namespace=namespace)
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
        return cls(path, fd, public_key, keypair, fsync, scan, recovery, namespace)

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

    def head_hash_at(self, length: int) -> bytes | None:
        """The chain hash the file's signed head at exactly ``length`` holds, or None."""
        position = bisect.bisect_left(self._head_lengths, length)
        if position == len(self._head_lengths) or self._head_lengths[position] != length:
            return None
        return self._read_head(position).head_hash

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
        return self.write_prepared(self.prepare_batch(payloads, max_run=max_run))

    def prepare_batch(self, payloads: Sequence[bytes], *,
                      max_run: int | None = None) -> PreparedBatch:
        """Encode, chain and sign a batch without writing it (the CPU half of
        :meth:`append_batch`); :meth:`write_prepared` writes it.

        So an async caller can do this part on its own thread and hand only
        the write and fsync to a worker thread. Nothing may be appended
        between the two calls (the batch continues the log as it is now).
        """
        if self._keypair is None:
            raise NotWriter(
                f"{self.path} was opened read-only; appending needs the writer's "
                f"key pair for {format_key(self.public_key)}"
            )
        run = len(payloads) if max_run is None else max_run
        if run < 1:
            raise ValueError(f"max_run must be >= 1, got {max_run}")
        runs = []
        length, head_hash = self._length, self._head_hash
        for first in range(0, len(payloads), run):
            chunk = payloads[first:first + run]
            buf, offsets, head_hash = _encode_entries(chunk, length, head_hash)
            length += len(chunk)
            signature = self._keypair.sign(head_message(self.public_key, length, head_hash,
                                                          self.namespace))
            runs.append((buf, offsets, Head(length, head_hash, signature)))
        return PreparedBatch(self._length, runs)

    def write_prepared(self, batch: PreparedBatch) -> int:
        """Write (and fsync, per the policy) a batch from :meth:`prepare_batch`;
        the new length once durable.

        Raises:
            ValueError: the log changed since the batch was prepared (nothing written).
        """
        if batch.start != self._length:
            raise ValueError(f"the batch continues a log of {batch.start} entries; "
                             f"this one has {self._length}")
        if batch.runs:
            self._write(batch.runs)
        return self._length

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
        if not head.verify(self.public_key, self.namespace):
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

    def sync(self) -> None:
        """Force every append so far to stable storage (for a log opened with
        ``FsyncPolicy.NEVER`` whose owner decides when durability is needed)."""
        os.fdatasync(self._require_open())

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
