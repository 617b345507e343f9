"""Looking at a replica's files without changing them: ``cosmicac db status|verify``.

Both work while a daemon has the replica open: logs are read without their
lock (a batch being written shows up as a tail, not as damage) and the view
through a read-only SQLite connection.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from p2p.keys import IDENTITY_FILE, load_keypair
from p2p.log import WriterLog, verify_file

from ._base import Base, WriterStatus
from ._entries import decode_entry
from ._errors import BadEntry, CrdtError, LogCorrupted, log_errors
from ._storage import Layout

__all__ = ["Problem", "StorageReport", "inspect_storage", "read_daemon_status",
           "verify_storage"]

#: A status file older than this is from a daemon that is gone.
STATUS_STALE_S = 10.0


@dataclass
class StorageReport:
    storage: Path
    bootstrap: bytes
    me: bytes | None
    writers: list[WriterStatus]
    #: Per writer, the bytes after its last signed head (a write in progress, or a crash).
    tails: dict[bytes, int]
    view_counts: dict[str, int] | None
    view_applied: dict[bytes, int]
    daemon_pid: int | None
    peers: list[dict] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Problem:
    """Something ``verify`` found; ``fatal`` problems make it exit 1."""

    fatal: bool
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def inspect_storage(storage: str | os.PathLike[str]) -> StorageReport:
    """Read a replica's state from its files, as the replica itself would compute it.

    Raises:
        CrdtError: no database, unreadable metadata, or a damaged log
            (:class:`LogCorrupted`, named with its offset).
    """
    me = _my_key(Path(storage))
    with Base.open(storage, None, read_only=True) as base:
        tails = {key: writer_log.recovery.dropped_bytes
                 for key, writer_log in base.logs.items() if writer_log.recovery}
        counts = base.view.counts() if base.view else None
        applied = base.view.applied_lengths() if base.view else {}
        writers = base.writers()
        bootstrap = base.bootstrap
    daemon = read_daemon_status(Path(storage))
    pid, peers = (daemon["pid"], list(daemon.get("peers", []))) if daemon else (None, [])
    return StorageReport(Path(storage), bootstrap, me, writers, tails, counts, applied, pid,
                         peers)


def _my_key(storage: Path) -> bytes | None:
    if not (storage / IDENTITY_FILE).exists():
        return None
    try:
        return load_keypair(storage).public_key
    except Exception:  # shown as unknown; `cosmicac keys show` explains the problem
        return None


def read_daemon_status(storage: str | os.PathLike[str]) -> dict | None:
    """What a daemon running on ``storage`` reports (pid, address, peers), or None.

    None when no daemon wrote the status file, it is older than STATUS_STALE_S
    or its process is gone.
    """
    try:
        document = json.loads(Layout.of(storage).status.read_text())
        document["pid"] = int(document["pid"])
        fresh = time.time() - float(document["updated"]) < STATUS_STALE_S
        os.kill(document["pid"], 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return document if fresh else None


def verify_storage(storage: str | os.PathLike[str]) -> list[Problem]:
    """Check every log (records, chain, signatures), every entry, and the view.

    Returns every problem found; fatal ones first. A tail being written (or
    left by a crash) and entries the database refuses are reported but not
    fatal: neither is damage, and opening the replica deals with both.
    """
    layout = Layout.of(storage)
    problems: list[Problem] = []
    try:
        layout.read_bootstrap()
    except CrdtError as exc:
        return [Problem(True, str(layout.meta), exc.message)]
    for path, key in layout.log_files():
        if key is None:
            problems.append(Problem(True, str(path), "not named <64 hex writer key>.log"))
            continue
        try:
            with log_errors():
                report = verify_file(path, key)
        except LogCorrupted as exc:
            problems.append(Problem(True, f"{path} at byte {exc.offset}",
                                    f"{exc.code}: {exc.message.split(': ', 1)[-1]}"))
            continue
        except OSError as exc:
            problems.append(Problem(True, str(path), f"unreadable: {exc.strerror or exc}"))
            continue
        if report.tail is not None:
            problems.append(Problem(False, f"{path} at byte {report.tail.offset}",
                                    f"{report.tail.dropped_bytes} bytes after the last signed "
                                    f"head ({report.tail.reason}); a write in progress, or a "
                                    "crash: the next open cuts them"))
        with log_errors(), WriterLog.open(path, key, read_only=True) as writer_log:
            for index, payload in enumerate(writer_log.entries()):
                try:
                    decode_entry(payload)
                except BadEntry as exc:
                    problems.append(Problem(False, f"{path} entry {index}",
                                            f"{exc.code}: {exc.message}; replicas ignore this "
                                            "writer's entries from here on"))
                    break
    view = layout.view
    if view.exists():
        try:
            connection = sqlite3.connect(f"file:{view}?mode=ro", uri=True)
            try:
                result = connection.execute("PRAGMA quick_check").fetchone()[0]
            finally:
                connection.close()
            if result != "ok":
                problems.append(Problem(False, str(view), f"damaged ({result}); it is a cache: "
                                        "delete it and the next open rebuilds it from the logs"))
        except sqlite3.Error as exc:
            problems.append(Problem(False, str(view), f"unreadable ({exc}); delete it and the "
                                    "next open rebuilds it from the logs"))
    problems.sort(key=lambda problem: not problem.fatal)
    return problems
