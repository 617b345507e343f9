"""The outbox backend: each message becomes one ``.eml`` file in a folder.

The default backend. The embedded deployment has no mail server; an operator
reads (or forwards) the files, and tests parse them. One file per message::

    <folder>/<time_ns, 20 digits>-<kind>-<key digest>.eml

The name sorts by time (zero-padded nanoseconds), says what the mail is, and
ends with a digest of the idempotency key: a second send of the same key finds
the first file and writes nothing (``SendResult.duplicate``).

Writes are atomic: the bytes go to a hidden ``.tmp-…`` file in the same folder,
are flushed to disk, and the file is renamed into place (``os.replace``, atomic
on POSIX within one file system). A reader never sees half a message; a crash
leaves at most a ``.tmp-`` file, which readers skip.

Shortcomings: the duplicate check lists the folder (fine up to some thousands
of files); nothing prunes old files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import trio

from p2p.files import PRIVATE_FILE_MODE, private_folder

from ._errors import EmailRejected, EmailUnavailable
from ._message import EmailMessage, SendResult, key_digest, to_mime

__all__ = ["OutboxSender"]

_BACKEND = "outbox"


def _remove(path: Path) -> None:
    """Remove a temp file if it is there; the error being reported matters more."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


class OutboxSender:
    """Write each message as an RFC 5322 ``.eml`` file into ``folder``.

    Args:
        folder: created on first send if missing.
        from_address: the ``From`` header of every message.
        clock_ns: the wall clock in nanoseconds (tests pass a fixed one).
    """

    def __init__(
        self,
        folder: Path | str,
        *,
        from_address: str = "cosmicac@localhost",
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.folder = Path(folder)
        self.from_address = from_address
        self._clock_ns = clock_ns

    async def send(self, message: EmailMessage) -> SendResult:
        """Write ``message`` to the folder; return the file name as its id.

        Raises:
            EmailRejected: the folder cannot be created or written (permissions,
                a file in its place): fix the path in the settings.
            EmailUnavailable: the disk is full or another transient OS error.
        """
        now_ns = self._clock_ns()
        try:
            raw = to_mime(message, self.from_address, date_s=now_ns / 1e9).as_bytes()
        except ValueError as exc:
            raise EmailRejected(f"from_address: {exc}", backend=_BACKEND) from exc
        return await trio.to_thread.run_sync(self._write, message, raw, now_ns)

    def _write(self, message: EmailMessage, raw: bytes, now_ns: int) -> SendResult:
        suffix = f"-{key_digest(message.idempotency_key)}.eml"
        name = f"{now_ns:020d}-{message.kind.value}{suffix}"
        tmp = self.folder / f".tmp-{name}"
        try:
            private_folder(self.folder)  # live reset and invitation links: owner only
            for existing in self.folder.iterdir():
                if existing.name.endswith(suffix) and not existing.name.startswith("."):
                    return SendResult(message_id=existing.name, backend=_BACKEND, duplicate=True)
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                              PRIVATE_FILE_MODE), "wb") as f:
                f.write(raw)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.folder / name)
        except (PermissionError, NotADirectoryError, FileExistsError, IsADirectoryError) as exc:
            _remove(tmp)
            raise EmailRejected(
                f"cannot write the outbox folder {self.folder}: {exc.strerror or exc}; "
                "point the outbox folder at a writable directory",
                backend=_BACKEND,
            ) from exc
        except OSError as exc:
            _remove(tmp)
            raise EmailUnavailable(
                f"cannot write to the outbox folder {self.folder}: {exc.strerror or exc} "
                "(a full disk?); free space and retry",
                backend=_BACKEND,
            ) from exc
        return SendResult(message_id=name, backend=_BACKEND)
