"""The shared database: per-writer signed logs and a CRDT view over them (DESIGN.md §3.8).

Layers, bottom up (each module's docstring says more):

- :class:`WriterLog` (``_log``): one writer's append-only, hash-chained, signed file;
- :class:`Entry` (``_entries``): what one payload says (clock, dependencies, ops);
- ``_ops``: the operations and their rules; :class:`View` (``_view``) applies
  them into SQLite, as a pure function of the set of entries;
- ``_causal`` (the gate: entries wait for their dependencies) and
  ``_admission`` (who may write, from the admin entries);
- :class:`Base` (``_base``): all of the above on one storage folder;
  :class:`Database` (``_database``): its trio face with group commit;
- :class:`Replicator` (``_replication``, protocol in ``_messages``): replication
  over the swarm; :func:`run_database_service` (``_service``): a replica on a swarm;
- ``_inspect``: ``cosmicac db status|verify`` without opening the replica.
"""

from ._admission import Admission, WriterGrant, compute_admission
from ._base import MAX_ENTRY_BYTES, Base, WriterStatus
from ._database import Database
from ._entries import ENTRY_VERSION, Entry, EntryId, decode_entry, order_key
from ._errors import (
    BadEntry,
    CrdtError,
    DatabaseMismatch,
    InvalidBatch,
    LogCorrupted,
    LogInUse,
    NotWriter,
    RecordTooLarge,
    UnknownWriter,
    WriteRefused,
)
from ._inspect import Problem, StorageReport, inspect_storage, read_daemon_status, verify_storage
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
from ._operator import OperatorResult, change_writer
from ._replication import ReplicationConfig, Replicator, replication_topic
from ._service import DatabaseService, run_database_service

__all__ = [
    "ENTRY_VERSION",
    "GENESIS_HASH",
    "MAX_BODY",
    "MAX_ENTRY_BYTES",
    "Admission",
    "BadEntry",
    "Base",
    "CrdtError",
    "Database",
    "DatabaseMismatch",
    "DatabaseService",
    "Entry",
    "EntryId",
    "FsyncPolicy",
    "Head",
    "InvalidBatch",
    "LogCorrupted",
    "LogInUse",
    "NotWriter",
    "OperatorResult",
    "Problem",
    "RecordTooLarge",
    "Recovery",
    "ReplicationConfig",
    "Replicator",
    "StorageReport",
    "UnknownWriter",
    "VerifyReport",
    "WriteRefused",
    "WriterGrant",
    "WriterLog",
    "WriterStatus",
    "chain_hash",
    "change_writer",
    "compute_admission",
    "decode_entry",
    "head_message",
    "inspect_storage",
    "order_key",
    "read_daemon_status",
    "replication_topic",
    "run_database_service",
    "verify_file",
    "verify_storage",
]
