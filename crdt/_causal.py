"""Which entries a replica may apply: causal completeness and Lamport clocks.

Entries reach a replica in any order (several peers, batches, retries). An
entry is *ready* once everything it depends on is: the entries before it in
its own log, and for every ``(writer, length)`` in its ``deps`` the first
``length`` entries of that writer. It is accepted only if its clock is
greater than the clock of each entry it depends on (its own previous entry and
each dependency's last), so the Lamport order never puts an entry before
something it had seen. Entries not yet ready wait, bounded; duplicates are
dropped. Sans-IO: no files, no clock; the base feeds it what the logs hold.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ._entries import Entry, EntryId
from ._errors import BadEntry

__all__ = ["CausalGate"]

#: Entries held while they wait for their dependencies.
DEFAULT_MAX_WAITING = 100_000


@dataclass
class _Writer:
    clocks: list[int]  # clock of each accepted entry, by index


class CausalGate:
    """Releases entries once their dependencies are in, checking clocks and the db key."""

    def __init__(self, db: bytes, *, max_waiting: int = DEFAULT_MAX_WAITING) -> None:
        self.db = db
        self.max_waiting = max_waiting
        self._writers: dict[bytes, _Writer] = defaultdict(lambda: _Writer([]))
        self._waiting: dict[EntryId, Entry] = {}
        self.refused = 0

    def length(self, writer: bytes) -> int:
        """How many of ``writer``'s entries have been released."""
        writer_state = self._writers.get(writer)
        return len(writer_state.clocks) if writer_state else 0

    def lengths(self) -> dict[bytes, int]:
        return {w: len(s.clocks) for w, s in self._writers.items() if s.clocks}

    def offer(self, where: EntryId, entry: Entry) -> list[tuple[EntryId, Entry]]:
        """Take one entry; return every entry that became ready, in a causal order.

        Raises:
            BadEntry: ``WRONG_DB`` or ``BAD_CLOCK`` (a clock not above what the
                entry depends on); ``TOO_MANY_WAITING`` at the bound. The
                entry is not kept.
        """
        if entry.db != self.db:
            self.refused += 1
            raise BadEntry("the entry belongs to another database", code="WRONG_DB")
        if where.index < self.length(where.writer) or where in self._waiting:
            return []  # a duplicate: already released or waiting
        if len(self._waiting) >= self.max_waiting and self._ready(where, entry) is None:
            # Only an entry that would have to wait is turned away: one that is
            # ready may be exactly what the waiting ones need.
            raise BadEntry(f"{self.max_waiting} entries already wait for their dependencies",
                           code="TOO_MANY_WAITING")
        self._waiting[where] = entry
        released: list[tuple[EntryId, Entry]] = []
        progress = True
        while progress:  # bounded: each pass releases at least one waiting entry
            progress = False
            for candidate, waiting in list(self._waiting.items()):
                verdict = self._ready(candidate, waiting)
                if verdict is None:
                    continue
                del self._waiting[candidate]
                if verdict is False:
                    self.refused += 1
                    if candidate == where:
                        raise BadEntry(
                            "the entry's clock is not above the clock of an entry it depends on",
                            code="BAD_CLOCK")
                    continue
                self._writers[candidate.writer].clocks.append(waiting.clock)
                released.append((candidate, waiting))
                progress = True
        return released

    def _ready(self, where: EntryId, entry: Entry) -> bool | None:
        """None: dependencies missing; False: present but the clock is wrong; True: go."""
        if where.index != self.length(where.writer):
            return None
        floor = 0
        if where.index:
            floor = self._writers[where.writer].clocks[where.index - 1]
        for writer, length in entry.deps:
            if self.length(writer) < length:
                return None
            floor = max(floor, self._writers[writer].clocks[length - 1])
        return entry.clock > floor

    @property
    def waiting(self) -> int:
        return len(self._waiting)
