"""The shared database: per-writer signed logs and a CRDT view over them (DESIGN.md §3.8).

The public face (everything in ``__all__``; README.md shows it in use):

- :class:`Database`: a replica for trio code. Write typed operations
  (:class:`PutApiKey`, :class:`RevokeApiKey`, :class:`PutModelMaster`,
  :class:`DeleteModelMaster`, :class:`AddTokenUsage`, :class:`AddAudioUsage`,
  :class:`MarkKeyUsed`, :class:`AddWriter`, :class:`RemoveWriter`) with
  ``append``/``append_many``; read the typed rows :class:`ApiKey`,
  :class:`ModelMaster` and :class:`Usage` with its queries.
- :func:`run_database_service` (with :class:`ReplicationConfig`,
  :class:`Replicator`): a replica replicating on a swarm.
- :func:`inspect_storage`, :func:`verify_storage`, :func:`change_writer`:
  ``cosmicac db status|verify|add-writer|remove-writer``.
- The errors, all :class:`CrdtError`, each with a stable ``code``.

Layers, bottom up, in private modules (importable there, for tests and tools
that really mean the internals): ``p2p.log`` (one writer's
append-only, hash-chained, signed file: ``WriterLog``, ``chain_hash``...),
``_entries`` (what one payload says), ``_ops``/``_operations`` (the operations,
their rules and wire form), ``_view`` (SQLite, a pure function of the set of
entries), ``_causal`` (the gate), ``_admission`` (who may write), ``_base``
(all of it on one storage folder, blocking: ``Base``), ``_database`` (the trio
face), ``_messages``/``_replication``/``_service`` (replication), ``_inspect``
and ``_operator`` (the command line's needs).
"""

from p2p.log import FsyncPolicy

from ._base import WriterChange, WriterStatus
from ._checkpoint import CheckpointRefused
from ._database import Database
from ._entries import Entry, EntryId
from ._errors import (
    BadEntry,
    CrdtError,
    DatabaseMismatch,
    InvalidBatch,
    InvalidOp,
    LogCorrupted,
    LogInUse,
    NotWriter,
    RecordTooLarge,
    UnknownWriter,
    WriteRefused,
)
from ._inspect import Problem, StorageReport, inspect_storage, read_daemon_status, verify_storage
from ._operations import (
    AddAudioUsage,
    AddTokenUsage,
    AddWriter,
    DeleteModelMaster,
    MarkKeyUsed,
    Op,
    PutApiKey,
    PutModelMaster,
    RemoveWriter,
    RevokeApiKey,
    decode_op,
)
from ._operator import OperatorResult, change_writer
from ._ops import hash_secret
from ._replication import ReplicationConfig, Replicator, replication_topic
from ._service import DatabaseService, run_database_service
from ._view import ApiKey, ModelMaster, Usage

__all__ = [
    "AddAudioUsage",
    "AddTokenUsage",
    "AddWriter",
    "ApiKey",
    "BadEntry",
    "CheckpointRefused",
    "CrdtError",
    "Database",
    "DatabaseMismatch",
    "DatabaseService",
    "DeleteModelMaster",
    "Entry",
    "EntryId",
    "FsyncPolicy",
    "InvalidBatch",
    "InvalidOp",
    "LogCorrupted",
    "LogInUse",
    "MarkKeyUsed",
    "ModelMaster",
    "NotWriter",
    "Op",
    "OperatorResult",
    "Problem",
    "PutApiKey",
    "PutModelMaster",
    "RecordTooLarge",
    "RemoveWriter",
    "ReplicationConfig",
    "Replicator",
    "RevokeApiKey",
    "StorageReport",
    "UnknownWriter",
    "Usage",
    "WriteRefused",
    "WriterChange",
    "WriterStatus",
    "change_writer",
    "decode_op",
    "hash_secret",
    "inspect_storage",
    "read_daemon_status",
    "replication_topic",
    "run_database_service",
    "verify_storage",
]
