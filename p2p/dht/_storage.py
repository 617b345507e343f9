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

Bounds (STYLE.md: every table has one, and says what happens there). Each
record is charged to the *source group* of the ANNOUNCE that stored it (its
source IP, whose write token proves it is not spoofed: IPv4 per /32, IPv6 per
/64, :func:`p2p.addresses.source_group`) and to its key, so that a flood from
one address, or by one key, cannot deny service to the others (10,500
announces from one key and port would fill a node for 20 minutes):

* ``max_topics`` topics: a record for a new topic is ``REFUSED_TOPICS_FULL``.
  The store does not sweep on that path (a full sweep per refused datagram
  would make flooding expensive); the node calls :meth:`RecordStore.expire`
  periodically, which frees topics whose records have all expired.
* ``max_records_per_source`` records per source group: beyond it a new record
  (or a record that moves to this group) is ``REFUSED_SOURCE_FULL``; the
  group's own records stay. One address can therefore hold at most this many
  of the ``max_topics`` topics. Records put without a source (the node's own)
  are not charged.
* ``max_records_per_key`` records per public key, over all topics:
  ``REFUSED_KEY_FULL`` beyond it.
* ``max_records_per_topic`` records per topic (after dropping the topic's
  expired records), shared fairly between source groups: a record from a new
  key evicts one of the *largest* group in the topic, the one expiring soonest,
  only if that leaves the newcomer's group no larger than the victim's was:
  if the newcomer's group would hold fewer records than the largest does now,
  it evicts; if as many, it evicts only a record that expires sooner than its
  own (among equals, the stalest leaves: its announcer refreshed longest ago
  and re-enters at its next refresh; refusing would let whoever fills a topic
  first lock it); if more, it is ``REFUSED_TOPIC_FULL``. So the largest group
  in a topic loses records first, and a flooder from one source can never
  evict a record of a group smaller than its own.
* **key topics**: a record whose topic is its own key's
  :func:`~p2p.dht._records.record_topic_for_key` (the topic ``find_peer``
  reads) *owns* that topic. It is stored whatever the topic holds, evicting
  every record of another key there, and while it is stored a record of
  another key under that topic is ``REFUSED_TOPIC_OWNED``. A storing node
  cannot tell that a topic is derived from a key it has not seen, so records
  of other keys may sit in it until the owner's record arrives, but they can
  never push the owner's record out.

Worst case the store holds ``max_topics * max_records_per_topic`` records
(640,000 with the defaults, a few hundred MB); there is no global record
bound yet beyond that product.

Upstream keeps one record cache of 65,536 entries with a 20-minute maxAge and
returns at most 20 records per lookup, the default ``limit`` here.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass

from ..addresses import source_group
from ._errors import DhtUsageError
from ._records import CLOCK_SKEW_S, MAX_RECORD_TTL_S, TOPIC_BYTES, PeerRecord, record_topic_for_key

__all__ = [
    "DEFAULT_LOOKUP_LIMIT",
    "DEFAULT_MAX_RECORDS_PER_KEY",
    "DEFAULT_MAX_RECORDS_PER_SOURCE",
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
#: Records one source group (IPv4 address, IPv6 /64) may hold on one node. A
#: node holds only the topics near its id, so an honest address behind which a
#: few dozen peers each join a few topics stays far below it; one address can
#: take at most 256 / 10,000 topics.
DEFAULT_MAX_RECORDS_PER_SOURCE = 256
#: Records one key may hold on one node, over all topics (its own key topic
#: and the topics it joins).
DEFAULT_MAX_RECORDS_PER_KEY = 64
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
    #: The topic is full and the record's source may not evict (see the module doc).
    REFUSED_TOPIC_FULL = "refused_topic_full"
    #: The record's source group holds ``max_records_per_source`` records.
    REFUSED_SOURCE_FULL = "refused_source_full"
    #: The record's key holds ``max_records_per_key`` records.
    REFUSED_KEY_FULL = "refused_key_full"
    #: The topic is another key's own topic, and that key's record is stored.
    REFUSED_TOPIC_OWNED = "refused_topic_owned"
    #: Not a record, a bad topic, already expired, or it expires too far ahead.
    REFUSED_INVALID = "refused_invalid"

    @property
    def accepted(self) -> bool:
        """True if the record is now in the store."""
        return self in (PutResult.STORED, PutResult.REPLACED)

    @property
    def code(self) -> str | None:
        """The ANNOUNCE error code for this outcome (None if it was stored)."""
        return _CODES.get(self)


_CODES = {
    PutResult.IGNORED_OLDER_SEQ: "SEQ_TOO_LOW",
    PutResult.REFUSED_TOPICS_FULL: "STORE_FULL",
    PutResult.REFUSED_TOPIC_FULL: "STORE_FULL",
    PutResult.REFUSED_SOURCE_FULL: "SOURCE_FULL",
    PutResult.REFUSED_KEY_FULL: "KEY_FULL",
    PutResult.REFUSED_TOPIC_OWNED: "TOPIC_OWNED",
    PutResult.REFUSED_INVALID: "BAD_RECORD",
}


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
    #: Records evicted to make room for another (fair share, or a key topic's owner).
    evicted: int
    #: Records ignored because their seq was not higher than the stored one.
    ignored_older_seq: int
    #: Records refused because the store held ``max_topics`` topics.
    refused_topics_full: int
    #: Records refused because their topic was full (see the module doc).
    refused_topic_full: int
    #: Records refused as invalid (bad type, bad topic, expired, too far ahead).
    refused_invalid: int
    #: Records removed by an UNANNOUNCE.
    removed: int
    #: Records dropped because they expired.
    expired: int
    #: Records refused because their source group was at its bound.
    refused_source_full: int = 0
    #: Records refused because their key was at its bound.
    refused_key_full: int = 0
    #: Records refused because another key owns the topic.
    refused_topic_owned: int = 0


@dataclass(slots=True)
class _Entry:
    record: PeerRecord
    #: The source group charged for it (None: the node's own record, not charged).
    group: str | None


class RecordStore:
    """Peer records by topic and key, bounded per topic, source and key, expiring.

    Args:
        max_topics: most topics held at once (> 0).
        max_records_per_topic: most records per topic (> 0).
        max_ttl_s: longest lifetime a stored record may claim (> 0);
            ``CLOCK_SKEW_S`` is allowed on top.
        max_records_per_source: most records charged to one source group (> 0).
        max_records_per_key: most records of one public key, all topics (> 0).

    Raises:
        DhtUsageError: a bound is not a positive number (``BAD_CONFIG``).
    """

    def __init__(
        self,
        max_topics: int = DEFAULT_MAX_TOPICS,
        max_records_per_topic: int = DEFAULT_MAX_RECORDS_PER_TOPIC,
        max_ttl_s: float = MAX_RECORD_TTL_S,
        *,
        max_records_per_source: int = DEFAULT_MAX_RECORDS_PER_SOURCE,
        max_records_per_key: int = DEFAULT_MAX_RECORDS_PER_KEY,
    ) -> None:
        for name, value in (
            ("max_topics", max_topics),
            ("max_records_per_topic", max_records_per_topic),
            ("max_records_per_source", max_records_per_source),
            ("max_records_per_key", max_records_per_key),
        ):
            if type(value) is not int or value < 1:
                raise DhtUsageError(f"{name} must be a positive int", code="BAD_CONFIG")
        if not (isinstance(max_ttl_s, int | float) and 0 < max_ttl_s < math.inf):
            raise DhtUsageError("max_ttl_s must be positive and finite", code="BAD_CONFIG")
        self.max_topics = max_topics
        self.max_records_per_topic = max_records_per_topic
        self.max_records_per_source = max_records_per_source
        self.max_records_per_key = max_records_per_key
        self.max_ttl_s = max_ttl_s
        # Bounded: at most max_topics keys, each at most max_records_per_topic.
        self._topics: dict[bytes, dict[bytes, _Entry]] = {}
        # Key topics whose owner's record is stored: topic -> owner key.
        self._owners: dict[bytes, bytes] = {}
        # Records charged per source group and per key (entries only while > 0,
        # so each is bounded by the records held).
        self._per_group: Counter[str] = Counter()
        self._per_key: Counter[bytes] = Counter()
        self._records = 0
        self._stored = 0
        self._replaced = 0
        self._evicted = 0
        self._ignored_older_seq = 0
        self._refused_topics_full = 0
        self._refused_topic_full = 0
        self._refused_source_full = 0
        self._refused_key_full = 0
        self._refused_topic_owned = 0
        self._refused_invalid = 0
        self._removed = 0
        self._expired = 0

    def put(
        self, topic: bytes, record: PeerRecord, now: float, source: str | None = None
    ) -> PutResult:
        """Store ``record`` under ``topic`` if the rules allow it.

        Args:
            topic: the 32-byte topic.
            record: a record the caller has already verified for ``topic``.
            now: the current unix time in seconds.
            source: the IP address the ANNOUNCE came from (its write token
                proves it); the record is charged to its source group. None for
                the node's own records (not charged to any source).

        Returns:
            What happened; every outcome bumps its counter in :meth:`statistics`.
            Never raises.
        """
        if not self._valid(topic, record, now):
            self._refused_invalid += 1
            return PutResult.REFUSED_INVALID
        group = source_group(source) if source is not None else None
        key = record.public_key
        owner = self._owners.get(topic)
        if owner is not None and owner != key:
            self._refused_topic_owned += 1
            return PutResult.REFUSED_TOPIC_OWNED
        records = self._topics.get(topic)
        if records is None and len(self._topics) >= self.max_topics:
            # Bound: refuse; expire() frees topics whose records all died.
            self._refused_topics_full += 1
            return PutResult.REFUSED_TOPICS_FULL
        current = records.get(key) if records is not None else None
        if current is not None:
            if record.seq <= current.record.seq:
                self._ignored_older_seq += 1
                return PutResult.IGNORED_OLDER_SEQ
            if group != current.group and not self._group_has_room(group):
                self._refused_source_full += 1
                return PutResult.REFUSED_SOURCE_FULL
            self._uncharge(current)
            current.record, current.group = record, group
            self._charge(current)
            self._replaced += 1
            return PutResult.REPLACED
        if self._per_key[key] >= self.max_records_per_key:
            self._refused_key_full += 1
            return PutResult.REFUSED_KEY_FULL
        if not self._group_has_room(group):
            self._refused_source_full += 1
            return PutResult.REFUSED_SOURCE_FULL
        owns = record_topic_for_key(key) == topic
        if records is not None and owns:
            # The key's own topic holds only the key's record.
            for other in list(records.values()):
                self._drop(topic, records, other)
                self._evicted += 1
        elif records is not None and len(records) >= self.max_records_per_topic:
            self._expire_topic(topic, records, now)
            if len(records) >= self.max_records_per_topic:
                victim = self._victim(records, group, record)
                if victim is None:
                    self._refused_topic_full += 1
                    return PutResult.REFUSED_TOPIC_FULL
                self._drop(topic, records, victim)
                self._evicted += 1
        records = self._topics.setdefault(topic, records if records is not None else {})
        entry = records[key] = _Entry(record, group)
        self._charge(entry)
        if owns:
            self._owners[topic] = key
        self._records += 1
        self._stored += 1
        return PutResult.STORED

    def _group_has_room(self, group: str | None) -> bool:
        return group is None or self._per_group[group] < self.max_records_per_source

    def _victim(self, records: dict[bytes, _Entry], group: str | None,
                record: PeerRecord) -> _Entry | None:
        """The record a newcomer from ``group`` may evict from a full topic, if any."""
        # A record put without a source (the node's own) counts as a group of one.
        sizes = Counter(_group_of(e) for e in records.values())
        largest = max(sizes.values())
        mine = sizes[group] if group is not None else 0
        candidates = [e for e in records.values() if sizes[_group_of(e)] == largest]
        victim = min(candidates, key=lambda e: _expiry_order(e.record))
        if mine + 1 < largest:
            return victim
        if mine + 1 == largest and record.expires > victim.record.expires:
            return victim
        return None

    def _charge(self, entry: _Entry) -> None:
        self._per_key[entry.record.public_key] += 1
        if entry.group is not None:
            self._per_group[entry.group] += 1

    def _uncharge(self, entry: _Entry) -> None:
        key = entry.record.public_key
        self._per_key[key] -= 1
        if self._per_key[key] <= 0:
            del self._per_key[key]
        if entry.group is not None:
            self._per_group[entry.group] -= 1
            if self._per_group[entry.group] <= 0:
                del self._per_group[entry.group]

    def _drop(self, topic: bytes, records: dict[bytes, _Entry], entry: _Entry) -> None:
        """Remove one entry from a topic (the topic itself stays, even if empty)."""
        key = entry.record.public_key
        del records[key]
        self._uncharge(entry)
        self._records -= 1
        if self._owners.get(topic) == key:
            del self._owners[topic]

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
        if current is None or not (type(seq) is int and seq >= current.record.seq):
            return False
        assert records is not None
        self._drop(topic, records, current)
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
        return sorted((e.record for e in records.values()), key=_newest_first)[:limit]

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

    def held_by_source(self, source: str) -> int:
        """How many records are charged to ``source``'s group now."""
        return self._per_group.get(source_group(source), 0)

    def held_by_key(self, public_key: bytes) -> int:
        """How many records ``public_key`` holds now, over all topics."""
        return self._per_key.get(public_key, 0)

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
            refused_source_full=self._refused_source_full,
            refused_key_full=self._refused_key_full,
            refused_topic_owned=self._refused_topic_owned,
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

    def _expire_topic(self, topic: bytes, records: dict[bytes, _Entry], now: float) -> None:
        dead = [entry for entry in records.values() if entry.record.expires <= now]
        for entry in dead:
            self._drop(topic, records, entry)
        self._expired += len(dead)
        if not records:
            del self._topics[topic]


def _group_of(entry: _Entry) -> str | bytes:
    return entry.group if entry.group is not None else entry.record.public_key


def _expiry_order(record: PeerRecord) -> tuple[int, int, bytes]:
    return (record.expires, record.seq, record.public_key)


def _newest_first(record: PeerRecord) -> tuple[int, int, bytes]:
    return (-record.expires, -record.seq, record.public_key)
