"""One writer's append-only, hash-chained, signed log file: the stack's Hypercore.

The database (``crdt``) keeps one per writer; the durable queue
(``p2p.queue``) one per direction. Only the holder of the writer's key pair
appends (:meth:`WriterLog.append_batch`); anyone with the public key verifies
the file, and a replica extends its copy with :meth:`WriterLog.append_verified`
from entries and a head the writer signed. Each use signs its heads in a
namespace of its own (``namespace=``), so one use's log is never accepted as
another's. The file format is in :mod:`._records`; how a crash is told from
damage there too.
"""

from ._errors import InvalidBatch, LogCorrupted, LogError, LogInUse, NotWriter, RecordTooLarge
from ._log import FsyncPolicy, PreparedBatch, WriterLog
from ._records import (
    CRDT_NAMESPACE,
    GENESIS_HASH,
    MAX_BODY,
    Head,
    Recovery,
    VerifyReport,
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
    "InvalidBatch",
    "LogCorrupted",
    "LogError",
    "LogInUse",
    "NotWriter",
    "PreparedBatch",
    "RecordTooLarge",
    "Recovery",
    "VerifyReport",
    "WriterLog",
    "chain_hash",
    "head_message",
    "verify_file",
]
