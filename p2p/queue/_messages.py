"""The wire of ``cosmicac-mq/1`` and the receiver's sans-IO state.

Everything here is pure: bytes in, values or :class:`BadQueueMessage` out.
The format is described message by message in README.md; in short every
message is one msgpack array whose first element is its type::

    STATUS   [1, have, acked]                  consumer -> publisher
    ENTRIES  [2, start, [entry...], head|nil]  publisher -> consumer
    head   = [length, head_hash (32 bytes), signature (64 bytes)]
    entry  = msgpack [key (str), payload (bin)]   (a log entry's bytes)
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from p2p.log import Head

from ._errors import BadQueueMessage

__all__ = [
    "ENTRIES",
    "MAX_ENTRIES_PER_MESSAGE",
    "MQ_NAMESPACE",
    "PROTOCOL",
    "STATUS",
    "Entries",
    "Receiver",
    "Status",
    "decode_entry",
    "decode_message",
    "encode_entries",
    "encode_entry",
    "encode_status",
    "head_namespace",
]

PROTOCOL = "cosmicac-mq/1"
STATUS = 1
ENTRIES = 2
#: Entries one ENTRIES message may carry (a group commit is at most 1,024 by default).
MAX_ENTRIES_PER_MESSAGE = 65536
#: Heads of a queue log sign this followed by the *recipient's* key (see
#: :func:`head_namespace`).
MQ_NAMESPACE = b"cosmicac/mq/log-head/v1\x00"
_MAX_POSITION = (1 << 63) - 1
_SIGNATURE_BYTES = 64


def head_namespace(recipient: bytes) -> bytes:
    """What the heads of a queue log to ``recipient`` sign (besides length and hash).

    Binding the recipient means operations wrk-ork signed for one worker can
    never be replayed into another worker's queue, and binding the use means a
    queue log is never taken for a database log (``p2p.log`` explains).
    """
    return MQ_NAMESPACE + recipient


@dataclass(frozen=True, slots=True)
class Status:
    """Consumer -> publisher: I store ``have`` entries of your log and acked up to ``acked``."""

    have: int
    acked: int


@dataclass(frozen=True, slots=True)
class Entries:
    """Publisher -> consumer: entries ``start``.. of my log, and the head ending them (or None)."""

    start: int
    entries: tuple[bytes, ...]
    head: Head | None


def encode_status(have: int, acked: int) -> bytes:
    return msgpack.packb([STATUS, have, acked])


def encode_entries(start: int, entries: list[bytes] | tuple[bytes, ...],
                   head: Head | None) -> bytes:
    wire_head = None if head is None else [head.length, head.head_hash, head.signature]
    return msgpack.packb([ENTRIES, start, list(entries), wire_head], use_bin_type=True)


def encode_entry(key: str, payload: bytes) -> bytes:
    """A log entry's bytes: what one publish appends."""
    return msgpack.packb([key, payload], use_bin_type=True)


def decode_entry(data: bytes) -> tuple[str, bytes]:
    """``(key, payload)`` of a log entry; BadQueueMessage(BAD_ENTRY) if it is not one."""
    try:
        value = msgpack.unpackb(data, raw=False)
    except (ValueError, msgpack.UnpackException) as exc:  # ExtraData is a ValueError
        raise BadQueueMessage(f"entry does not decode: {exc}", code="BAD_ENTRY") from None
    if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], str)
            or not isinstance(value[1], bytes)):
        raise BadQueueMessage("entry is not [key, payload]", code="BAD_ENTRY")
    return value[0], value[1]


def _position(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_POSITION:
        raise BadQueueMessage(f"{what} is not a position: {value!r:.40}", code="DECODE_ERROR")
    return value


def decode_message(data: bytes) -> Status | Entries:
    """One message from the peer; BadQueueMessage for anything else."""
    try:
        value = msgpack.unpackb(data, raw=False, max_bin_len=len(data), max_str_len=len(data),
                                max_array_len=MAX_ENTRIES_PER_MESSAGE, max_map_len=0,
                                max_ext_len=0)
    except (ValueError, msgpack.UnpackException, RecursionError) as exc:
        raise BadQueueMessage(f"message does not decode: {exc!s:.80}",
                              code="DECODE_ERROR") from None
    if not isinstance(value, list) or not value or type(value[0]) is not int:
        raise BadQueueMessage("message is not [type, ...]", code="DECODE_ERROR")
    kind = value[0]
    if kind == STATUS:
        if len(value) != 3:
            raise BadQueueMessage("STATUS is [1, have, acked]", code="DECODE_ERROR")
        have, acked = _position(value[1], "have"), _position(value[2], "acked")
        if acked > have:
            raise BadQueueMessage(f"acked {acked} is past have {have}", code="ACK_AHEAD")
        return Status(have, acked)
    if kind == ENTRIES:
        if len(value) != 4 or not isinstance(value[2], list):
            raise BadQueueMessage("ENTRIES is [2, start, [entry...], head]",
                                  code="DECODE_ERROR")
        start = _position(value[1], "start")
        entries = value[2]
        if not all(isinstance(entry, bytes) for entry in entries):
            raise BadQueueMessage("an entry is not bytes", code="DECODE_ERROR")
        head = None
        if value[3] is not None:
            wire = value[3]
            if (not isinstance(wire, list) or len(wire) != 3
                    or not isinstance(wire[1], bytes) or len(wire[1]) != 32
                    or not isinstance(wire[2], bytes) or len(wire[2]) != _SIGNATURE_BYTES):
                raise BadQueueMessage("head is not [length, hash, signature]",
                                      code="DECODE_ERROR")
            head = Head(_position(wire[0], "head length"), wire[1], wire[2])
        if start + len(entries) > _MAX_POSITION:
            raise BadQueueMessage("entries run past the last position", code="DECODE_ERROR")
        return Entries(start, tuple(entries), head)
    raise BadQueueMessage(f"unknown message type {kind}", code="BAD_TYPE")


class Receiver:
    """The consumer's side of one channel: turns ENTRIES into verified-append work.

    It holds the entries of a run sent in pieces until the head that ends it
    arrives, at most ``max_pending_bytes`` of them (more ends the channel,
    RUN_TOO_LARGE: our own runs are far smaller, see QueueConfig). It checks
    that entries continue what we store (a repeat of what we have is dropped;
    a gap ends the channel) and that every entry decodes, so that a signed but
    malformed entry is never stored. Signature and chain are the log's to
    check (``WriterLog.append_verified``), after :meth:`offer`.
    """

    def __init__(self, have: int, max_pending_bytes: int) -> None:
        self.have = have
        self.max_pending_bytes = max_pending_bytes
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def offer(self, message: Entries) -> tuple[list[bytes], Head] | None:
        """Take one ENTRIES: the run to verify and append (the entries after
        what we had, and the head ending them), or None while a run is
        incomplete or the message repeats what we have. Runs returned one after
        the other continue each other, so the caller may append several at once
        under the last one's head (the chain covers them all)."""
        expected = self.have + len(self._pending)
        entries = list(message.entries)
        if message.start > expected:
            raise BadQueueMessage(f"entries from {message.start}, expected {expected}",
                                  code="GAP")
        entries = entries[expected - message.start:]
        for entry in entries:
            decode_entry(entry)
        self._pending_bytes += sum(len(entry) for entry in entries)
        if self._pending_bytes > self.max_pending_bytes:
            raise BadQueueMessage(f"a run over {self.max_pending_bytes} bytes without a head",
                                  code="RUN_TOO_LARGE")
        self._pending.extend(entries)
        head = message.head
        if head is None:
            return None
        if head.length <= self.have and not self._pending:
            return None  # a repeat of what we store
        if head.length != self.have + len(self._pending):
            raise BadQueueMessage(f"head says {head.length}, the run ends at "
                                  f"{self.have + len(self._pending)}", code="BAD_LENGTH")
        run = self._pending
        self._pending, self._pending_bytes = [], 0
        # Counted as ours from now on: the caller appends it, or (if the log
        # refuses it) ends the channel, and a new channel starts from the log.
        self.have = head.length
        return run, head
