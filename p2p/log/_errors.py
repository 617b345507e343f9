"""The exception tree of ``p2p.log``.

Every error the package raises on purpose derives from :class:`LogError`,
itself a :class:`p2p.errors.P2PError`::

    LogError
    ├── LogCorrupted                 a log file on disk is damaged or forged
    │                                (.path, .offset; .code: BAD_CRC, BAD_RECORD,
    │                                BAD_CHAIN, BAD_SIGNATURE)
    ├── LogInUse                     another handle already has the log file open
    ├── NotWriter                    an append needs the writer's key pair
    ├── InvalidBatch                 replicated entries or head rejected before writing
    │                                (.code: BAD_CHAIN, BAD_SIGNATURE, BAD_LENGTH)
    └── RecordTooLarge (ValueError)  a payload does not fit in one record

``crdt`` raises its own subclasses of these (also ``CrdtError``), so its
callers keep catching ``crdt.LogCorrupted``... and callers of the log alone
catch these. Callers branch on ``code``, never on the message.
"""

from __future__ import annotations

import os

from p2p.errors import P2PError

__all__ = ["InvalidBatch", "LogCorrupted", "LogError", "LogInUse", "NotWriter",
           "RecordTooLarge"]


class LogError(P2PError):
    """Base of every error ``p2p.log`` raises on purpose."""

    code = "LOG_ERROR"


class LogCorrupted(LogError):
    """A log file holds a damaged or forged record that is not a torn tail.

    ``path`` and ``offset`` locate the first bad record. Nothing in the file was
    changed: the operator must restore the file from a replica or a backup (or
    delete it and let replication fetch it again).
    """

    code = "LOG_CORRUPTED"

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str],
        offset: int,
        code: str | None = None,
    ) -> None:
        super().__init__(f"{os.fspath(path)} at byte {offset}: {message}", code=code)
        self.path = os.fspath(path)
        self.offset = offset


class LogInUse(LogError):
    """The log file is already open (in this or another process)."""

    code = "LOG_IN_USE"


class NotWriter(LogError):
    """Appending needs the writer's key pair; this handle was opened without it."""

    code = "NOT_WRITER"


class InvalidBatch(LogError):
    """Entries received from replication do not extend this log validly.

    Nothing was written. ``code`` says why: ``BAD_LENGTH`` (the head's length is
    not the log's length plus the entries), ``BAD_CHAIN`` (the entries do not
    hash to the head's hash) or ``BAD_SIGNATURE`` (the writer did not sign it).
    """

    code = "INVALID_BATCH"


class RecordTooLarge(LogError, ValueError):
    """A payload is larger than one record may be."""

    code = "RECORD_TOO_LARGE"
