"""Files and folders the platform keeps: private, and replaced whole (re-exported by p2p.daemon).

Everything the platform keeps on disk is somebody's secret: identities, the
database's key inventory and usage, password hashes, live reset links, agents'
tokens. So every folder it makes is 0700 and every file 0600, set explicitly
at creation (never left to the umask, which is the operator's) and tightened
when an older version left a folder or file open (:func:`private_folder`,
:func:`private_file`). A folder the operator made himself and named as storage
is tightened too: storage is ours.

Small state or secret files (a daemon's kept settings, an agent's process
record, the CLI's sessions and configs) are replaced whole
(:func:`write_atomically`): a reader sees the old file or the new one, never
half of either, and a crash leaves the old one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["PRIVATE_FILE_MODE", "PRIVATE_FOLDER_MODE", "private_file", "private_folder",
           "sync_directory", "write_atomically"]

#: Owner only: what every folder the platform keeps is made and tightened to.
PRIVATE_FOLDER_MODE = 0o700
#: Owner read and write: every file the platform keeps.
PRIVATE_FILE_MODE = 0o600



def write_atomically(path: Path, data: bytes, *, mode: int = 0o600,
                     durable: bool = False, sync: bool = True) -> None:
    """Replace ``path`` with ``data``, readable as ``mode`` says (owner only by default).

    The temporary file is created 0600 beside ``path`` under a unique name, so a
    secret is never readable by others even for a moment and two writers never
    share it; its bytes are fsynced before the rename. ``durable``: also fsync the
    folder, so the rename itself survives a power loss. ``sync=False``: no fsync
    at all, for a file rewritten often that nothing needs after a crash (a
    status report every second: its fsyncs would stall the database's own, which
    share the file system's journal). Blocking: call it in a thread from trio.
    Raises OSError.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        try:
            os.write(fd, data)  # a regular file: one write takes all of it
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    if durable:
        sync_directory(path.parent)


def sync_directory(folder: Path) -> None:
    """fsync ``folder``: a rename or deletion in it survives a power loss."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def private_folder(folder: str | os.PathLike[str]) -> Path:
    """Create ``folder`` (and missing parents) owner-only, and tighten it if it exists.

    Parents made here are 0700 too; parents that exist are left as they are (a
    system folder such as /var/lib is not ours). Only the folder itself is
    tightened, and only if it is a folder of its own: a storage path naming a
    file or a device (``--storage /dev/null``) or a folder every user shares
    (sticky, ``--storage /tmp``) is refused, never chmod'ed. Blocking.

    Raises:
        NotADirectoryError: ``folder`` exists and is not a folder.
        PermissionError: ``folder`` is sticky (shared by every user).
        OSError: it cannot be made or tightened.

    Returns:
        The folder as a :class:`~pathlib.Path`.
    """
    path = Path(folder)
    missing = []
    for parent in (path, *path.parents):
        if parent.exists():
            break
        missing.append(parent)
    for made in reversed(missing):
        try:
            os.mkdir(made, PRIVATE_FOLDER_MODE)
        except FileExistsError:
            pass  # made by another process meanwhile: tightened below if it is ours
        else:
            os.chmod(made, PRIVATE_FOLDER_MODE)  # the umask may have cut bits; never added
    _tighten(path, PRIVATE_FOLDER_MODE, stat.S_ISDIR)
    return path


def private_file(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` empty and owner-only if absent; tighten it if it exists.

    For files that a library opens by name afterwards (SQLite creates its
    ``-wal`` and ``-shm`` files with the database file's mode, so making the
    database file 0600 first keeps all three private). Only a regular file is
    tightened: a path naming a folder, a device or a pipe is refused. Blocking.

    Raises:
        OSError: ``path`` exists and is not a regular file (``EINVAL``), or it
            cannot be made or tightened.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     PRIVATE_FILE_MODE)
    except FileExistsError:
        _tighten(path, PRIVATE_FILE_MODE, stat.S_ISREG)
    else:
        os.close(fd)
        os.chmod(path, PRIVATE_FILE_MODE)
    return path


def _tighten(path: Path, mode: int, is_kind: Callable[[int], bool]) -> None:
    """Take away every permission bit beyond ``mode``; never add one. Only on a path
    of the expected kind (never opened: opening a device can act on it): run as
    root, a chmod of ``/dev/null`` would cut every other user off from it."""
    info = os.stat(path)
    if not is_kind(info.st_mode):
        if is_kind is stat.S_ISDIR:
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(path))
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    if info.st_mode & stat.S_ISVTX:
        # A sticky folder is shared by design (/tmp, /var/tmp): tightening it would
        # break the host, and keeping secrets in it would share them.
        raise PermissionError(errno.EPERM, "a folder shared by every user (sticky, like "
                              "/tmp); give it a folder of its own inside", str(path))
    current = stat.S_IMODE(info.st_mode)
    if current & ~mode:
        os.chmod(path, current & mode)
