"""The shared database: per-writer signed logs and a CRDT view over them (DESIGN.md §3.8).

So far: :class:`WriterLog`, one writer's append-only, hash-chained, signed log file.
"""

from ._errors import CrdtError, InvalidBatch, LogCorrupted, LogInUse, NotWriter, RecordTooLarge
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
    "GENESIS_HASH",
    "MAX_BODY",
    "CrdtError",
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
    "head_message",
    "verify_file",
]
