"""What one log entry says, and the order every replica gives entries.

A log (:mod:`._log`) stores opaque payloads; a database entry is one payload,
a msgpack array::

    [1, db, clock, deps, ops]

=========  ==================================================================
field      meaning
=========  ==================================================================
``1``      entry format version; anything else is refused
``db``     the database's bootstrap key (32 bytes): an entry signed for one
           database cannot be replayed into another
``clock``  Lamport clock, an integer >= 1, greater than the clock of every
           entry named in ``deps`` (checked by the base, which holds them)
``deps``   the heads the writer had seen: ``[[writer_key, length], ...]``,
           one per writer, sorted by key, lengths >= 1
``ops``    the operations, ``[[name, ...args], ...]`` (the view checks them)
=========  ==================================================================

The writer and the entry's index are not in the payload: they are the log it
sits in and its place there, both fixed by the log's signed chain.

Every replica orders entries by :func:`order_key` = (clock, writer key,
index): the Lamport clock respects causality (an entry comes after everything
it had seen), and the writer key then the index break ties the same way
everywhere. The view is built so that it does not depend on this order for
correctness (its operations commute); the order only decides tie-breaks such
as which of two concurrent register writes wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from ._errors import BadEntry
from ._operations import decode_op

__all__ = ["ENTRY_VERSION", "MAX_OPS", "Entry", "EntryId", "decode_entry", "order_key"]

ENTRY_VERSION = 1
#: Operations in one entry (a batch of usage increments, say).
MAX_OPS = 1024
#: Writers one entry may name in its dependencies.
MAX_DEPS = 256
_KEY_BYTES = 32
_MAX_INT = 2**63 - 1


@dataclass(frozen=True, slots=True)
class EntryId:
    """Where an entry sits: its writer's log and its index there."""

    writer: bytes
    index: int


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded entry; build with :meth:`create` (a writer) or :func:`decode_entry`."""

    db: bytes
    clock: int
    deps: tuple[tuple[bytes, int], ...]
    #: The ops in their wire form (``(name, *args)``); :meth:`typed_ops` decodes them.
    ops: tuple[tuple[Any, ...], ...]

    @classmethod
    def create(cls, db: bytes, clock: int, deps: dict[bytes, int],
               ops: Sequence[Sequence[Any]]) -> Entry:
        """A new entry; ``deps`` maps writer key -> length seen (zero lengths dropped).

        ``ops`` are typed operations (:class:`PutApiKey`...) or their wire arrays.

        Raises:
            BadEntry: a field breaks the rules above.
        """
        entry = cls(db, clock, tuple(sorted((k, n) for k, n in deps.items() if n)),
                    tuple(tuple(op.to_wire()) if hasattr(op, "to_wire") else tuple(op)
                          for op in ops))
        _check(entry)
        return entry

    def typed_ops(self) -> list[Any]:
        """The ops as typed operations (:class:`PutApiKey`...).

        Raises:
            InvalidOp: an op breaks the op rules (replicas skip such ops).
        """
        return [decode_op(op) for op in self.ops]

    def encode(self) -> bytes:
        return msgpack.packb(
            [ENTRY_VERSION, self.db, self.clock, [list(d) for d in self.deps],
             [list(op) for op in self.ops]],
            use_bin_type=True,
        )


def decode_entry(payload: bytes) -> Entry:
    """Decode and check one payload.

    Raises:
        BadEntry: ``DECODE_ERROR`` (not msgpack, or not the entry array),
            ``BAD_VERSION``, or the field's own code.
    """
    try:
        obj = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types; translate once, here
        raise BadEntry(f"entry is not msgpack: {exc}", code="DECODE_ERROR") from None
    if not isinstance(obj, list) or len(obj) != 5:
        raise BadEntry("an entry is a 5-item array", code="DECODE_ERROR")
    version, db, clock, deps, ops = obj
    if version != ENTRY_VERSION or type(version) is not int:
        raise BadEntry(f"unknown entry version {version!r}", code="BAD_VERSION")
    if not isinstance(deps, list) or not isinstance(ops, list):
        raise BadEntry("deps and ops are arrays", code="DECODE_ERROR")
    if not all(isinstance(d, list) and len(d) == 2 for d in deps):
        raise BadEntry("each dependency is [writer_key, length]", code="BAD_DEPS")
    if not all(isinstance(op, list) and op for op in ops):
        raise BadEntry("each op is a non-empty array", code="BAD_OPS")
    entry = Entry(db, clock, tuple((k, n) for k, n in deps), tuple(tuple(op) for op in ops))
    _check(entry)
    return entry


def order_key(entry: Entry, where: EntryId) -> tuple[int, bytes, int]:
    """The total order every replica uses: Lamport clock, then writer key, then index."""
    return (entry.clock, where.writer, where.index)


def _check(entry: Entry) -> None:
    if not (isinstance(entry.db, bytes) and len(entry.db) == _KEY_BYTES):
        raise BadEntry("db must be the 32-byte bootstrap key", code="BAD_DB")
    if type(entry.clock) is not int or not 1 <= entry.clock <= _MAX_INT:
        raise BadEntry(f"clock must be an integer in 1..2**63-1, got {entry.clock!r}",
                       code="BAD_CLOCK")
    if len(entry.deps) > MAX_DEPS:
        raise BadEntry(f"at most {MAX_DEPS} dependencies", code="BAD_DEPS")
    previous = None
    for key, length in entry.deps:
        if not (isinstance(key, bytes) and len(key) == _KEY_BYTES):
            raise BadEntry("a dependency's writer is a 32-byte key", code="BAD_DEPS")
        if type(length) is not int or not 1 <= length <= _MAX_INT:
            raise BadEntry("a dependency's length is an integer >= 1", code="BAD_DEPS")
        if previous is not None and key <= previous:
            raise BadEntry("dependencies are sorted by key, one per writer", code="BAD_DEPS")
        previous = key
    if len(entry.ops) > MAX_OPS:
        raise BadEntry(f"at most {MAX_OPS} ops per entry", code="BAD_OPS")
    for op in entry.ops:
        if not op or not isinstance(op[0], str):
            raise BadEntry("each op starts with its name", code="BAD_OPS")
