"""A daemon's hold on its storage folder: ``<storage>/LOCK``, flock'ed while it runs.

Two daemons on one folder would share an identity and write the same files.
The first to start takes an exclusive ``flock`` on ``LOCK`` and writes its pid
there; the second finds the lock taken and refuses, naming the folder and the
holder's pid. The kernel drops the lock when the holder's process ends, also
by a crash, so a stale file never blocks a restart (the pid inside is only
informative). flock is per open file: a second lock in the same process is
refused too.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..files import private_folder

__all__ = ["LOCK_FILE", "StorageInUse", "StorageLock", "StorageUnusable", "lock_storage"]

LOCK_FILE = "LOCK"


class StorageInUse(Exception):
    """Another process (or handle) holds the folder's lock.

    Attributes:
        path: the folder.
        pid: the holder's pid as it wrote it, or None if unreadable.
    """

    def __init__(self, path: Path, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(f"storage folder {path} is in use by {holder}; "
                         "give each daemon its own --storage")


class StorageUnusable(Exception):
    """The folder cannot be created or its lock file cannot be written."""

    def __init__(self, path: Path, cause: OSError) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"cannot use storage folder {path}: {cause.strerror or cause}")


class StorageLock:
    """The held lock; :meth:`release` (or process exit) lets another daemon in."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock (idempotent). The file stays: removing it would race."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> StorageLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def lock_storage(storage: str | os.PathLike[str]) -> StorageLock:
    """Create ``storage`` if needed (0700; an existing one is tightened) and lock it, or refuse.

    Returns:
        The held :class:`StorageLock` (a context manager).

    Raises:
        StorageInUse: another daemon holds it (names the folder and its pid).
        StorageUnusable: the folder or lock file cannot be made or written
            (read-only file system, permissions).
    """
    folder = Path(storage).resolve()
    try:
        private_folder(folder)  # every daemon's storage: owner only (p2p.files)
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StorageUnusable(folder, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _read_pid(fd)
        os.close(fd)
        raise StorageInUse(folder, pid) from None
    except OSError as exc:
        os.close(fd)
        raise StorageUnusable(folder, exc) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise StorageUnusable(folder, exc) from None
    return StorageLock(folder, fd)
