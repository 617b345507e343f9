"""The DHT routing table: Kademlia k-buckets, sans-IO, on the ``kademlia`` package.

Theory of operation
-------------------
:class:`Routing` owns the node's view of the network: which persistent,
reachable nodes it knows, grouped into k-buckets over the 160-bit id space
(Kademlia paper §2.2, §2.4). It reuses the routing state of the ``kademlia``
package (``kademlia.routing.RoutingTable`` and ``KBucket``, holding
``kademlia.node.Node`` objects; DESIGN.md §3.4) and replaces the two places
where that package reaches outside itself:

* **Bucket-head pings.** When a contact arrives for a full bucket that may not
  split, ``kademlia`` calls ``asyncio.ensure_future(protocol.call_ping(head))``.
  Here :meth:`Routing.add` parks the newcomer in the bucket's replacement cache
  and puts the head (least recently seen) in an outbox. The node core collects
  the outbox with :meth:`Routing.pings_to_send`, pings each head, and reports
  with :meth:`Routing.ping_result`: alive keeps the head (moved to most
  recently seen; the newcomer stays a replacement), dead evicts it and promotes
  the newest replacement (the newcomer, if nothing newer came). The paper's
  rule (§2.2): "if the least-recently seen node fails to respond, it is evicted
  ... and the new sender inserted at the tail", so old live nodes are kept.
* **Time.** ``kademlia`` stamps buckets with ``time.monotonic()``. Here every
  mutating call takes ``now`` (seconds, any monotonic origin) and buckets keep
  their own ``updated_s``, so refresh logic runs under a virtual clock.
  :meth:`Routing.stale_buckets` returns a random id inside each bucket not
  touched for ``older_than_s`` (the paper refreshes hourly; HyperDHT refreshes
  about every 5 minutes when idle; we default to 15 minutes) for the node core
  to look up; randomness comes from the ``random.Random`` given at construction.

Invariants: every contact's id is ``node_id_for(host, port)`` (HyperDHT's rule;
:func:`id_matches` is the check the node core makes before calling
:meth:`Routing.add`, and ``add`` refuses a contact that breaks it); a bucket
holds at most ``k`` contacts and ``kademlia``'s replacement cache at most
``5·k``; the local id is never stored; at most one head ping per contact is
outstanding. Ephemeral nodes are simply never added: the node core adds only
senders and responders that sent a matching id.

The ``kademlia`` bucket ranges are inclusive at both ends; we look buckets up
the same way (``kademlia``'s own ``get_bucket_for`` uses ``<`` for the upper
bound and so disagrees with its ``split`` on the boundary id). Its
``find_neighbors`` visits buckets in index order and stops at the first ``k``
contacts, which is not always the ``k`` closest by XOR; :meth:`Routing.closest`
visits buckets by the least distance their range allows instead, and stops
when no further bucket can hold a closer contact (a table holds about
``k·log2(N/k)`` contacts, a few hundred even at N = 10,000; every request a
node serves asks for its closest).

Topics (32 bytes) live in the same 160-bit key space through :func:`target_id`.
"""

from __future__ import annotations

import enum
import hashlib
import random
from collections.abc import Collection
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any

from kademlia.node import Node
from kademlia.routing import KBucket, RoutingTable

from ..errors import KeyFormatError
from ._contact import ID_BYTES, Contact, node_id_for
from ._errors import DhtUsageError

__all__ = [
    "DEFAULT_K",
    "DEFAULT_REFRESH_AFTER_S",
    "AddResult",
    "AddStatus",
    "Routing",
    "RoutingStatistics",
    "id_matches",
    "target_id",
]

#: Kademlia's k: contacts per bucket (the paper's and HyperDHT's 20).
DEFAULT_K = 20
#: A bucket untouched this long gets a refresh lookup (paper: 1 h; HyperDHT: ~5 min).
DEFAULT_REFRESH_AFTER_S = 900.0
#: A head ping unanswered this long (never reported) may be asked for again.
DEFAULT_HEAD_PING_TIMEOUT_S = 30.0

_ID_SPACE_MAX = 2**160 - 1


def target_id(topic: bytes) -> bytes:
    """Map a 32-byte topic into the 160-bit node-id key space.

    ``target_id(topic) = BLAKE2b(topic, digest_size=20)``: the k nodes whose ids
    are closest to it store the topic's records, and FIND_NODE walks toward it.

    Args:
        topic: the 32-byte topic.

    Returns:
        The 20-byte key.

    Raises:
        DhtUsageError: ``topic`` is not 32 bytes.
    """
    if type(topic) is not bytes or len(topic) != 32:
        raise DhtUsageError("a topic is 32 bytes", code="BAD_TOPIC")
    return hashlib.blake2b(topic, digest_size=ID_BYTES).digest()


def id_matches(claimed_id: bytes, host: str, port: int) -> bool:
    """Whether ``claimed_id`` is the id of the node observed at ``host:port``.

    IPv4-mapped IPv6 sources (``::ffff:a.b.c.d``, as a dual-stack socket reports
    IPv4 peers) match the IPv4 address's id.

    Args:
        claimed_id: the id a datagram claims (``sender_id`` or ``responder_id``).
        host: the datagram's source IP.
        port: the datagram's source port.

    Returns:
        True only if the id is ``node_id_for(host, port)``; False for anything
        else, including addresses that are not IPs.
    """
    if type(claimed_id) is not bytes or len(claimed_id) != ID_BYTES:
        return False
    try:
        return node_id_for(host, port) == claimed_id
    except (KeyFormatError, AttributeError, TypeError):
        return False


class AddStatus(enum.Enum):
    """What :meth:`Routing.add` did with a contact."""

    #: The contact is new and now in its bucket.
    ADDED = "added"
    #: The contact was known; it is now the bucket's most recently seen.
    UPDATED = "updated"
    #: The bucket is full: the contact waits in the replacement cache while the
    #: bucket's head is pinged (see ``pings_to_send``/``ping_result``).
    PENDING = "pending"
    #: The contact is this node itself; nothing stored.
    SELF = "self"


@dataclass(frozen=True, slots=True)
class AddResult:
    """The outcome of :meth:`Routing.add`."""

    status: AddStatus
    #: For PENDING: the head whose liveness decides (its ping is in the outbox,
    #: once). None otherwise.
    head: Contact | None = None


_UPDATED = AddResult(AddStatus.UPDATED)


@dataclass(frozen=True, slots=True)
class RoutingStatistics:
    """A snapshot of the table's size (see :meth:`Routing.statistics`)."""

    contacts: int
    buckets: int
    replacements: int
    pending_pings: int


class _Node(Node):  # type: ignore[misc]
    """A ``kademlia`` Node that keeps the :class:`Contact` it was made from.

    Every FIND_NODE and LOOKUP served returns k contacts; handing back the
    stored tuple saves building k new ones per request.
    """

    def __init__(self, contact: Contact) -> None:
        super().__init__(contact.id, contact.host, contact.port)
        # A plain Contact (not a caller's subclass), as if rebuilt from the fields.
        self.contact = contact if type(contact) is Contact else Contact(*contact)


_LONG_ID = attrgetter("long_id")
_DISTANCE = itemgetter(0)


class _Bucket(KBucket):  # type: ignore[misc]
    """A ``KBucket`` on our clock: ``updated_s`` is set from ``now`` by :class:`Routing`."""

    def __init__(self, lower: int, upper: int, ksize: int, updated_s: float) -> None:
        self.updated_s = updated_s
        super().__init__(lower, upper, ksize)

    def touch_last_updated(self) -> None:
        # kademlia calls this with time.monotonic(); our clock is `updated_s`.
        self.last_updated = None

    def split(self) -> tuple[_Bucket, _Bucket]:
        lower, upper = self.range
        midpoint = (lower + upper) // 2
        one = _Bucket(lower, midpoint, self.ksize, self.updated_s)
        two = _Bucket(midpoint + 1, upper, self.ksize, self.updated_s)
        for node in [*self.nodes.values(), *self.replacement_nodes.values()]:
            (one if node.long_id <= midpoint else two).add_node(node)
        return one, two


class _Table(RoutingTable):  # type: ignore[misc]
    """``kademlia``'s RoutingTable without its protocol, clock or asyncio."""

    def __init__(self, ksize: int, node: Node, now: float) -> None:
        self._created_s = now
        super().__init__(None, ksize, node)

    def flush(self) -> None:
        self.buckets = [_Bucket(0, 2**160, self.ksize, self._created_s)]

    def get_bucket_for(self, node: Node) -> int:
        return self.index_for(node.long_id)

    def index_for(self, long_id: int) -> int:
        # Inclusive upper bound, consistent with KBucket.split / has_in_range.
        for index, bucket in enumerate(self.buckets):
            if long_id <= bucket.range[1]:
                return index
        raise AssertionError("bucket ranges cover the whole id space")

    def add_contact(self, node: Node) -> _Bucket | None:
        """Add like kademlia does; return the full bucket instead of pinging its head."""
        while True:
            index = self.get_bucket_for(node)
            bucket = self.buckets[index]
            if bucket.add_node(node):
                return None
            # Paper §4.2: split if the bucket covers our own id, or if its depth
            # is not ≡ 0 (mod 5) (relaxed splitting, b = 5).
            if bucket.has_in_range(self.node) or bucket.depth() % 5 != 0:
                self.split_bucket(index)
                continue
            return bucket  # full; the newcomer sits in its replacement cache

    def lonely_buckets(self) -> list[Any]:
        raise NotImplementedError("use Routing.stale_buckets(now)")


class Routing:
    """The k-bucket routing table of one node (sans-IO).

    Args:
        local_id: this node's 20-byte id (never stored in the table).
        now: the current time in seconds; buckets count as fresh from here.
        rng: the source of randomness for refresh ids.
        k: Kademlia's *k*, contacts per bucket.
        head_ping_timeout_s: after this long without a :meth:`ping_result`, a
            head may be put in the outbox again.

    Raises:
        DhtUsageError: ``local_id`` is not 20 bytes or ``k`` < 1.
    """

    def __init__(
        self,
        local_id: bytes,
        *,
        now: float,
        rng: random.Random,
        k: int = DEFAULT_K,
        head_ping_timeout_s: float = DEFAULT_HEAD_PING_TIMEOUT_S,
    ) -> None:
        if type(local_id) is not bytes or len(local_id) != ID_BYTES:
            raise DhtUsageError(f"a node id is {ID_BYTES} bytes", code="BAD_NODE_ID")
        if type(k) is not int or k < 1:
            raise DhtUsageError("k must be a positive int", code="BAD_CONFIG")
        self.local_id = local_id
        self.k = k
        self.head_ping_timeout_s = head_ping_timeout_s
        self._rng = rng
        self._table = _Table(k, Node(local_id), now)
        # Head id -> when its ping was put in the outbox. Bounded: keys are
        # contacts in the table (entries go when the contact is pinged or removed).
        self._pending: dict[bytes, float] = {}
        # Heads to ping, in order; each at most once (bounded like _pending).
        self._outbox: dict[bytes, Contact] = {}

    # -- updates -------------------------------------------------------------------

    def add(self, contact: Contact, now: float) -> AddResult:
        """Record that ``contact`` is alive (it answered us, or asked with its id).

        Args:
            contact: a contact whose id matches its address (check
                :func:`id_matches` first).
            now: the current time in seconds.

        Returns:
            What happened. On ``PENDING``, collect :meth:`pings_to_send` and
            report each ping's outcome with :meth:`ping_result`.

        Raises:
            DhtUsageError: the contact's id does not derive from its address.
        """
        if not isinstance(contact, Contact) or not id_matches(
            contact.id, contact.host, contact.port
        ):
            raise DhtUsageError(
                f"contact id does not match its address: {contact!r}", code="BAD_NODE_ID"
            )
        if contact.id == self.local_id:
            return AddResult(AddStatus.SELF)
        table = self._table
        bucket = table.buckets[table.index_for(int.from_bytes(contact.id, "big"))]
        if contact.id in bucket.nodes:
            # Known (every answer and request of a known node lands here): move
            # it to the tail as kademlia's add_node does, without building a Node.
            bucket.nodes.move_to_end(contact.id)
            bucket.updated_s = now
            # Anything from a head proves it alive: no ping needed any more.
            self._pending.pop(contact.id, None)
            self._outbox.pop(contact.id, None)
            return _UPDATED
        node = _Node(contact)
        known = not table.is_new_node(node)
        full = table.add_contact(node)
        if full is None:
            table.buckets[table.get_bucket_for(node)].updated_s = now
            if known:
                # Anything from a head proves it alive: no ping needed any more.
                self._pending.pop(contact.id, None)
                self._outbox.pop(contact.id, None)
                return AddResult(AddStatus.UPDATED)
            return AddResult(AddStatus.ADDED)
        head = full.head()
        since = self._pending.get(head.id)
        if since is None or now - since >= self.head_ping_timeout_s:
            self._pending[head.id] = now
            self._outbox[head.id] = _contact(head)
        return AddResult(AddStatus.PENDING, _contact(head))

    def pings_to_send(self) -> list[Contact]:
        """Collect the bucket heads to ping (the outbox); each is returned once.

        Returns:
            Contacts to PING now. Report each outcome with :meth:`ping_result`
            (a timeout counts as ``alive=False``).
        """
        heads = list(self._outbox.values())
        self._outbox.clear()
        return heads

    def ping_result(self, head: Contact | bytes, alive: bool, now: float) -> Contact | None:
        """Report whether a pinged contact answered.

        Works for any contact in the table, not only bucket heads.

        Args:
            head: the pinged contact (or its id).
            alive: True if it answered, False on timeout.
            now: the current time in seconds.

        Returns:
            On ``alive=False``: the replacement promoted into the freed slot
            (the newest in the bucket's replacement cache), if any. Otherwise None.
        """
        head_id = head if isinstance(head, bytes) else head.id
        self._pending.pop(head_id, None)
        self._outbox.pop(head_id, None)
        table = self._table
        probe = Node(head_id)
        bucket = table.buckets[table.get_bucket_for(probe)]
        node = bucket[head_id]
        if node is None:
            return None  # removed or never here; nothing to decide
        if alive:
            bucket.add_node(node)  # moves it to the tail (most recently seen)
            bucket.updated_s = now
            return None
        promoted_id = next(reversed(bucket.replacement_nodes), None)
        bucket.remove_node(node)
        if promoted_id is None:
            return None
        bucket.updated_s = now
        return _contact(bucket.nodes[promoted_id])

    def remove(self, contact_id: bytes) -> bool:
        """Forget a contact (e.g. it failed several requests).

        The bucket's newest replacement, if any, takes its place.

        Args:
            contact_id: the 20-byte id.

        Returns:
            True if the contact was in the table (replacements included).
        """
        self._pending.pop(contact_id, None)
        self._outbox.pop(contact_id, None)
        if type(contact_id) is not bytes or len(contact_id) != ID_BYTES:
            return False
        probe = Node(contact_id)
        bucket = self._table.buckets[self._table.get_bucket_for(probe)]
        if contact_id not in bucket.nodes and contact_id not in bucket.replacement_nodes:
            return False
        bucket.remove_node(probe)
        return True

    def refreshed(self, key: bytes, now: float) -> None:
        """Mark the bucket covering ``key`` fresh (a lookup for ``key`` just ran).

        Args:
            key: a 20-byte id (use :func:`target_id` for topics).
            now: the current time in seconds.
        """
        _check_id(key)
        table = self._table
        table.buckets[table.get_bucket_for(Node(key))].updated_s = now

    def stale_buckets(
        self, now: float, older_than_s: float = DEFAULT_REFRESH_AFTER_S
    ) -> list[bytes]:
        """Random ids to look up, one inside each bucket untouched for ``older_than_s``.

        The returned buckets count as refreshed at ``now`` (so a caller polling
        on a tick does not start the same refresh twice); the caller should run
        a FIND_NODE lookup for each id.

        Args:
            now: the current time in seconds.
            older_than_s: staleness threshold.

        Returns:
            20-byte ids, one per stale bucket, in bucket order.
        """
        ids = []
        for bucket in self._table.buckets:
            if now - bucket.updated_s >= older_than_s:
                lower, upper = bucket.range
                value = self._rng.randint(lower, min(upper, _ID_SPACE_MAX))
                ids.append(value.to_bytes(ID_BYTES, "big"))
                bucket.updated_s = now
        return ids

    # -- queries -------------------------------------------------------------------

    def closest(
        self, target: bytes, count: int = DEFAULT_K, exclude: Collection[bytes] | None = None
    ) -> list[Contact]:
        """The ``count`` contacts closest to ``target`` by XOR distance, nearest first.

        Args:
            target: a 20-byte id (use :func:`target_id` for a topic).
            count: how many at most.
            exclude: ids to leave out (e.g. the asker's).

        Returns:
            Up to ``count`` contacts (replacements are not included).

        Raises:
            DhtUsageError: ``target`` is not 20 bytes.
        """
        t = int.from_bytes(_check_id(target), "big")
        if count <= 0:
            return []
        # Visit buckets nearest first by a lower bound on the XOR distance of
        # anything in their range; stop once the next bucket cannot beat the
        # count-th best found so far. The bound is tight, so usually only the
        # buckets holding the answer are scanned.
        ordered = [
            (_distance_floor(*bucket.range, t), id(bucket), bucket)
            for bucket in self._table.buckets
            if bucket.nodes
        ]
        ordered.sort()
        # Excluded ids are dropped at the end: take that many more meanwhile.
        want = count + len(exclude) if exclude else count
        best: list[tuple[int, _Node]] = []  # (distance, node), nearest first
        for bound, _, bucket in ordered:
            if len(best) >= want and bound > best[want - 1][0]:
                break
            nodes = bucket.nodes.values()
            # map() over int.__xor__ keeps the per-contact work in C: this runs
            # for every FIND_NODE and LOOKUP a node serves.
            best += zip(map(t.__xor__, map(_LONG_ID, nodes)), nodes, strict=True)
            best.sort(key=_DISTANCE)
        if not exclude:
            return [node.contact for _, node in best[:count]]
        return [node.contact for _, node in best[:want] if node.id not in exclude][:count]

    def get(self, contact_id: bytes) -> Contact | None:
        """The contact with this id, if it is in a bucket (not a replacement)."""
        if type(contact_id) is not bytes or len(contact_id) != ID_BYTES:
            return None
        table = self._table
        node = table.buckets[table.get_bucket_for(Node(contact_id))][contact_id]
        return None if node is None else _contact(node)

    def contacts(self) -> list[Contact]:
        """Every contact in a bucket, in id order."""
        return [_contact(node) for bucket in self._table.buckets for node in bucket.nodes.values()]

    def bucket_ranges(self) -> list[tuple[int, int]]:
        """The inclusive ``(lower, upper)`` id range of every bucket, in order."""
        return [bucket.range for bucket in self._table.buckets]

    def pending_pings(self) -> list[bytes]:
        """Ids of heads whose ping outcome has not been reported yet."""
        return list(self._pending)

    def statistics(self) -> RoutingStatistics:
        """A snapshot of the table's size."""
        buckets = self._table.buckets
        return RoutingStatistics(
            contacts=sum(len(b) for b in buckets),
            buckets=len(buckets),
            replacements=sum(len(b.replacement_nodes) for b in buckets),
            pending_pings=len(self._pending),
        )

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._table.buckets)

    def __contains__(self, contact_id: object) -> bool:
        return isinstance(contact_id, bytes) and self.get(contact_id) is not None


def _distance_floor(lower: int, upper: int, target: int) -> int:
    """A lower bound on ``x ^ target`` over ``lower <= x <= upper``.

    kademlia's ranges are aligned blocks with the top point moved in (the root
    is ``[0, 2**160]`` and ``split`` makes ``[lo, mid]`` and ``[mid + 1, hi]``),
    so the bound of the plain block trick, "ids in [lower, upper] share lower's
    bits above the top bit of lower ^ upper", would be 0 for most of them. Here
    ``[lower, upper - 1]`` gets the block trick and ``upper`` its exact
    distance, which for kademlia's ranges is the minimum or close below it.
    """
    shift = (lower ^ (upper - 1)).bit_length()
    return min(((lower ^ target) >> shift) << shift, upper ^ target)


def _contact(node: _Node) -> Contact:
    return node.contact


def _check_id(key: Any) -> bytes:
    if type(key) is not bytes or len(key) != ID_BYTES:
        raise DhtUsageError(f"a key is {ID_BYTES} bytes", code="BAD_NODE_ID")
    return key
