"""Who may write: a pure function of the admin entries (DESIGN.md §3.8).

The database's creator (its bootstrap key) is the first admin. An admin
admits writers with ``add_writer(key, admin)`` (``admin`` lets them admit and
remove writers in turn) and removes them with ``remove_writer(key, length)``:
from then on only that writer's first ``length`` entries count, on every
replica, whatever they receive later.

Every replica computes the same answer from the same *set* of admin entries,
whatever order they arrived in:

- Removals are taken in the database's total order (Lamport clock, writer
  key, index). A removal counts if its author is an admin and the removal
  lies within the author's own cap as fixed by the removals before it, so of
  two admins removing each other concurrently, the one ordered first wins
  unless the second removal sits within what the first one kept.
- A writer's cap is the smallest length any counted removal gave it. Caps
  only shrink: a removed key is never readmitted (a new key is).
- Additions count if their author is an admin and they lie within the
  author's cap. Caps are applied to additions retroactively, so a removed
  writer cannot admit an accomplice with a back-dated entry.
- Admission and caps depend on each other (removing an admin voids the
  additions beyond its cap, which may void removals those admins made). The
  computation repeats until the caps stop changing; caps only shrink, so it
  ends after at most one pass per removal.

Sans-IO and cheap: admin entries are few, so the base recomputes the whole
thing whenever one arrives.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ._entries import Entry, EntryId, order_key
from ._errors import WriteRefused

__all__ = ["Admission", "WriterGrant", "compute_admission", "has_admin_ops", "plan_writer_change"]

ADD_WRITER = "add_writer"
REMOVE_WRITER = "remove_writer"
_UNCAPPED = math.inf


@dataclass(frozen=True, slots=True)
class WriterGrant:
    """One writer as the admin entries describe it."""

    key: bytes
    admin: bool
    #: How many of its entries count; None while it has not been removed.
    cap: int | None
    #: The entry that first admitted it (None for the creator).
    added_by: EntryId | None


@dataclass(frozen=True, slots=True)
class Admission:
    """The writers of one database: who counts, and how far."""

    creator: bytes
    writers: dict[bytes, WriterGrant] = field(default_factory=dict)

    def counts(self, where: EntryId) -> bool:
        """True if the entry at ``where`` is part of the database."""
        grant = self.writers.get(where.writer)
        return grant is not None and (grant.cap is None or where.index < grant.cap)

    def counted_length(self, writer: bytes, length: int) -> int:
        """How many of the first ``length`` entries of ``writer`` count."""
        grant = self.writers.get(writer)
        if grant is None:
            return 0
        return length if grant.cap is None else min(length, grant.cap)

    def is_writer(self, key: bytes) -> bool:
        """True if ``key`` is admitted and not removed."""
        grant = self.writers.get(key)
        return grant is not None and grant.cap is None

    def is_admin(self, key: bytes) -> bool:
        grant = self.writers.get(key)
        return grant is not None and grant.admin and grant.cap is None

    def knows(self, key: bytes) -> bool:
        """True if ``key`` was ever admitted (its log is replicated, removed or not)."""
        return key in self.writers


def plan_writer_change(admission: Admission, me: bytes, action: str, writer: bytes, *,
                       admin: bool = False, length_seen: int = 0) -> tuple | None:
    """The op an admin appends to add or remove ``writer``; None if nothing is to do.

    Raises:
        WriteRefused: ``NOT_AN_ADMIN`` (``me`` is not one), ``REMOVED`` (a
            removed key is never readmitted), ``UNKNOWN_WRITER`` (removing a
            key that was never admitted), ``LAST_ADMIN`` (removing the only
            admin left, which would leave a database nobody can administer
            again: add another admin first).
    """
    if not admission.is_admin(me):
        raise WriteRefused(f"{me.hex()} is not an admin writer of this database",
                           code="NOT_AN_ADMIN")
    grant = admission.writers.get(writer)
    if action == ADD_WRITER:
        if grant is not None and grant.cap is not None:
            raise WriteRefused(f"{writer.hex()} was removed; a removed key is never admitted "
                               "again (give the replica a new identity)", code="REMOVED")
        if grant is not None and (grant.admin or not admin):
            return None
        return (ADD_WRITER, writer, admin)
    if action == REMOVE_WRITER:
        if grant is None:
            raise WriteRefused(f"{writer.hex()} is not a writer of this database",
                               code="UNKNOWN_WRITER")
        if grant.cap is not None:
            return None
        if grant.admin and not any(admission.is_admin(key) for key in admission.writers
                                   if key != writer):
            # A removal caps the writer at what we hold of its log, so every admin
            # this replica knows of stays one; only the last one is at stake here.
            # (Two replicas that each remove the other admin at the same time can
            # still end with none: the rule sees only this replica's admission.)
            raise WriteRefused(f"{writer.hex()} is the only admin of this database; removing "
                               "it would leave no one to add or remove writers (add another "
                               "admin first)", code="LAST_ADMIN")
        return (REMOVE_WRITER, writer, length_seen)
    raise ValueError(f"unknown action {action!r}")


def has_admin_ops(entry: Entry) -> bool:
    return any(op[0] in (ADD_WRITER, REMOVE_WRITER) for op in entry.ops)


def compute_admission(creator: bytes, entries: Iterable[tuple[EntryId, Entry]]) -> Admission:
    """The admission every replica holding these admin entries agrees on.

    ``entries`` may include entries without admin ops (they are skipped) and
    entries of writers that turn out not to be admitted (they do not count).
    Ops are assumed valid (the base checks them before anything is written);
    a malformed admin op is ignored the same way everywhere.
    """
    ordered = sorted(
        ((where, entry) for where, entry in entries if has_admin_ops(entry)),
        key=lambda item: order_key(item[1], item[0]),
    )
    caps: dict[bytes, float] = {}
    # Each pass either leaves the caps as they are (done) or lowers one;
    # a cap is lowered at most once per removal op, so this is bounded.
    for _ in range(1 + sum(_count_removals(entry) for _, entry in ordered)):
        admins, added = _admit(creator, ordered, caps)
        new_caps = _removals(ordered, admins, caps)
        if new_caps == caps:
            break
        caps = new_caps
    else:  # unreachable by the bound above; kept so `added` always matches `caps`
        _, added = _admit(creator, ordered, caps)
    grants: dict[bytes, WriterGrant] = {}
    for key, (admin, added_by) in added.items():
        cap = caps.get(key, _UNCAPPED)
        grants[key] = WriterGrant(key, admin, None if cap == _UNCAPPED else int(cap), added_by)
    return Admission(creator, grants)


def _count_removals(entry: Entry) -> int:
    return sum(op[0] == REMOVE_WRITER for op in entry.ops)


def _within(caps: dict[bytes, float], where: EntryId) -> bool:
    return where.index < caps.get(where.writer, _UNCAPPED)


def _admit(
    creator: bytes, ordered: list[tuple[EntryId, Entry]], caps: dict[bytes, float]
) -> tuple[set[bytes], dict[bytes, tuple[bool, EntryId | None]]]:
    """Additions under fixed caps: the least fixed point (it only grows)."""
    added: dict[bytes, tuple[bool, EntryId | None]] = {creator: (True, None)}
    changed = True
    while changed:
        changed = False
        for where, entry in ordered:
            author = added.get(where.writer)
            if author is None or not author[0] or not _within(caps, where):
                continue
            for op in entry.ops:
                if op[0] != ADD_WRITER or len(op) != 3:
                    continue
                key, admin = op[1], op[2] is True
                known = added.get(key)
                if known is None or (admin and not known[0]):
                    added[key] = (admin or (known is not None and known[0]),
                                  known[1] if known and known[1] else where)
                    changed = True
    admins = {key for key, (admin, _) in added.items() if admin}
    return admins, added


def _removals(
    ordered: list[tuple[EntryId, Entry]], admins: set[bytes], previous: dict[bytes, float]
) -> dict[bytes, float]:
    """Caps from the removals, taken in the total order; never above ``previous``."""
    caps = dict(previous)
    for where, entry in ordered:
        if where.writer not in admins or not _within(caps, where):
            continue
        for op in entry.ops:
            if op[0] != REMOVE_WRITER or len(op) != 3:
                continue
            key, length = op[1], op[2]
            if isinstance(length, int) and length < caps.get(key, _UNCAPPED):
                caps[key] = length
    return caps
