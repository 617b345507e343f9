"""The shared database: per-writer signed logs and a CRDT view over them (DESIGN.md §3.8).

So far: :class:`WriterLog`, one writer's append-only, hash-chained, signed log
file, and :class:`Entry`, what one of its payloads says (clock, dependencies,
operations) with the order every replica gives entries.
"""

from ._entries import ENTRY_VERSION, Entry, EntryId, decode_entry, order_key
from ._errors import (
    BadEntry,
    CrdtError,
    InvalidBatch,
    LogCorrupted,
    LogInUse,
    NotWriter,
    RecordTooLarge,
)
from ._log import (
    GENESIS_HASH,
    MAX_BODY,
    FsyncPolicy,
    Head,
    Recovery,
    VerifyReport,
    WriterLog,
    chain_hash,
    head_message,
    verify_file,
)

__all__ = [
    "ENTRY_VERSION",
    "GENESIS_HASH",
    "MAX_BODY",
    "BadEntry",
    "CrdtError",
    "Entry",
    "EntryId",
    "FsyncPolicy",
    "Head",
    "InvalidBatch",
    "LogCorrupted",
    "LogInUse",
    "NotWriter",
    "RecordTooLarge",
    "Recovery",
    "VerifyReport",
    "WriterLog",
    "chain_hash",
    "decode_entry",
    "head_message",
    "order_key",
    "verify_file",
]
