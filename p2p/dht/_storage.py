"""The bounded store of peer records a DHT node keeps for others.

Theory of operation
-------------------
A node stores the records announced to it: ``topic -> {public_key -> record}``,
at most one record per announcer key per topic. The node verifies each record
(:func:`~p2p.dht._records.verify_record`) and the write token *before* calling
:meth:`RecordStore.put`; the store itself checks no signature but accepts any
input without raising, so a bug upstream cannot crash it.

Rules (DESIGN.md §3.4, holepunch.md §1.6):

* **seq**: for the same key, an incoming record replaces the stored one only if
  its ``seq`` is strictly higher. Equal or lower is ``IGNORED_OLDER_SEQ``: a
  replayed record is never accepted back, and an announcer must bump ``seq`` on
  every refresh. The comparison holds even against a stored record that has
  expired but not yet been swept.
* **lifetime**: a record lives until its ``expires`` (unix seconds). A record that
  has already expired, or claims more than ``max_ttl_s`` (+ the clock-skew
  allowance) ahead, is ``REFUSED_INVALID``, so nothing sits in the store longer
  than ``max_ttl_s + CLOCK_SKEW_S``.
* **unannounce**: :meth:`RecordStore.remove` takes the ``seq`` the signed
  UNANNOUNCE retires and removes the stored record only if that seq is not
  lower, so an old UNANNOUNCE cannot remove a newer announce.
* **ordering**: :meth:`RecordStore.get` returns the newest records first, where
  newest means the latest ``expires`` (announcers set ``expires = now + ttl``,
  so this is the most recently refreshed), then the highest ``seq``, then the key.

Bounds (STYLE.md: every table has one, and says what happens there):

* ``max_topics`` topics: a record for a new topic is ``REFUSED_TOPICS_FULL``.
  The store does not sweep on that path (a full sweep per refused datagram
  would make flooding expensive); the node calls :meth:`RecordStore.expire`
  periodically, which frees topics whose records have all expired.
* ``max_records_per_topic`` records per topic: a record from a new key evicts
  the record that expires soonest (after dropping the topic's expired records)
  **only if** the incoming one expires later; otherwise ``REFUSED_TOPIC_FULL``.
  Rationale: among valid records the one expiring soonest is the stalest (its
  announcer refreshed longest ago); an attacker with many keys can displace
  honest records only by announcing fresher ones, and honest announcers
  re-enter at their next refresh. Refusing outright instead would let anyone
  who fills a topic first lock it for up to ``max_ttl_s``.

Worst case the store holds ``max_topics * max_records_per_topic`` records
(640,000 with the defaults, a few hundred MB); there is no global record
bound yet beyond that product.

Upstream keeps one record cache of 65,536 entries with a 20-minute maxAge and
returns at most 20 records per lookup, the default ``limit`` here.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from ._errors import DhtUsageError
from ._records import CLOCK_SKEW_S, MAX_RECORD_TTL_S, TOPIC_BYTES, PeerRecord

__all__ = [
    "DEFAULT_LOOKUP_LIMIT",
    "DEFAULT_MAX_RECORDS_PER_TOPIC",
    "DEFAULT_MAX_TOPICS",
    "PutResult",
    "RecordStore",
    "StoreStatistics",
]

#: Topics a node stores for at most (upstream: one 65,536-entry cache in all).
DEFAULT_MAX_TOPICS = 10_000
#: Records kept per topic (upstream lookups return 20; we keep spares).
DEFAULT_MAX_RECORDS_PER_TOPIC = 64
#: Records returned per lookup reply (upstream: 20).
DEFAULT_LOOKUP_LIMIT = 20


class PutResult(enum.Enum):
    """What :meth:`RecordStore.put` did with a record."""

    #: The record is stored; its key had no record under the topic.
    STORED = "stored"
    #: The record replaced the key's record with a lower seq.
    REPLACED = "replaced"
    #: The key already has a record with the same or a higher seq; nothing changed.
    IGNORED_OLDER_SEQ = "ignored_older_seq"
    #: The store holds ``max_topics`` topics and this one is new.
    REFUSED_TOPICS_FULL = "refused_topics_full"
    #: The topic holds ``max_records_per_topic`` records that all outlive this one.
    REFUSED_TOPIC_FULL = "refused_topic_full"
    #: Not a record, a bad topic, already expired, or it expires too far ahead.
    REFUSED_INVALID = "refused_invalid"

    @property
    def accepted(self) -> bool:
        """True if the record is now in the store."""
        return self in (PutResult.STORED, PutResult.REPLACED)


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """Counters of a :class:`RecordStore` (totals since it was built, plus sizes)."""

    #: Topics held now.
    topics: int
    #: Records held now.
    records: int
    #: Records stored for a key new to their topic (evictions included).
    stored: int
    #: Records that replaced a lower seq of the same key.
    replaced: int
    #: Records evicted to make room for one that expires later.
    evicted: int
    #: Records ignored because their seq was not higher than the stored one.
    ignored_older_seq: int
    #: Records refused because the store held ``max_topics`` topics.
    refused_topics_full: int
    #: Records refused because their topic was full of longer-lived records.
    refused_topic_full: int
    #: Records refused as invalid (bad type, bad topic, expired, too far ahead).
    refused_invalid: int
    #: Records removed by an UNANNOUNCE.
    removed: int
    #: Records dropped because they expired.
    expired: int


class RecordStore:
    """Peer records by topic and key, bounded, expiring, seq-ordered.

    Args:
        max_topics: most topics held at once (> 0).
        max_records_per_topic: most records per topic (> 0).
        max_ttl_s: longest lifetime a stored record may claim (> 0);
            ``CLOCK_SKEW_S`` is allowed on top.

    Raises:
        DhtUsageError: a bound is not a positive number (``BAD_CONFIG``).
    """

    def __init__(
        self,
        max_topics: int = DEFAULT_MAX_TOPICS,
        max_records_per_topic: int = DEFAULT_MAX_RECORDS_PER_TOPIC,
        max_ttl_s: float = MAX_RECORD_TTL_S,
    ) -> None:
        for name, value in (
            ("max_topics", max_topics),
            ("max_records_per_topic", max_records_per_topic),
        ):
            if type(value) is not int or value < 1:
                raise DhtUsageError(f"{name} must be a positive int", code="BAD_CONFIG")
        if not (isinstance(max_ttl_s, int | float) and 0 < max_ttl_s < math.inf):
            raise DhtUsageError("max_ttl_s must be positive and finite", code="BAD_CONFIG")
        self.max_topics = max_topics
        self.max_records_per_topic = max_records_per_topic
        self.max_ttl_s = max_ttl_s
        # Bounded: at most max_topics keys, each at most max_records_per_topic.
        self._topics: dict[bytes, dict[bytes, PeerRecord]] = {}
        self._records = 0
        self._stored = 0
        self._replaced = 0
        self._evicted = 0
        self._ignored_older_seq = 0
        self._refused_topics_full = 0
        self._refused_topic_full = 0
        self._refused_invalid = 0
        self._removed = 0
        self._expired = 0

    def put(self, topic: bytes, record: PeerRecord, now: float) -> PutResult:
        """Store ``record`` under ``topic`` if the rules allow it.

        Args:
            topic: the 32-byte topic.
            record: a record the caller has already verified for ``topic``.
            now: the current unix time in seconds.

        Returns:
            What happened; every outcome bumps its counter in :meth:`statistics`.
            Never raises.
        """
        if not self._valid(topic, record, now):
            self._refused_invalid += 1
            return PutResult.REFUSED_INVALID
        records = self._topics.get(topic)
        if records is None:
            if len(self._topics) >= self.max_topics:
                # Bound: refuse; expire() frees topics whose records all died.
                self._refused_topics_full += 1
                return PutResult.REFUSED_TOPICS_FULL
            records = self._topics[topic] = {}
        current = records.get(record.public_key)
        if current is not None:
            if record.seq <= current.seq:
                self._ignored_older_seq += 1
                return PutResult.IGNORED_OLDER_SEQ
            records[record.public_key] = record
            self._replaced += 1
            return PutResult.REPLACED
        if len(records) >= self.max_records_per_topic:
            self._expire_topic(topic, records, now)
            # A sweep that emptied the topic removed it; put the (empty) table back.
            self._topics.setdefault(topic, records)
        if len(records) >= self.max_records_per_topic:
            # Bound: evict the soonest-expiring record only for a longer-lived one.
            victim = min(records.values(), key=_expiry_order)
            if record.expires <= victim.expires:
                self._refused_topic_full += 1
                return PutResult.REFUSED_TOPIC_FULL
            del records[victim.public_key]
            self._records -= 1
            self._evicted += 1
        records[record.public_key] = record
        self._records += 1
        self._stored += 1
        return PutResult.STORED

    def remove(self, topic: bytes, public_key: bytes, seq: int) -> bool:
        """Remove ``public_key``'s record under ``topic`` for a verified UNANNOUNCE.

        Args:
            topic: the 32-byte topic.
            public_key: the announcer's key.
            seq: the seq the UNANNOUNCE retires.

        Returns:
            True if a record was removed: one existed and its seq was ``<= seq``.
            False otherwise (including for malformed arguments). Never raises.
        """
        try:
            records = self._topics.get(topic)
            current = records.get(public_key) if records is not None else None
        except TypeError:  # unhashable argument
            return False
        if current is None or not (type(seq) is int and seq >= current.seq):
            return False
        assert records is not None
        del records[public_key]
        self._records -= 1
        self._removed += 1
        if not records:
            del self._topics[topic]
        return True

    def get(self, topic: bytes, now: float, limit: int = DEFAULT_LOOKUP_LIMIT) -> list[PeerRecord]:
        """The live records under ``topic``, newest first.

        Drops the topic's expired records on the way (they count as expired).

        Args:
            topic: the 32-byte topic.
            now: the current unix time in seconds.
            limit: most records returned; ``<= 0`` returns none.

        Returns:
            Up to ``limit`` records, latest ``expires`` first (ties: higher seq,
            then key). Never raises; an unknown or malformed topic gives ``[]``.
        """
        try:
            records = self._topics.get(topic)
        except TypeError:
            return []
        if records is None or type(limit) is not int or limit <= 0:
            return []
        self._expire_topic(topic, records, now)
        return sorted(records.values(), key=_newest_first)[:limit]

    def expire(self, now: float) -> int:
        """Drop every record whose ``expires <= now``, and topics left empty.

        Call it periodically (e.g. every minute): it is what frees topics for
        :meth:`put` once the store is at ``max_topics``. Costs O(records held).

        Args:
            now: the current unix time in seconds.

        Returns:
            How many records were dropped.
        """
        before = self._expired
        for topic, records in list(self._topics.items()):
            self._expire_topic(topic, records, now)
        return self._expired - before

    def statistics(self) -> StoreStatistics:
        """A snapshot of the counters and sizes.

        Returns:
            A frozen :class:`StoreStatistics`.
        """
        return StoreStatistics(
            topics=len(self._topics),
            records=self._records,
            stored=self._stored,
            replaced=self._replaced,
            evicted=self._evicted,
            ignored_older_seq=self._ignored_older_seq,
            refused_topics_full=self._refused_topics_full,
            refused_topic_full=self._refused_topic_full,
            refused_invalid=self._refused_invalid,
            removed=self._removed,
            expired=self._expired,
        )

    def __len__(self) -> int:
        return self._records

    def _valid(self, topic: object, record: object, now: float) -> bool:
        if type(topic) is not bytes or len(topic) != TOPIC_BYTES:
            return False
        if not isinstance(record, PeerRecord):
            return False
        # Written so that a NaN ``now`` makes every record invalid.
        try:
            return bool(now < record.expires <= now + self.max_ttl_s + CLOCK_SKEW_S)
        except TypeError:  # ``now`` is not a number
            return False

    def _expire_topic(self, topic: bytes, records: dict[bytes, PeerRecord], now: float) -> None:
        dead = [key for key, record in records.items() if record.expires <= now]
        for key in dead:
            del records[key]
        self._records -= len(dead)
        self._expired += len(dead)
        if not records:
            del self._topics[topic]


def _expiry_order(record: PeerRecord) -> tuple[int, int, bytes]:
    return (record.expires, record.seq, record.public_key)


def _newest_first(record: PeerRecord) -> tuple[int, int, bytes]:
    return (-record.expires, -record.seq, record.public_key)
