"""Which entries a replica may apply: causal completeness and Lamport clocks.

Entries reach a replica in any order (several peers, batches, retries). An
entry ``(writer, index)`` is *ready* once everything it depends on is
released: the writer's entries ``0..index-1``, and for every ``(other,
length)`` in its ``deps`` the first ``length`` entries of ``other``. It is
*valid* if its clock is greater than the clock of each entry it depends on
(its own previous entry and each dependency's last), so the Lamport order
never puts an entry before something it had seen. Valid ready entries are
released; entries not yet ready wait, bounded; duplicates are ignored.

An invalid entry *stops* its writer at its index: that writer's entries from
there on are never released (waiting ones are dropped, later offers ignored).
Reasons, as ``Refusal.code``:

================  ============================================================
``WRONG_DB``      the entry belongs to another database
``BAD_CLOCK``     ready, but its clock is not above what it depends on
``BAD_DEPS``      it depends on ``(w, n)`` with ``w`` stopped below ``n`` (or
                  on its own writer's later entries): it can never be ready
``BAD_PAYLOAD``   the caller could not decode it (:meth:`CausalGate.stop`)
================  ============================================================

``BAD_DEPS`` cascades: stopping a writer refuses every entry that depends
beyond the stop, which stops that entry's writer, and so on. What is released
and where writers stop depend only on the *set* of entries offered (and of
stops reported), never on the order they arrive in. When two reasons stop a
writer at the same index, the code is chosen by a fixed rank (``BAD_PAYLOAD``
first) so that this holds for the code too.

``TOO_MANY_WAITING`` is not a stop: an entry that would have to wait while
``max_waiting`` entries already do is turned away and may be offered again.

Cost: each waiting entry is filed under each requirement ``(writer, length)``
it misses; when a writer's released length grows to ``n`` only the entries
filed under ``n`` are touched, and an entry is examined once all are met. The
gate keeps one integer (the clock) per released entry. Sans-IO: no files, no
clock; the base feeds it what the logs hold.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

from ._entries import Entry, EntryId

__all__ = ["DEFAULT_MAX_WAITING", "CausalGate", "GateResult", "Refusal"]

#: Entries held while they wait for their dependencies.
DEFAULT_MAX_WAITING = 100_000

WRONG_DB = "WRONG_DB"
BAD_CLOCK = "BAD_CLOCK"
BAD_DEPS = "BAD_DEPS"
BAD_PAYLOAD = "BAD_PAYLOAD"
TOO_MANY_WAITING = "TOO_MANY_WAITING"

# Which code a stop keeps when two reasons stop a writer at the same index
# (lowest first). Only a caller's stop can coincide with an entry's own reason.
_RANK = {BAD_PAYLOAD: 0, WRONG_DB: 1, BAD_DEPS: 2, BAD_CLOCK: 3}


@dataclass(frozen=True, slots=True)
class Refusal:
    """An entry the gate will never release (or, ``TOO_MANY_WAITING``, not now)."""

    where: EntryId
    code: str
    reason: str


@dataclass(slots=True)
class GateResult:
    """What one call changed: entries released (in a causal order) and refused."""

    released: list[tuple[EntryId, Entry]] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)


class _Waiter:
    __slots__ = ("entry", "missing")

    def __init__(self, entry: Entry, missing: int) -> None:
        self.entry = entry
        self.missing = missing  # requirements (writer, length) not yet met


class CausalGate:
    """Releases entries once their dependencies are in, checking clocks and the db key."""

    def __init__(self, db: bytes, *, max_waiting: int = DEFAULT_MAX_WAITING) -> None:
        self.db = db
        self.max_waiting = max_waiting
        #: Refusals reported so far (``TOO_MANY_WAITING`` excluded).
        self.refused = 0
        self._clocks: dict[bytes, array[int]] = {}  # writer -> clock of each released entry
        self._max_clock = 0
        self._waiting: dict[EntryId, _Waiter] = {}
        # writer -> length -> waiting entries that need that many of writer's entries
        self._needs: dict[bytes, dict[int, dict[EntryId, None]]] = {}
        self._stops: dict[bytes, tuple[int, str]] = {}
        # Work of the call in progress, drained iteratively (no recursion).
        self._ready: list[EntryId] = []
        self._stopping: list[tuple[EntryId, str, str]] = []

    # -- reading ---------------------------------------------------------------

    def length(self, writer: bytes) -> int:
        """How many of ``writer``'s entries have been released."""
        clocks = self._clocks.get(writer)
        return len(clocks) if clocks is not None else 0

    def lengths(self) -> dict[bytes, int]:
        return {w: len(c) for w, c in self._clocks.items() if c}

    def clock(self, writer: bytes, index: int) -> int:
        """The clock of a released entry.

        Raises:
            IndexError: that entry has not been released.
        """
        clocks = self._clocks.get(writer)
        if clocks is None or not 0 <= index < len(clocks):
            raise IndexError(f"entry {index} of that writer has not been released")
        return clocks[index]

    @property
    def max_clock(self) -> int:
        """The highest clock released so far (0 if none)."""
        return self._max_clock

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def stopped(self) -> dict[bytes, tuple[int, str]]:
        """Writer -> (index, code): nothing from that index on will be released."""
        return dict(self._stops)

    # -- saving and restoring (a replica's fast restart) -------------------------

    def released_state(self) -> dict[bytes, tuple[array[int], tuple[int, str] | None]]:
        """Per writer: the clocks of its released entries (a copy) and its stop, if any."""
        writers = self._clocks.keys() | self._stops.keys()
        return {w: (array("q", self._clocks.get(w, ())), self._stops.get(w)) for w in writers}

    def restore_released(self, writer: bytes, clocks: array[int],
                         stop: tuple[int, str] | None) -> None:
        """Take a writer's released prefix as saved by :meth:`released_state`.

        Only on a gate that has not been fed yet: what was released before is
        trusted as it was (the caller checks the logs still hold it).

        Raises:
            ValueError: the gate was fed already, or the stop is inside the prefix.
        """
        if self._waiting or writer in self._clocks or writer in self._stops:
            raise ValueError("restore_released() is for a fresh gate, once per writer")
        if stop is not None and stop[0] < len(clocks):
            raise ValueError(f"a stop at {stop[0]} inside {len(clocks)} released entries")
        self._clocks[writer] = array("q", clocks)
        if clocks:
            self._max_clock = max(self._max_clock, max(clocks))
        if stop is not None:
            self._stops[writer] = stop

    # -- feeding ---------------------------------------------------------------

    def offer(self, where: EntryId, entry: Entry) -> GateResult:
        """Take one entry; report what became ready (in a causal order) and what was refused.

        Never raises for a bad entry: it is reported in ``refused``.
        """
        out = GateResult()
        self._offer(where, entry, out)
        return out

    def offer_many(self, items: Iterable[tuple[EntryId, Entry]]) -> GateResult:
        """Same as offering each item in turn, with the results merged."""
        out = GateResult()
        for where, entry in items:
            self._offer(where, entry, out)
        return out

    def stop(self, writer: bytes, index: int, code: str, reason: str = "") -> GateResult:
        """Stop ``writer`` at ``index`` (its payload there is bad, say; ``code`` says why).

        The result's ``refused`` holds this stop (unless the writer was already
        stopped at or below ``index``) and every entry refused by the cascade.

        Raises:
            ValueError: ``index`` is below the writer's released length (a
                released entry was valid: the caller is confused).
        """
        if index < self.length(writer):
            raise ValueError(
                f"cannot stop a writer at {index}: {self.length(writer)} entries released")
        out = GateResult()
        self._stopping.append((EntryId(writer, index), code, reason))
        self._drain(out)
        return out

    # -- the work --------------------------------------------------------------

    def _offer(self, where: EntryId, entry: Entry, out: GateResult) -> None:
        writer, index = where.writer, where.index
        if index < self.length(writer):
            return  # already released
        stop = self._stops.get(writer)
        if (stop is not None and index >= stop[0]) or where in self._waiting:
            return  # at or after a stop, or already waiting
        if entry.db != self.db:
            self._refuse(where, WRONG_DB, "the entry belongs to another database", out)
            return
        missing: list[tuple[bytes, int]] = []
        if self.length(writer) < index:
            missing.append((writer, index))
        for other, length in entry.deps:
            if other == writer:
                if length > index:
                    self._refuse(where, BAD_DEPS, "the entry depends on its own later entries",
                                 out)
                    return
                continue  # implied by its place in its own log
            other_stop = self._stops.get(other)
            if other_stop is not None and length > other_stop[0]:
                self._refuse(where, BAD_DEPS, _beyond(other_stop[0], length), out)
                return
            if self.length(other) < length:
                missing.append((other, length))
        if not missing:
            self._examine(where, entry, out)
            self._drain(out)
            return
        if len(self._waiting) >= self.max_waiting:
            # Only an entry that would have to wait is turned away: one that is
            # ready may be exactly what the waiting ones need. Not a stop.
            out.refused.append(Refusal(
                where, TOO_MANY_WAITING,
                f"{self.max_waiting} entries already wait for their dependencies"))
            return
        self._waiting[where] = _Waiter(entry, len(missing))
        for other, length in missing:
            self._needs.setdefault(other, {}).setdefault(length, {})[where] = None

    def _refuse(self, where: EntryId, code: str, reason: str, out: GateResult) -> None:
        self._stopping.append((where, code, reason))
        self._drain(out)

    def _drain(self, out: GateResult) -> None:
        """Release and stop until nothing more follows; iterative, however deep."""
        ready, stopping = self._ready, self._stopping
        while ready or stopping:
            if stopping:
                self._apply_stop(*stopping.pop(), out)
                continue
            where = ready.pop()
            waiter = self._waiting.pop(where, None)
            if waiter is not None:
                self._examine(where, waiter.entry, out)

    def _examine(self, where: EntryId, entry: Entry, out: GateResult) -> None:
        """Release a ready entry, or stop its writer if its clock is not above its floor."""
        writer, index = where.writer, where.index
        clocks = self._clocks.get(writer)
        floor = clocks[index - 1] if index else 0
        for other, length in entry.deps:
            floor = max(floor, self._clocks[other][length - 1])
        if entry.clock <= floor:
            self._stopping.append((where, BAD_CLOCK,
                                   f"clock {entry.clock} is not above {floor}, the clock "
                                   "of an entry it depends on"))
            return
        if clocks is None:
            clocks = self._clocks[writer] = array("q")
        clocks.append(entry.clock)
        self._max_clock = max(self._max_clock, entry.clock)
        out.released.append((where, entry))
        needs = self._needs.get(writer)
        if needs is None:
            return
        met = needs.pop(len(clocks), None)
        if not needs:
            del self._needs[writer]
        for waiting in met or ():
            waiter = self._waiting[waiting]
            waiter.missing -= 1
            if not waiter.missing:
                self._ready.append(waiting)

    def _apply_stop(self, where: EntryId, code: str, reason: str, out: GateResult) -> None:
        writer, index = where.writer, where.index
        old = self._stops.get(writer)
        if old is not None:
            if old[0] < index:
                return
            if old[0] == index:
                if _rank(code) < _rank(old[1]):
                    self._stops[writer] = (index, code)
                return
        self._stops[writer] = (index, code)
        self.refused += 1
        out.refused.append(Refusal(where, code, reason))
        waiter = self._waiting.get(where)
        if waiter is not None:  # a caller's stop where an entry waits
            self._drop(where, waiter)
        needs = self._needs.get(writer)
        if not needs:
            return
        # Everything filed as needing more than `index` of this writer: its own
        # later entries (dropped) and entries depending beyond the stop (refused).
        # After a first stop no key is above it, so a lower stop probes the gap.
        if old is not None and old[0] - index < len(needs):
            lengths = [n for n in range(index + 1, old[0] + 1) if n in needs]
        else:
            lengths = [n for n in needs if n > index]
        for length in lengths:
            for waiting in needs.pop(length):
                waiter = self._waiting.get(waiting)
                if waiter is None:
                    continue  # dropped earlier in this loop
                self._drop(waiting, waiter)
                if waiting.writer != writer:
                    self._stopping.append((waiting, BAD_DEPS, _beyond(index, length)))
        if not needs and self._needs.get(writer) is needs:
            del self._needs[writer]

    def _drop(self, where: EntryId, waiter: _Waiter) -> None:
        """Forget a waiting entry and every requirement it is filed under."""
        del self._waiting[where]
        requirements = [(where.writer, where.index)]
        requirements += [(o, n) for o, n in waiter.entry.deps if o != where.writer]
        for other, length in requirements:
            needs = self._needs.get(other)
            if needs is None:
                continue
            filed = needs.get(length)
            if filed is None or where not in filed:
                continue  # not filed there (that requirement was met, or never missing)
            del filed[where]
            if not filed:
                del needs[length]
                if not needs:
                    del self._needs[other]


def _rank(code: str) -> tuple[int, str]:
    return (_RANK.get(code, -1), code)


def _beyond(stop: int, length: int) -> str:
    return (f"the entry depends on {length} entries of a writer stopped at {stop}: "
            "it can never be ready")
