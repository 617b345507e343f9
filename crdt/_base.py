"""The base: every writer's log, the causal gate, admission and the view, on disk.

One storage folder holds one replica of one database::

    <storage>/db/database.json     {"format": 1, "bootstrap": "<hex key>"}
    <storage>/db/logs/<key>.log    one WriterLog per writer (ours among them)
    <storage>/db/view.sqlite       the view, a cache rebuildable from the logs

How an entry becomes part of the view, whether we wrote it or a peer sent it:

1. it is in its writer's log, the chain and the writer's signature checked
   (:meth:`WriterLog.append_batch` / :meth:`WriterLog.append_verified`);
2. it decodes, and the causal gate releases it once everything it depends on
   is in (an invalid entry stops its writer's log there, the same way on
   every replica);
3. admission says it counts (its writer was admitted and it lies within the
   writer's cap);
4. its ops are applied to the view in one SQLite transaction that also
   records how far each writer's log is applied.

The view only ever holds a prefix of each writer's counted entries, so after
a crash (the view is written without fsync) the base re-applies what the view
lacks; when admission shrinks (a writer removed with entries already applied)
the view is rebuilt from the logs. Blocking throughout: :class:`~._database.Database`
is the trio face.
"""

from __future__ import annotations

import functools
import heapq
import logging
import os
import sqlite3
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from p2p.keys import KeyPair, format_key
from p2p.log import GENESIS_HASH, FsyncPolicy, Head, WriterLog, chain_hash

from ._admission import Admission, compute_admission, has_admin_ops, plan_writer_change
from ._causal import TOO_MANY_WAITING, CausalGate, GateResult
from ._checkpoint import (
    Checkpoint,
    CheckpointHeader,
    CheckpointRefused,
    CheckpointState,
    CheckpointWriter,
    build_checkpoint,
)
from ._entries import Entry, EntryId, decode_entry
from ._errors import (
    BadEntry,
    InvalidBatch,
    UnknownWriter,
    WriteRefused,
    log_errors,
)
from ._operations import Op, wire_batch
from ._ops import ADMIN_OPS, validate_batch
from ._snapshot import restore_snapshot, save_snapshot, take_snapshot
from ._storage import Layout
from ._view import View, ViewMismatch

__all__ = ["MAX_ENTRY_BYTES", "MAX_RUN", "Base", "WriterChange", "WriterStatus"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: An entry must fit in one replication reply (a mux message is at most 512 KiB).
MAX_ENTRY_BYTES = 192 * 1024
#: Entries between two signed heads in our own log: the most a replica must
#: hold before it can verify and write what it fetched.
MAX_RUN = 1024
#: Entries decoded and applied per step when opening or rebuilding.
_CHUNK = 2048


@dataclass(frozen=True, slots=True)
class WriterStatus:
    """One writer's log as this replica sees it."""

    key: bytes
    length: int
    head_hash: bytes
    released: int  # entries the causal gate let through
    counted: int  # of those, the entries admission counts
    admin: bool
    admitted: bool
    cap: int | None
    stopped: tuple[int, str] | None  # (index, code) of the first invalid entry


@dataclass(frozen=True, slots=True)
class WriterChange:
    """What :meth:`Base.change_writer` did."""

    status: str  # added | already | removed
    #: For a removal: how many of the writer's entries go on counting.
    length: int | None
    #: The admin entry appended (None when nothing was to do).
    entry: EntryId | None


@dataclass
class ApplyReport:
    """What one append or ingest changed."""

    released: int = 0
    applied: int = 0
    refused: list[Any] = field(default_factory=list)
    admission_changed: bool = False
    rebuilt: bool = False


class Base:
    """One replica of one database. Build with :meth:`open`; :meth:`close` when done.

    Not thread-safe for writes: one append or ingest at a time (the trio
    wrapper serialises them). :meth:`read_view` may run in other threads
    while a write runs: it reads through a connection of its own (SQLite's
    WAL lets it see the last committed state without waiting for the writer).
    """

    def __init__(self, layout: Layout, keypair: KeyPair | None, bootstrap: bytes,
                 fsync: FsyncPolicy, read_only: bool) -> None:
        self.layout = layout
        self.storage = layout.root
        self.keypair = keypair
        #: Our writer key (None for a read-only look without an identity).
        self.key: bytes | None = keypair.public_key if keypair else None
        self.bootstrap = bootstrap
        self.fsync = fsync
        self.read_only = read_only
        self.logs: dict[bytes, WriterLog] = {}
        self.gate = CausalGate(bootstrap)
        self.admission = Admission(bootstrap, {})
        self.view: View | None = None
        self.view_lock = threading.RLock()
        self._opened = False  # fully opened for writing: close() saves a snapshot
        self._reader: View | None = None  # read_view's own connection
        self._reader_lock = threading.Lock()
        # Replication reads logs from worker threads while a write extends them.
        self._log_lock = threading.Lock()
        self._admin_entries: list[tuple[EntryId, Entry]] = []
        self._applied: dict[bytes, int] = {}
        # Per writer, the first entry the gate turned away because too many
        # entries were waiting: it and the rest of that log are offered again
        # from the log once the gate has room.
        self._backlog: dict[bytes, int] = {}
        #: Replicated batches refused because their writer is unknown.
        self.unknown_writer_refusals = 0
        self.rebuilds = 0
        #: Heads of an installed checkpoint our copies of the logs have not
        #: reached yet: each must hold its chain hash once they do.
        self._checkpoint_heads: dict[bytes, Head] = {}
        #: Checkpoints installed, and dropped because a log did not match one.
        self.checkpoints_installed = 0
        self.checkpoints_dropped = 0
        self._installing: CheckpointHeader | None = None  # between the two install steps

    # -- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, storage: str | os.PathLike[str], keypair: KeyPair | None, *,
             bootstrap: bytes | None = None,
             fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
             read_only: bool = False) -> Base:
        """Open the replica in ``storage``, creating it if absent.

        With no ``bootstrap`` and no database yet, a new database is created
        with ``keypair`` as its creator and first admin. With ``bootstrap``,
        the folder must hold that database or none (a new replica, read-only
        until an admin adds ``keypair``).

        ``read_only`` looks at an existing replica without changing a byte, also
        while a daemon has it open (``cosmicac db status``): no locks, a tail
        being written is left alone, the view is read as it is. ``keypair``
        may then be None.

        Raises:
            DatabaseMismatch: the folder holds another database.
            CrdtError: ``NO_DATABASE`` (read-only, nothing there) or
                ``BAD_METADATA``.
            LogCorrupted: a log is damaged (named with its offset).
            LogInUse: another process has this replica open.
        """
        layout = Layout.of(storage)
        if read_only:
            bootstrap = layout.read_bootstrap()
        else:
            if keypair is None:
                raise ValueError("a writable replica needs its key pair")
            bootstrap = layout.create_or_check(bootstrap or keypair.public_key,
                                               explicit=bootstrap is not None)
        base = cls(layout, keypair, bootstrap, fsync, read_only)
        try:
            base._open_logs()
            base._replay_logs()
            base._open_view()
        except BaseException:
            base.close()
            raise
        base._opened = not read_only
        return base

    def _open_logs(self) -> None:
        keys = set() if self.read_only else {self.key, self.bootstrap}
        for path, key in self.layout.log_files():
            if key is None:
                log.warning("crdt.stray_file path=%s (not <writer key hex>.log); ignored", path)
            else:
                keys.add(key)
        for key in sorted(keys):
            if key is not None and len(key) == 32:
                self._log_for(key)

    def _log_for(self, key: bytes) -> WriterLog:
        writer_log = self.logs.get(key)
        if writer_log is None:
            path = self.layout.log(key)
            with log_errors():
                if self.read_only:
                    writer_log = WriterLog.open(path, key, read_only=True)
                else:
                    writer_log = WriterLog.open(
                        path, key, self.keypair if key == self.key else None, fsync=self.fsync)
            if writer_log.recovery is not None and not self.read_only:
                log.warning("crdt.log_recovered writer=%s dropped_entries=%d reason=%s",
                            format_key(key)[:12], writer_log.recovery.dropped_entries,
                            writer_log.recovery.reason)
            self.logs[key] = writer_log
        return writer_log

    def _replay_logs(self) -> None:
        """Feed the stored entries to the gate, in clock order (so none has to wait).

        Only those after what the snapshot saved on the last close, if it still
        matches the logs (see :mod:`._snapshot`); all of them otherwise.
        """
        starts = self._restore_snapshot()
        streams = [self._decoded(key, writer_log, starts.get(key, 0), writer_log.length)
                   for key, writer_log in self.logs.items()]
        merged = heapq.merge(*streams, key=lambda item: (item[1].clock, item[0].writer))
        chunk: list[tuple[EntryId, Entry]] = []
        for item in merged:
            chunk.append(item)
            if len(chunk) >= _CHUNK:
                self._gate_offer(chunk)
                chunk = []
        if chunk:
            self._gate_offer(chunk)
        self.admission = compute_admission(self.bootstrap, self._admin_entries)

    def _restore_snapshot(self) -> dict[bytes, int]:
        """Restore the gate from the snapshot; return where each writer's replay starts."""
        restored = restore_snapshot(self.layout.snapshot, self.bootstrap, self.logs,
                                    self.gate)
        if restored is None:
            return {}
        starts, self._admin_entries, self._checkpoint_heads = restored
        return starts

    def _save_snapshot(self) -> None:
        try:
            save_snapshot(self.layout.snapshot, take_snapshot(
                self.bootstrap, self.logs, self.gate, self._admin_entries,
                self._checkpoint_heads))
        except OSError as exc:  # a cache: the next open replays everything instead
            log.warning("crdt.snapshot_not_saved reason=%s", exc)

    def _decoded(self, key: bytes, writer_log: WriterLog, start: int,
                 end: int) -> Iterator[tuple[EntryId, Entry]]:
        """Decode entries; an undecodable one stops its writer at the gate."""
        with log_errors():
            payloads = enumerate(writer_log.entries(start, end), start)
        for index, payload in _log_errors_raised(payloads):
            try:
                entry = decode_entry(payload)
            except BadEntry as exc:
                self._note(self.gate.stop(key, index, "BAD_PAYLOAD", str(exc)))
                return
            yield EntryId(key, index), entry

    def _gate_offer(self, items: Iterable[tuple[EntryId, Entry]]) -> list[tuple[EntryId, Entry]]:
        """Offer entries to the gate; then offer again what it had no room for, if it has now."""
        released = self._offer_once(items)
        progress = bool(released)
        # Bounded: every pass releases something or ends the loop.
        while self._backlog and progress:
            progress = False
            for writer, start in sorted(self._backlog.items()):
                del self._backlog[writer]
                writer_log = self.logs[writer]
                decoded = self._decoded(writer, writer_log, max(start, self.gate.length(writer)),
                                        writer_log.length)
                for chunk in _chunks(decoded, 256):
                    again = self._offer_once(chunk)
                    released += again
                    progress |= bool(again)
                    if writer in self._backlog:
                        break  # turned away again: the rest would only wait behind it
        return released

    def _offer_once(self, items: Iterable[tuple[EntryId, Entry]]) -> list[tuple[EntryId, Entry]]:
        result = self.gate.offer_many(items)
        self._note(result)
        for where, entry in result.released:
            if has_admin_ops(entry):
                self._admin_entries.append((where, entry))
        return result.released

    def _note(self, result: GateResult) -> None:
        for refusal in result.refused:
            where = refusal.where
            if refusal.code == TOO_MANY_WAITING:
                self._backlog[where.writer] = min(self._backlog.get(where.writer, where.index),
                                                  where.index)
                continue
            log.error("crdt.entry_refused writer=%s index=%d code=%s reason=%s",
                      format_key(where.writer)[:12], where.index, refusal.code, refusal.reason)

    def _open_view(self) -> None:
        path = self.layout.view
        if self.read_only:
            try:
                self.view = View.open_read_only(path, db=self.bootstrap)
            except (sqlite3.Error, ViewMismatch) as exc:
                log.info("crdt.view_unreadable path=%s reason=%s", path, exc)
                return
            self._applied = dict(self.view.applied_lengths())
            return
        try:
            self.view = View.open(path, db=self.bootstrap)
        except ViewMismatch as exc:
            log.warning("crdt.view_discarded reason=%s; rebuilding from the logs", exc)
            View.delete(path)
            self.view = View.open(path, db=self.bootstrap)
        self._applied = dict(self.view.applied_lengths())
        self._catch_up_view()
        self._reader = View.open_read_only(path, db=self.bootstrap)

    # -- the view -----------------------------------------------------------------

    def counted_lengths(self) -> dict[bytes, int]:
        """Per writer, how many entries count (released by the gate and admitted)."""
        return {key: n for key in self.logs
                if (n := self.admission.counted_length(key, self.gate.length(key)))}

    def _catch_up_view(self, fresh: dict[EntryId, Entry] | None = None, *,
                       fresh_validated: bool = False) -> int:
        """Bring the view to exactly the counted entries; rebuild if it holds too much.

        ``fresh``: entries at hand (just released), read from the logs otherwise;
        ``fresh_validated``: their ops were checked already (our own appends).
        """
        counted = self.counted_lengths()
        if any(n > counted.get(key, 0) for key, n in self._applied.items() if n):
            self.rebuild()
            return sum(counted.values())
        applied = 0
        for key, length in counted.items():
            start = self._applied.get(key, 0)
            if start >= length:
                continue
            pending: list[tuple[EntryId, Entry]] = []
            for index in range(start, length):
                where = EntryId(key, index)
                if fresh is None or where not in fresh:
                    break
                pending.append((where, fresh[where]))
            else:
                applied += self._apply(pending, validated=fresh_validated)
                continue
            # Not all at hand (opening, or a writer just admitted): read the log.
            applied += self._apply(pending, validated=fresh_validated)
            done = start + len(pending)
            batch: list[tuple[EntryId, Entry]] = []
            for item in self._decoded(key, self.logs[key], done, length):
                batch.append(item)
                if len(batch) >= _CHUNK:
                    applied += self._apply(batch)
                    batch = []
            applied += self._apply(batch)
        return applied

    def _apply(self, items: list[tuple[EntryId, Entry]], *, validated: bool = False) -> int:
        if not items:
            return 0
        assert self.view is not None
        with self.view_lock:
            self.view.apply(items, validated=validated)
        for where, _ in items:
            if where.index + 1 > self._applied.get(where.writer, 0):
                self._applied[where.writer] = where.index + 1
        return len(items)

    def rebuild(self) -> int:
        """Empty the view and apply every counted entry again; return how many.

        One transaction: queries see the old view until the new one is whole.
        """
        assert self.view is not None
        log.info("crdt.view_rebuild")
        applied = self._applied
        with self.view_lock, self.view.transaction():
            self.view.reset()
            self._applied = {}
            self.rebuilds += 1
            try:
                return self._catch_up_view()
            except BaseException:
                self._applied = applied  # rolled back with the view
                raise

    # -- writing our own entries --------------------------------------------------------

    def append(self, batch: Sequence[Sequence[Op | Sequence[Any]]], *,
               validated: bool = False) -> list[EntryId]:
        """Append one entry per element of ``batch`` (each a list of ops); durable on return.

        Ops are typed operations (:class:`~._operations.PutApiKey`...) or their
        wire arrays. ``validated``: the batch is in wire form and
        :func:`validate_batch` already passed for every op (the trio face
        checks each caller's ops before grouping them).

        Raises:
            WriteRefused: ``NOT_A_WRITER`` (no admin has added this replica's key
                yet), ``NOT_AN_ADMIN`` (admin ops need an admin), ``BAD_OP`` or
                ``TOO_LARGE``. Nothing is written.
        """
        if not validated:
            batch = wire_batch(batch)
            validate_batch(batch)
        self.check_role(batch)
        assert self.key is not None  # check_role refuses a replica without a key
        if not batch:
            return []
        own = self.logs[self.key]
        if self.gate.length(self.key) > own.length:
            # A checkpoint holds more of our log than this copy (its storage
            # was lost): appending now would fork it.
            raise WriteRefused(f"this replica's own log has {own.length} entries where the "
                               f"database holds {self.gate.length(self.key)}; wait until "
                               "replication brings the rest", code="LOG_BEHIND")
        deps = {key: n for key, n in self.gate.lengths().items() if key != self.key}
        clock = self.gate.max_clock
        entries = [Entry.create(self.bootstrap, clock + 1 + k, deps, ops)
                   for k, ops in enumerate(batch)]
        payloads = [entry.encode() for entry in entries]
        for payload in payloads:
            if len(payload) > MAX_ENTRY_BYTES:
                raise WriteRefused(f"an entry is at most {MAX_ENTRY_BYTES} bytes encoded, "
                                   f"this one is {len(payload)}", code="TOO_LARGE")
        start = own.length
        with self._log_lock, log_errors():
            own.append_batch(payloads, max_run=MAX_RUN)
        items = [(EntryId(self.key, start + k), entry) for k, entry in enumerate(entries)]
        self._take(items, validated=True)
        return [where for where, _ in items]

    def change_writer(self, action: str, writer: bytes, *, admin: bool = False) -> WriterChange:
        """Add (``add_writer``) or remove (``remove_writer``) a writer, as this admin.

        A removal keeps the entries of ``writer`` this replica has (every
        replica then ignores the rest, whenever they arrive).

        Raises:
            WriteRefused: ``NOT_AN_ADMIN``, ``REMOVED`` (re-adding a removed
                key), ``UNKNOWN_WRITER`` (removing a key never admitted).
        """
        if self.read_only or self.key is None:
            raise WriteRefused(f"{self.storage} was opened read-only", code="READ_ONLY")
        length = self.logs[writer].length if writer in self.logs else 0
        op = plan_writer_change(self.admission, self.key, action, writer, admin=admin,
                                length_seen=length)
        if op is None:
            return WriterChange("already" if action == "add_writer" else "removed",
                                self.admission.writers[writer].cap, None)
        (where,) = self.append([[op]])
        if action == "add_writer":
            return WriterChange("added", None, where)
        return WriterChange("removed", length, where)

    def check_writable(self, batch: Sequence[Sequence[Sequence[Any]]], *,
                       validated: bool = False) -> None:
        """Raise :class:`WriteRefused` if :meth:`append` would refuse ``batch`` (wire form).

        ``validated``: every op passed :func:`validate_op` already (typed
        operations do when built); only the writer's role is checked then."""
        if validated:
            if not all(batch):
                raise WriteRefused("an entry needs at least one op", code="BAD_OP")
        else:
            validate_batch(batch)
        self.check_role(batch)

    def check_role(self, batch: Sequence[Sequence[Sequence[Any]]]) -> None:
        """Raise :class:`WriteRefused` unless we may write (and admin ops need an admin)."""
        if self.read_only or self.key is None:
            raise WriteRefused(f"{self.storage} was opened read-only", code="READ_ONLY")
        if not self.admission.is_writer(self.key):
            raise WriteRefused(
                f"this replica ({format_key(self.key)}) is not a writer of database "
                f"{format_key(self.bootstrap)} yet: it can read, and an admin must add it "
                "(cosmicac db status shows who the admins are)", code="NOT_A_WRITER")
        for ops in batch:
            for op in ops:
                if op[0] in ADMIN_OPS and not self.admission.is_admin(self.key):
                    raise WriteRefused(f"{op[0]} needs an admin writer; "
                                       f"{format_key(self.key)} is not one",
                                       code="NOT_AN_ADMIN")

    # -- entries from peers -------------------------------------------------------------

    def ingest(self, writer: bytes, start: int, payloads: Sequence[bytes],
               head: Head) -> ApplyReport:
        """Store entries ``start``.. of ``writer``'s log a peer sent, and apply what they release.

        Entries we already have (another peer sent them meanwhile) are skipped.

        Raises:
            UnknownWriter: no admin ever admitted ``writer``; nothing stored.
            InvalidBatch: the entries do not extend our copy to the signed
                ``head`` (``BAD_LENGTH``, ``BAD_CHAIN``, ``BAD_SIGNATURE``);
                nothing stored.
        """
        if self.read_only:
            raise WriteRefused(f"{self.storage} was opened read-only", code="READ_ONLY")
        if not self.admission.knows(writer) and writer not in self.logs:
            self.unknown_writer_refusals += 1
            raise UnknownWriter(
                f"writer {format_key(writer)} was never admitted to database "
                f"{format_key(self.bootstrap)}; its entries are refused")
        writer_log = self._log_for(writer)
        have = writer_log.length
        if start > have:
            raise InvalidBatch(f"entries from {start} cannot extend a log of {have}",
                               code="BAD_LENGTH")
        if head.length <= have:
            return ApplyReport()
        previous_hash = writer_log.head_hash
        new = payloads[have - start:]
        with self._log_lock, log_errors():
            writer_log.append_verified(new, head)
        if writer in self._checkpoint_heads and not self._log_matches_checkpoint(
                writer, have, previous_hash, new):
            return self._forget_checkpoint()
        # Entries a checkpoint covered are released already: stored, not replayed.
        start = max(have, self.gate.length(writer))
        items = list(self._decoded(writer, writer_log, start, writer_log.length))
        return self._take(items)

    def _take(self, items: list[tuple[EntryId, Entry]], *,
              validated: bool = False) -> ApplyReport:
        """Gate new entries, update admission, bring the view up to date."""
        admin_before = len(self._admin_entries)
        released = self._gate_offer(items)
        report = ApplyReport(released=len(released))
        if len(self._admin_entries) != admin_before:
            admission = compute_admission(self.bootstrap, self._admin_entries)
            report.admission_changed = admission != self.admission
            self.admission = admission
        rebuilds = self.rebuilds
        report.applied = self._catch_up_view(dict(released), fresh_validated=validated)
        report.rebuilt = self.rebuilds != rebuilds
        return report

    # -- checkpoints --------------------------------------------------------------------

    def make_checkpoint(self, made_ms: int) -> Checkpoint:
        """A signed checkpoint of what this admin has applied (see :mod:`._checkpoint`).

        Raises:
            WriteRefused: ``NOT_AN_ADMIN``.
        """
        return self.checkpoint_state(made_ms)()

    def checkpoint_state(self, made_ms: int) -> Callable[[], Checkpoint]:
        """Copy what a checkpoint holds (between writes); return what encodes,
        compresses and signs it, which may run while writes go on.

        Raises:
            WriteRefused: ``NOT_AN_ADMIN``.
        """
        if self.keypair is None or self.key is None or not self.admission.is_admin(self.key):
            raise WriteRefused("only an admin makes checkpoints", code="NOT_AN_ADMIN")
        assert self.view is not None
        counted = self.counted_lengths()
        if any(self._applied.get(w, 0) != n for w, n in counted.items()):
            self._catch_up_view()
        writers, clocks = [], {}
        for key, (released_clocks, stop) in self.gate.released_state().items():
            head = self._head_covering(key, len(released_clocks))
            writers.append(CheckpointWriter(
                key, len(released_clocks), head.length if head else 0,
                head.head_hash if head else GENESIS_HASH, head.signature if head else b"",
                counted.get(key, 0), stop))
            clocks[key] = released_clocks
        admin = [(where.writer, where.index, self._admin_payload(where, entry))
                 for where, entry in self._admin_entries]
        with self.view_lock:
            tables = self.view.rows()
        return functools.partial(build_checkpoint, self.keypair, self.bootstrap, made_ms,
                                 writers, clocks, admin, tables)

    def _head_covering(self, key: bytes, released: int) -> Head | None:
        """The writer's signed head at or past ``released``: our log's last, or the
        installed checkpoint's while our copy is shorter."""
        writer_log = self.logs.get(key)
        head = writer_log.head if writer_log is not None else None
        if head is not None and head.length >= released:
            return head
        pending = self._checkpoint_heads.get(key)
        if pending is not None and pending.length >= released:
            return pending
        if released:
            raise CheckpointRefused(f"no signed head of {format_key(key)[:12]} covers its "
                                    f"{released} released entries", code="NOT_READY")
        return head

    def _admin_payload(self, where: EntryId, entry: Entry) -> bytes:
        writer_log = self.logs.get(where.writer)
        if writer_log is not None and where.index < writer_log.length:
            return writer_log.entry(where.index)
        return entry.encode()  # installed from a checkpoint, its log not here yet

    def install_checkpoint(self, header: CheckpointHeader, state: CheckpointState,
                           clocks: dict[bytes, array]) -> int:
        """Both steps of installing a checkpoint at once (see :meth:`install_checkpoint_state`)."""
        self.install_checkpoint_state(header, state)
        return self.install_checkpoint_clocks(header, state, clocks)

    def install_checkpoint_state(self, header: CheckpointHeader, state: CheckpointState) -> None:
        """First step of taking a checked checkpoint (see :mod:`._checkpoint`) as this
        replica's state: the view becomes the admin's (queries see it at once).

        Nothing may be written until :meth:`install_checkpoint_clocks` (or
        :meth:`abort_checkpoint`) ends the install: the trio face holds its
        write lock across both.

        Raises:
            CheckpointRefused: ``NOT_AN_ADMIN`` (its signer is not an admin by
                our admission), ``STALE`` (it is not ahead of us) or
                ``MISMATCH`` (it releases a writer past where ours stopped);
                nothing changed.
        """
        if self.read_only:
            raise WriteRefused(f"{self.storage} was opened read-only", code="READ_ONLY")
        assert self.view is not None and self._installing is None
        if not self.admission.is_admin(header.signer):
            raise CheckpointRefused(
                f"the checkpoint is signed by {format_key(header.signer)[:12]}, not an admin "
                "of this replica's database", code="NOT_AN_ADMIN")
        theirs = {w.key: w for w in header.writers}
        ours = self.gate.lengths()
        for key, length in ours.items():
            writer = theirs.get(key)
            if writer is None or writer.released < length:
                raise CheckpointRefused(
                    f"the checkpoint holds fewer entries of {format_key(key)[:12]} than this "
                    "replica", code="STALE")
        for key, (index, _) in self.gate.stopped.items():
            writer = theirs.get(key)
            if writer is not None and writer.released > index:
                raise CheckpointRefused(f"the checkpoint releases {format_key(key)[:12]} "
                                        "past where it stopped here", code="MISMATCH")
        if header.released - sum(ours.values()) <= 0:
            raise CheckpointRefused("the checkpoint is not ahead of this replica", code="STALE")
        applied = {w.key: w.applied for w in header.writers if w.applied}
        try:
            with self.view_lock:
                self.view.replace(state.tables, applied)
        except sqlite3.IntegrityError as exc:
            raise CheckpointRefused(f"malformed checkpoint: its rows break the view's "
                                    f"schema ({exc})", code="MALFORMED") from None
        self._installing = header
        self._applied = dict(applied)

    def install_checkpoint_clocks(self, header: CheckpointHeader, state: CheckpointState,
                                  clocks: dict[bytes, array]) -> int:
        """Second step: the gate restored as after replaying the checkpoint's entries,
        its admission, then what our logs hold past it replayed. Return the entries
        gained.

        Raises:
            CheckpointRefused: ``MISMATCH`` (its clocks differ from those we
                released); the install is undone (the view rebuilt from the logs).
        """
        assert self.view is not None and self._installing is header
        try:
            for key, (ours, _) in self.gate.released_state().items():
                if clocks[key][:len(ours)] != ours:
                    raise CheckpointRefused(f"the checkpoint's clocks of {format_key(key)[:12]} "
                                            "differ from those released here", code="MISMATCH")
            gained = header.released - sum(self.gate.lengths().values())
            gate = CausalGate(self.bootstrap)
            for writer in header.writers:
                gate.restore_released(writer.key, clocks[writer.key], writer.stop)
            with self.view_lock, self.view.transaction():
                self.gate, self._backlog = gate, {}
                self._admin_entries = list(state.admin_entries)
                self.admission = state.admission
                self._checkpoint_heads = {}
                for writer in header.writers:
                    self._log_for(writer.key)
                    if (writer.head is not None
                            and self.logs[writer.key].length < writer.log_length):
                        self._checkpoint_heads[writer.key] = writer.head
                # What our logs hold past the checkpoint is replayed now.
                self._replay_from({key: gate.length(key) for key in self.logs})
                self.admission = compute_admission(self.bootstrap, self._admin_entries)
                self._catch_up_view()
        except BaseException:
            self.abort_checkpoint()
            raise
        self._installing = None
        self.checkpoints_installed += 1
        log.info("crdt.checkpoint_installed signer=%s entries=%d gained=%d",
                 format_key(header.signer)[:12], header.released, gained)
        return gained

    def abort_checkpoint(self) -> None:
        """Undo a checkpoint's first step (its clocks never came, or did not fit):
        replay what our logs hold, as before it."""
        if self._installing is None:
            return
        self._installing = None
        self._forget_checkpoint()

    def _log_matches_checkpoint(self, writer: bytes, have: int, previous: bytes,
                                payloads: Sequence[bytes]) -> bool:
        """Our copy of ``writer`` just grew from ``have``: if it reached the
        installed checkpoint's head, does it hold the head's chain hash?"""
        head = self._checkpoint_heads[writer]
        writer_log = self.logs[writer]
        if writer_log.length < head.length:
            return True
        del self._checkpoint_heads[writer]
        for index in range(have, head.length):
            previous = chain_hash(previous, index, payloads[index - have])
        if previous == head.head_hash:
            return True
        log.error("crdt.checkpoint_dropped writer=%s reason=its log does not hold the head "
                  "the checkpoint named; replaying every entry", format_key(writer)[:12])
        return False

    def _forget_checkpoint(self) -> ApplyReport:
        """Drop what a checkpoint installed: replay every entry of our logs, rebuild the view."""
        assert self.view is not None
        self.checkpoints_dropped += 1
        self._checkpoint_heads = {}
        self.gate, self._backlog, self._admin_entries = CausalGate(self.bootstrap), {}, []
        self._replay_from({})
        self.admission = compute_admission(self.bootstrap, self._admin_entries)
        report = ApplyReport(admission_changed=True, rebuilt=True)
        report.applied = self.rebuild()
        return report

    def _replay_from(self, starts: dict[bytes, int]) -> None:
        """Offer the gate our logs' entries from ``starts`` (0 if absent), in clock order."""
        streams = [self._decoded(key, writer_log, starts.get(key, 0), writer_log.length)
                   for key, writer_log in self.logs.items()
                   if writer_log.length > starts.get(key, 0)]
        merged = heapq.merge(*streams, key=lambda item: (item[1].clock, item[0].writer))
        for chunk in _chunks(merged, _CHUNK):
            self._gate_offer(chunk)

    # -- reading ------------------------------------------------------------------------

    def lengths(self) -> dict[bytes, int]:
        """Our copy of each known writer's log: its length (what replication compares)."""
        return {key: writer_log.length for key, writer_log in self.logs.items()}

    def wanted(self) -> set[bytes]:
        """Writers whose logs we replicate: every key ever admitted."""
        return set(self.admission.writers) | {self.bootstrap}

    def writers(self) -> list[WriterStatus]:
        stopped = self.gate.stopped
        out = []
        for key in sorted(self.logs.keys() | self.admission.writers.keys()):
            writer_log = self.logs.get(key)
            grant = self.admission.writers.get(key)
            released = self.gate.length(key)
            out.append(WriterStatus(
                key=key,
                length=writer_log.length if writer_log else 0,
                head_hash=writer_log.head_hash if writer_log else bytes(32),
                released=released,
                counted=self.admission.counted_length(key, released),
                admin=bool(grant and grant.admin),
                admitted=self.admission.is_writer(key),
                cap=grant.cap if grant else None,
                stopped=stopped.get(key),
            ))
        return out

    def segment(self, writer: bytes, start: int, max_bytes: int) -> tuple[list[bytes], Head | None]:
        """Entries of ``writer``'s log from ``start`` for a peer (see :meth:`WriterLog.segment`).

        Raises:
            KeyError: we keep no log for ``writer``.
            IndexError: ``start`` is not below the log's length.
        """
        with self._log_lock, log_errors():
            return self.logs[writer].segment(start, max_bytes)

    def read_view(self, query: Any) -> Any:
        """Run ``query(view)`` on the last committed state (from any thread)."""
        reader = self._reader or self.view
        assert reader is not None
        with self._reader_lock:
            return query(reader)

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        if self._opened:
            self._opened = False
            self._save_snapshot()
        for writer_log in self.logs.values():
            writer_log.close()
        self.logs.clear()
        if self._reader is not None:
            with self._reader_lock:
                self._reader.close()
            self._reader = None
        if self.view is not None:
            with self.view_lock:
                self.view.close()
            self.view = None

    def __enter__(self) -> Base:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Base(db={format_key(self.bootstrap)[:12]}, me={format_key(self.key)[:12]}, "
                f"writers={len(self.logs)})")


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _log_errors_raised(items: Iterator[_T]) -> Iterator[_T]:
    """``items``, with the log's errors raised while reading them as the database's."""
    with log_errors():
        yield from items
