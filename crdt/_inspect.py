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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from p2p.keys import IDENTITY_FILE, load_keypair

from ._admission import compute_admission, has_admin_ops
from ._entries import EntryId, decode_entry
from ._errors import BadEntry, CrdtError, LogCorrupted
from ._log import Recovery, WriterLog, verify_file
from ._view import View

__all__ = ["Problem", "StorageReport", "WriterReport", "inspect_storage", "verify_storage"]

#: A status file older than this is from a daemon that is gone.
STATUS_STALE_S = 10.0


@dataclass(frozen=True, slots=True)
class WriterReport:
    key: bytes
    length: int
    head_hash: bytes
    admin: bool
    admitted: bool
    cap: int | None
    tail: Recovery | None


@dataclass
class StorageReport:
    storage: Path
    bootstrap: bytes
    me: bytes | None
    writers: list[WriterReport]
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


def read_bootstrap(folder: Path) -> bytes:
    """The database key in ``<storage>/db/database.json``.

    Raises:
        CrdtError: ``NO_DATABASE`` or ``BAD_METADATA``.
    """
    path = folder / "database.json"
    try:
        meta = json.loads(path.read_text())
        key = bytes.fromhex(meta["bootstrap"])
    except FileNotFoundError:
        raise CrdtError(f"{folder.parent} holds no database ({path} is missing)",
                        code="NO_DATABASE") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CrdtError(f"{path} is unreadable: {exc}", code="BAD_METADATA") from None
    if len(key) != 32:
        raise CrdtError(f"{path}: the bootstrap key is not 32 bytes", code="BAD_METADATA")
    return key


def _log_files(folder: Path) -> Iterator[tuple[Path, bytes | None]]:
    for path in sorted((folder / "logs").glob("*.log")):
        try:
            key = bytes.fromhex(path.stem)
        except ValueError:
            key = None
        yield path, key if key is not None and len(key) == 32 else None


def inspect_storage(storage: str | os.PathLike[str]) -> StorageReport:
    """Read a replica's state from its files (logs fully verified on the way).

    Raises:
        CrdtError: no database, unreadable metadata, or a damaged log
            (:class:`LogCorrupted`, named with its offset).
    """
    folder = Path(storage) / "db"
    bootstrap = read_bootstrap(folder)
    logs: dict[bytes, WriterLog] = {}
    admin_entries = []
    try:
        for path, key in _log_files(folder):
            if key is None:
                continue
            writer_log = logs[key] = WriterLog.open(path, key, read_only=True)
            for index, payload in enumerate(writer_log.entries()):
                try:
                    entry = decode_entry(payload)
                except BadEntry:
                    break  # the base stops this writer here too
                if has_admin_ops(entry):
                    admin_entries.append((EntryId(key, index), entry))
        admission = compute_admission(bootstrap, admin_entries)
        writers = []
        for key in sorted(logs.keys() | admission.writers.keys()):
            grant = admission.writers.get(key)
            writer_log = logs.get(key)
            writers.append(WriterReport(
                key=key,
                length=writer_log.length if writer_log else 0,
                head_hash=writer_log.head_hash if writer_log else bytes(32),
                admin=bool(grant and grant.admin),
                admitted=admission.is_writer(key),
                cap=grant.cap if grant else None,
                tail=writer_log.recovery if writer_log else None,
            ))
    finally:
        for writer_log in logs.values():
            writer_log.close()
    counts, applied = _view_state(folder / "view.sqlite")
    pid, peers = _daemon_status(folder / "status.json")
    return StorageReport(Path(storage), bootstrap, _my_key(Path(storage)), writers, counts,
                         applied, pid, peers)


def _my_key(storage: Path) -> bytes | None:
    if not (storage / IDENTITY_FILE).exists():
        return None
    try:
        return load_keypair(storage).public_key
    except Exception:  # shown as unknown; `cosmicac keys show` explains the problem
        return None


def _view_state(path: Path) -> tuple[dict[str, int] | None, dict[bytes, int]]:
    if not path.exists():
        return None, {}
    try:
        view = View.open_read_only(path)
    except (sqlite3.Error, CrdtError):
        return None, {}
    try:
        return view.counts(), view.applied_lengths()
    finally:
        view.close()


def _daemon_status(path: Path) -> tuple[int | None, list[dict]]:
    """The peers a running daemon reported, if its status file is fresh."""
    try:
        document = json.loads(path.read_text())
        pid = int(document["pid"])
        fresh = time.time() - float(document["updated"]) < STATUS_STALE_S
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None, []
    return (pid, list(document.get("peers", []))) if fresh else (None, [])


def verify_storage(storage: str | os.PathLike[str]) -> list[Problem]:
    """Check every log (records, chain, signatures), every entry, and the view.

    Returns every problem found; fatal ones first. A tail being written (or
    left by a crash) and entries the database refuses are reported but not
    fatal: neither is damage, and opening the replica deals with both.
    """
    folder = Path(storage) / "db"
    problems: list[Problem] = []
    try:
        read_bootstrap(folder)
    except CrdtError as exc:
        return [Problem(True, str(folder / "database.json"), exc.message)]
    for path, key in _log_files(folder):
        if key is None:
            problems.append(Problem(True, str(path), "not named <64 hex writer key>.log"))
            continue
        try:
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
        with WriterLog.open(path, key, read_only=True) as writer_log:
            for index, payload in enumerate(writer_log.entries()):
                try:
                    decode_entry(payload)
                except BadEntry as exc:
                    problems.append(Problem(False, f"{path} entry {index}",
                                            f"{exc.code}: {exc.message}; replicas ignore this "
                                            "writer's entries from here on"))
                    break
    view = folder / "view.sqlite"
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
