"""The exception tree of the ``crdt`` package.

Every error the package raises on purpose derives from :class:`CrdtError`,
itself a :class:`p2p.errors.P2PError`, so callers that already handle the P2P
stack's errors catch these too::

    CrdtError
    ├── LogCorrupted                 a log file on disk is damaged or forged
    │                                (.path, .offset; .code: BAD_CRC, BAD_RECORD,
    │                                BAD_CHAIN, BAD_SIGNATURE)
    ├── LogInUse                     another handle already has the log file open
    ├── NotWriter                    an append needs the writer's key pair
    ├── InvalidBatch                 replicated entries or head rejected before writing
    │                                (.code: BAD_CHAIN, BAD_SIGNATURE, BAD_LENGTH)
    ├── UnknownWriter                replicated entries of a key no admin admitted
    ├── WriteRefused                 this replica may not write that (.code:
    │                                NOT_A_WRITER, NOT_AN_ADMIN, BAD_OP, TOO_LARGE,
    │                                READ_ONLY; for writer changes also REMOVED,
    │                                UNKNOWN_WRITER, LAST_ADMIN)
    ├── DatabaseMismatch             the storage holds another database
    ├── CheckpointRefused            a view checkpoint not installed (.code: MALFORMED,
    │                                WRONG_DB, BAD_SIGNATURE, NOT_AN_ADMIN, BAD_HEAD,
    │                                BAD_DIGEST, STALE, MISMATCH, TOO_LARGE; defined
    │                                in _checkpoint.py)
    ├── BadEntry                     an entry breaks the entry rules (.code)
    │   └── InvalidOp (ValueError)   one operation has a bad field (.code BAD_OP;
    │                                .op, .field); also raised when a typed
    │                                operation (PutApiKey...) is built
    └── RecordTooLarge (ValueError)  a payload does not fit in one record

Callers branch on ``code``, never on the message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from p2p.errors import P2PError
from p2p.log import _errors as _log_errors

__all__ = [
    "BadEntry",
    "CrdtError",
    "DatabaseMismatch",
    "InvalidBatch",
    "InvalidOp",
    "LogCorrupted",
    "LogInUse",
    "NotWriter",
    "RecordTooLarge",
    "UnknownWriter",
    "WriteRefused",
    "log_errors",
]


class CrdtError(P2PError):
    """Base of every error the ``crdt`` package raises on purpose."""

    code = "CRDT_ERROR"


class LogCorrupted(CrdtError, _log_errors.LogCorrupted):
    """A log file holds a damaged or forged record that is not a torn tail.

    ``path`` and ``offset`` locate the first bad record. Nothing in the file was
    changed: the operator must restore the file from a replica or a backup (or
    delete it and let replication fetch it again). (The log's own error,
    raised as the database's by :func:`log_errors`.)
    """

    code = "LOG_CORRUPTED"


class LogInUse(CrdtError, _log_errors.LogInUse):
    """The log file is already open (in this or another process)."""

    code = "LOG_IN_USE"


class NotWriter(CrdtError, _log_errors.NotWriter):
    """Appending needs the writer's key pair; this handle was opened without it."""

    code = "NOT_WRITER"


class InvalidBatch(CrdtError, _log_errors.InvalidBatch):
    """Entries received from replication do not extend this log validly.

    Nothing was written. ``code`` says why: ``BAD_LENGTH`` (the head's length is
    not the log's length plus the entries), ``BAD_CHAIN`` (the entries do not
    hash to the head's hash) or ``BAD_SIGNATURE`` (the writer did not sign it).
    """

    code = "INVALID_BATCH"


class RecordTooLarge(CrdtError, _log_errors.RecordTooLarge):
    """A payload is larger than one record may be."""

    code = "RECORD_TOO_LARGE"


_AS_CRDT: dict[type[_log_errors.LogError], type[CrdtError]] = {
    _log_errors.LogCorrupted: LogCorrupted,
    _log_errors.LogInUse: LogInUse,
    _log_errors.NotWriter: NotWriter,
    _log_errors.InvalidBatch: InvalidBatch,
    _log_errors.RecordTooLarge: RecordTooLarge,
}


@contextmanager
def log_errors() -> Iterator[None]:
    """Raise the log's errors (``p2p.log``) as the database's own subclasses.

    The log moved to ``p2p.log`` so the queue could share it; the database's
    callers still catch ``CrdtError`` and ``crdt.LogCorrupted``..., so every
    call into the log from this package runs inside this.
    """
    try:
        yield
    except _log_errors.LogError as exc:
        kind = _AS_CRDT.get(type(exc))
        if kind is None:
            raise
        translated = kind.__new__(kind)
        translated.__dict__.update(exc.__dict__)
        translated.args = exc.args
        raise translated from exc


class BadEntry(CrdtError):
    """An entry that does not decode or breaks the entry rules (``.code`` says which).

    Replicas refuse it: it is never applied, whoever signed it.
    """

    code = "BAD_ENTRY"


class InvalidOp(BadEntry, ValueError):
    """An operation with a bad field; nothing was built or written.

    ``op`` is the operation's wire name (``key_put``...), ``field`` the field
    that is wrong (``None`` when the operation as a whole is: an unknown name,
    a wrong number of arguments). Replicas skip such an op in a peer's entry.
    """

    code = "BAD_OP"

    def __init__(self, message: str, *, op: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(message, code="BAD_OP")
        self.op = op
        self.field = field


class UnknownWriter(CrdtError):
    """Entries signed by a key that no admin writer admitted; nothing was stored."""

    code = "UNKNOWN_WRITER"


class WriteRefused(CrdtError):
    """This replica may not append that; nothing was written (``.code`` says why)."""

    code = "WRITE_REFUSED"


class DatabaseMismatch(CrdtError):
    """The storage folder already holds a different database."""

    code = "DATABASE_MISMATCH"
