"""Sans-IO iterative Kademlia lookup (the ``ClosestPeersIter`` of rust-libp2p).

Theory of operation
-------------------
A lookup walks toward a 160-bit ``target`` key. It keeps every contact it has
heard of, ordered by XOR distance to the target, each in one state::

    NOT_CONTACTED --next_queries()--> WAITING --on_response()--> SUCCEEDED
                                         |
                                         +--on_failure()/expire()--> FAILED

At most ``alpha`` queries are in flight (Kademlia's α, paper §2.3). Each
response adds the responder's ``closer`` contacts one hop deeper than the
responder. The lookup is *finished* when the ``k`` closest contacts that have
not failed have all answered (paper: "the initiator has queried and gotten
responses from the k closest nodes it has seen"), when nothing is left to ask,
or when ``max_queries`` is reached (a bound against hostile networks that keep
handing out fresh contacts).

The core never sends anything: the driver asks :meth:`IterativeLookup.next_queries`
whom to query now, sends, and reports back with :meth:`on_response` or
:meth:`on_failure`; time comes in as ``now`` and :meth:`next_deadline` says when
a query in flight times out.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from operator import attrgetter

from ..errors import LocalProtocolError
from ._contact import ID_BYTES, Contact

__all__ = ["IterativeLookup", "LookupConfig", "LookupStatistics", "QueryState"]

#: Kademlia's k (paper §2.2), HyperDHT and BitTorrent's DHT use the same value.
DEFAULT_K = 20
#: Kademlia's α (paper §2.3): queries in flight at once.
DEFAULT_ALPHA = 3
#: A UDP request unanswered after this long counts as failed (HyperDHT: 1 s per try).
DEFAULT_REQUEST_TIMEOUT_S = 1.0
#: At most this many queries per lookup; beyond it the lookup ends with what it has.
DEFAULT_MAX_QUERIES = 250
#: Contacts remembered per lookup beyond the k closest (the rest are dropped).
_CANDIDATE_FACTOR = 8


@dataclass(frozen=True)
class LookupConfig:
    """Parameters of one lookup; validated when built."""

    k: int = DEFAULT_K
    """Kademlia's *k*: how many closest contacts the lookup settles on."""

    alpha: int = DEFAULT_ALPHA
    """Kademlia's *α*: queries in flight at once."""

    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    """Seconds before a query in flight counts as failed."""

    max_queries: int = DEFAULT_MAX_QUERIES
    """Upper bound on queries sent by one lookup."""

    def __post_init__(self) -> None:
        if self.k < 1 or self.alpha < 1 or self.max_queries < 1:
            raise LocalProtocolError("k, alpha and max_queries must be >= 1")
        if self.request_timeout_s <= 0:
            raise LocalProtocolError("request_timeout_s must be positive")


class QueryState(Enum):
    #: Known, not asked yet.
    NOT_CONTACTED = "not-contacted"
    #: Asked; the answer is awaited until its deadline.
    WAITING = "waiting"
    #: Answered.
    SUCCEEDED = "succeeded"
    #: Timed out, errored, or answered with garbage.
    FAILED = "failed"


@dataclass(slots=True)
class _Candidate:
    contact: Contact
    distance: int
    depth: int
    state: QueryState = QueryState.NOT_CONTACTED
    deadline: float = 0.0


_DISTANCE = attrgetter("distance")


@dataclass(frozen=True)
class LookupStatistics:
    queries: int
    responses: int
    failures: int
    #: Hops to the closest contact that answered (1 = a seed answered).
    hops: int
    finished: bool


class IterativeLookup:
    """One lookup of ``target``, seeded with the contacts the node already knows.

    Args:
        target: the 160-bit key looked up (a node id, or a topic's key).
        seeds: contacts to start from (usually the routing table's closest).
        config: k, α, timeout and bounds.
        local_id: our own id, never queried.
    """

    def __init__(
        self,
        target: bytes,
        seeds: Iterable[Contact],
        *,
        config: LookupConfig | None = None,
        local_id: bytes | None = None,
    ) -> None:
        if len(target) != ID_BYTES:
            raise LocalProtocolError(f"a lookup target is {ID_BYTES} bytes, got {len(target)}")
        self.target = target
        self.config = config or LookupConfig()
        self._target_int = int.from_bytes(target, "big")
        self._local_id = local_id
        self._candidates: dict[bytes, _Candidate] = {}
        # The same candidates kept sorted by distance (ids are unique, so are
        # distances): every next_queries() and finished check walks it from the
        # nearest, so it is kept in order on insert instead of sorted per call.
        self._order: list[_Candidate] = []
        # The WAITING ones (at most alpha): expiry and deadlines look only here.
        self._waiting: dict[bytes, _Candidate] = {}
        self._queries = 0
        self._responses = 0
        self._failures = 0
        # How far from the nearest `finished` found every candidate settled
        # (answered or failed), and how many of those answered. A state never
        # goes back, so the next check resumes there, unless a newcomer is
        # inserted inside that prefix (then it starts over). `finished` runs
        # twice per answer; without this it rescanned the k nearest each time.
        self._settled_prefix = 0
        self._settled_answered = 0
        for contact in seeds:
            self._add(contact, depth=0)

    # -- driving -------------------------------------------------------------

    def next_queries(self, now: float) -> list[Contact]:
        """Return the contacts to query now (marked WAITING until ``now + timeout``)."""
        self.expire(now)
        if self.finished:
            return []
        budget = min(
            self.config.alpha - len(self._waiting), self.config.max_queries - self._queries
        )
        chosen: list[Contact] = []
        if budget <= 0:
            return chosen
        for candidate in self._order:
            if candidate.state is QueryState.NOT_CONTACTED:
                candidate.state = QueryState.WAITING
                candidate.deadline = now + self.config.request_timeout_s
                self._waiting[candidate.contact.id] = candidate
                chosen.append(candidate.contact)
                self._queries += 1
                if len(chosen) == budget:
                    break
        return chosen

    def on_response(self, contact_id: bytes, closer: Iterable[Contact]) -> None:
        """Record an answer from ``contact_id`` and the closer contacts it named.

        Answers from contacts we did not ask (or asked and gave up on) still
        teach us contacts but do not change their state, so a late answer can
        neither resurrect a failed query nor be counted twice.
        """
        candidate = self._candidates.get(contact_id)
        depth = candidate.depth + 1 if candidate is not None else 1
        if candidate is not None and candidate.state is QueryState.WAITING:
            candidate.state = QueryState.SUCCEEDED
            del self._waiting[contact_id]
            self._responses += 1
        candidates, local_id = self._candidates, self._local_id
        for contact in closer:
            # Most contacts named are known by the second answer: skip them here.
            if contact.id not in candidates and contact.id != local_id:
                self._add(contact, depth=depth)

    def on_failure(self, contact_id: bytes) -> None:
        """Record that the query to ``contact_id`` failed (error, bad reply, timeout)."""
        candidate = self._candidates.get(contact_id)
        if candidate is not None and candidate.state is QueryState.WAITING:
            candidate.state = QueryState.FAILED
            del self._waiting[contact_id]
            self._failures += 1

    def expire(self, now: float) -> list[Contact]:
        """Fail every query whose deadline has passed; return those contacts."""
        expired = [c for c in self._waiting.values() if c.deadline <= now]
        for candidate in expired:
            candidate.state = QueryState.FAILED
            del self._waiting[candidate.contact.id]
            self._failures += 1
        return [candidate.contact for candidate in expired]

    def next_deadline(self) -> float | None:
        """When the earliest query in flight times out, or None if none is."""
        return min((c.deadline for c in self._waiting.values()), default=None)

    # -- results -------------------------------------------------------------

    @property
    def finished(self) -> bool:
        if self._queries >= self.config.max_queries and not self._waiting:
            return True
        k, order = self.config.k, self._order
        index, answered = self._settled_prefix, self._settled_answered
        while answered < k and index < len(order):
            state = order[index].state
            if state is QueryState.SUCCEEDED:
                answered += 1
            elif state is not QueryState.FAILED:
                break
            index += 1
        self._settled_prefix, self._settled_answered = index, answered
        if answered >= k:
            return True
        if index < len(order):
            return False  # a nearer candidate is not asked or not answered yet
        return not self._waiting

    def closest(self, count: int | None = None) -> list[Contact]:
        """The closest contacts that answered, nearest first (at most k by default)."""
        count = self.config.k if count is None else count
        result = []
        for candidate in self._order:
            if candidate.state is QueryState.SUCCEEDED:
                result.append(candidate.contact)
                if len(result) == count:
                    break
        return result

    def state_of(self, contact_id: bytes) -> QueryState | None:
        candidate = self._candidates.get(contact_id)
        return candidate.state if candidate else None

    def statistics(self) -> LookupStatistics:
        nearest = next((c for c in self._order if c.state is QueryState.SUCCEEDED), None)
        return LookupStatistics(
            queries=self._queries,
            responses=self._responses,
            failures=self._failures,
            hops=nearest.depth + 1 if nearest is not None else 0,
            finished=self.finished,
        )

    # -- internals -----------------------------------------------------------

    def _add(self, contact: Contact, *, depth: int) -> None:
        if contact.id == self._local_id or contact.id in self._candidates:
            return
        if len(contact.id) != ID_BYTES:
            return
        distance = int.from_bytes(contact.id, "big") ^ self._target_int
        candidate = _Candidate(contact, distance, depth)
        self._candidates[contact.id] = candidate
        position = bisect_left(self._order, distance, key=_DISTANCE)
        self._order.insert(position, candidate)
        if position < self._settled_prefix:
            self._settled_prefix = self._settled_answered = 0
        if len(self._order) > self.config.k * _CANDIDATE_FACTOR:
            # Bound memory: forget the farthest contact we never asked.
            for index in range(len(self._order) - 1, -1, -1):
                if self._order[index].state is QueryState.NOT_CONTACTED:
                    del self._candidates[self._order.pop(index).contact.id]
                    break
