"""What a replica saves on the way out so that it restarts without replaying every entry.

Opening a replica feeds every stored entry through the causal gate (about 1 s
per 100,000 entries here, mostly decoding). On close, the base saves each
writer's released prefix (the clock of every released entry: 8 bytes each),
its stop if any, and the admin entries; the next open restores them and feeds
only what comes after.

The file is a cache, like the view: written atomically without fsync, and
ignored (with a warning) when it is unreadable, belongs to another database,
or no longer matches the logs: each writer's log must still hold, at the
saved length, a signed head with the saved chain hash. Anything else falls
back to the full replay. A replica that installed a checkpoint may have
released more of a writer than its copy of the log holds yet: the snapshot
then keeps the writer's signed head the checkpoint named (``pending``), which
the log must reach with the same chain hash (checked as it arrives).
"""

from __future__ import annotations

import logging
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path

import msgpack

from p2p.files import write_atomically
from p2p.keys import format_key
from p2p.log import Head, WriterLog

from ._causal import CausalGate
from ._entries import Entry, EntryId, decode_entry
from ._errors import BadEntry

__all__ = [
    "Snapshot",
    "WriterSnapshot",
    "load_snapshot",
    "restore_snapshot",
    "save_snapshot",
    "take_snapshot",
]

log = logging.getLogger(__name__)

FORMAT = 1


@dataclass(frozen=True, slots=True)
class WriterSnapshot:
    key: bytes
    #: The writer's log when saved: its length (always at a signed head) and chain hash.
    log_length: int
    log_head: bytes
    #: Clock of each released entry, in index order.
    clocks: array
    stop: tuple[int, str] | None
    #: The head an installed checkpoint named, while the log is shorter than ``clocks``.
    pending: Head | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    db: bytes
    writers: dict[bytes, WriterSnapshot]
    #: (writer, index, payload) of every released entry holding admin ops.
    admin_entries: list[tuple[bytes, int, bytes]]


def _little_endian(clocks: array) -> bytes:
    if sys.byteorder == "big":
        clocks = array("q", clocks)
        clocks.byteswap()
    return clocks.tobytes()


def _from_little_endian(data: bytes) -> array:
    clocks = array("q")
    clocks.frombytes(data)
    if sys.byteorder == "big":
        clocks.byteswap()
    return clocks


def save_snapshot(path: Path, snapshot: Snapshot) -> None:
    document = [
        FORMAT,
        snapshot.db,
        [[w.key, w.log_length, w.log_head, _little_endian(w.clocks),
          list(w.stop) if w.stop else None,
          [w.pending.length, w.pending.head_hash, w.pending.signature] if w.pending else None]
         for w in snapshot.writers.values()],
        [list(item) for item in snapshot.admin_entries],
    ]
    write_atomically(path, msgpack.packb(document, use_bin_type=True))


def load_snapshot(path: Path, db: bytes) -> Snapshot | None:
    """The saved state, or None (and why, in the log) if there is none usable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("crdt.snapshot_ignored path=%s reason=%s", path, exc)
        return None
    try:
        version, saved_db, writers, admin = msgpack.unpackb(data, raw=False)
        if version != FORMAT:
            raise ValueError(f"format {version!r}")
        if saved_db != db:
            raise ValueError("it belongs to another database")
        snapshot = Snapshot(db, {}, [])
        for key, length, head, clocks, stop, *rest in writers:
            if not (isinstance(key, bytes) and isinstance(head, bytes) and isinstance(clocks, bytes)
                    and isinstance(length, int) and len(clocks) % 8 == 0 and len(rest) <= 1):
                raise ValueError("a malformed writer")
            pending = rest[0] if rest else None
            snapshot.writers[key] = WriterSnapshot(
                key, length, head, _from_little_endian(clocks),
                (int(stop[0]), str(stop[1])) if stop else None,
                Head(int(pending[0]), bytes(pending[1]), bytes(pending[2])) if pending else None)
        for writer, index, payload in admin:
            if not (isinstance(writer, bytes) and isinstance(index, int)
                    and isinstance(payload, bytes)):
                raise ValueError("a malformed admin entry")
            snapshot.admin_entries.append((writer, index, payload))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        log.warning("crdt.snapshot_ignored path=%s reason=%s", path, exc)
        return None
    return snapshot


def take_snapshot(db: bytes, logs: dict[bytes, WriterLog], gate: CausalGate,
                  admin_entries: list[tuple[EntryId, Entry]],
                  pending: dict[bytes, Head] | None = None) -> Snapshot:
    """What to save of a base: the gate's released prefixes and the admin entries
    (``pending``: the heads of an installed checkpoint the logs have not reached)."""
    pending = pending or {}
    writers = {key: WriterSnapshot(key, logs[key].length, logs[key].head_hash, clocks, stop,
                                   pending.get(key) if len(clocks) > logs[key].length else None)
               for key, (clocks, stop) in gate.released_state().items() if key in logs}
    admin = [(where.writer, where.index,
              logs[where.writer].entry(where.index) if where.index < logs[where.writer].length
              else entry.encode())
             for where, entry in admin_entries]
    return Snapshot(db, writers, admin)


def restore_snapshot(
    path: Path, db: bytes, logs: dict[bytes, WriterLog], gate: CausalGate
) -> tuple[dict[bytes, int], list[tuple[EntryId, Entry]], dict[bytes, Head]] | None:
    """Restore a fresh ``gate`` from the snapshot at ``path`` if it still matches ``logs``.

    Returns where each writer's replay starts, the admin entries and the
    pending checkpoint heads, or None (nothing restored) when there is no
    usable snapshot.
    """
    snapshot = load_snapshot(path, db)
    if snapshot is None:
        return None

    def discard(reason: str) -> None:
        log.warning("crdt.snapshot_ignored path=%s reason=%s; replaying every entry",
                    path, reason)

    for saved in snapshot.writers.values():
        writer_log = logs.get(saved.key)
        if writer_log is None:
            return discard(f"no log for writer {format_key(saved.key)[:12]}")
        short = len(saved.clocks) > saved.log_length and not (
            saved.pending is not None and saved.pending.length >= len(saved.clocks)
            and writer_log.length == saved.log_length)
        if (writer_log.length < saved.log_length or short
                or (saved.log_length
                    and writer_log.head_hash_at(saved.log_length) != saved.log_head)):
            return discard(f"the log of {format_key(saved.key)[:12]} no longer holds "
                           "what was saved")
    admin_entries = []
    for writer, index, payload in snapshot.admin_entries:
        saved = snapshot.writers.get(writer)
        if saved is None or index >= len(saved.clocks) or (
                index < logs[writer].length and logs[writer].entry(index) != payload):
            return discard("an admin entry does not match its log")
        try:
            admin_entries.append((EntryId(writer, index), decode_entry(payload)))
        except BadEntry as exc:
            return discard(f"an admin entry does not decode: {exc}")
    for saved in snapshot.writers.values():
        gate.restore_released(saved.key, saved.clocks, saved.stop)
    pending = {key: saved.pending for key, saved in snapshot.writers.items()
               if saved.pending is not None and len(saved.clocks) > saved.log_length}
    return ({key: len(saved.clocks) for key, saved in snapshot.writers.items()}, admin_entries,
            pending)
