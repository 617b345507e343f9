"""Files a daemon or the CLI replaces whole: written aside, then renamed over.

One way for every small state or secret file (a daemon's kept settings, an
agent's process record, the CLI's sessions and configs): a reader sees the old
file or the new one, never half of either, and a crash leaves the old one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["sync_directory", "write_atomically"]


def write_atomically(path: Path, data: bytes, *, mode: int = 0o600,
                     durable: bool = False) -> None:
    """Replace ``path`` with ``data``, readable as ``mode`` says (owner only by default).

    The temporary file is created 0600 beside ``path`` under a unique name, so a
    secret is never readable by others even for a moment and two writers never
    share it; its bytes are fsynced before the rename. ``durable``: also fsync the
    folder, so the rename itself survives a power loss. Blocking: call it in a
    thread from trio. Raises OSError.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        try:
            os.write(fd, data)  # a regular file: one write takes all of it
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
