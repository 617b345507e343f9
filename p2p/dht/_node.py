"""Sans-IO DHT node core: answers requests, matches responses, keeps the table.

Theory of operation
-------------------
:class:`NodeCore` is everything a DHT node decides, with no sockets and no
clock: datagrams come in through :meth:`NodeCore.receive_datagram` with their
source address and ``now`` (unix seconds, as records' ``expires`` are), and
what must go out is returned as :class:`Outgoing` datagrams. The trio driver
sends those, runs lookups (:mod:`._lookup`) with :meth:`make_request`, and
wakes at :meth:`next_deadline`.

Serving (every reply carries the asker's observed address, a fresh write token
bound to that address, and our id when we are persistent):

=========== ===================== ===============================================
command     target                reply
=========== ===================== ===============================================
PING        —                     nothing else
FIND_NODE   20-byte node id       the k closest contacts we know
LOOKUP      32-byte topic         closest contacts + verified records that fit
ANNOUNCE    32-byte topic         stores the signed record (token required)
UNANNOUNCE  32-byte topic         removes the key's record (token + signature)
PING_BACK   20-byte nonce         nothing else, but a PROBE with the nonce goes
                                  to the asker from our *probe* socket
PROBE       20-byte nonce         never answered
=========== ===================== ===============================================

Reachability (HyperDHT's firewall check): a node that wants to be
persistent stays ephemeral (sends no id, so nobody stores it) until it has
shown that a datagram it did not ask for reaches it. It sends PING_BACK to a
few nodes; each answers and also sends a PROBE from a second socket, i.e. a
source port we never sent to. A stateful firewall or a NAT drops that probe
(it is not a reply), an open node gets it. A probe counts only if its nonce is
one we sent and it comes from another address than the node we asked, so a
checker cannot vouch for us with a plain reply. Learning a new address makes
the node ephemeral again until it passes a new check.

Rules kept here (DESIGN.md §3.4):

* A requester is added to the routing table only if it sent an id and that id
  is the hash of its source address (:func:`~._routing.id_matches`); nodes that
  send no id are ephemeral and never stored.
* A response whose responder id does not match its source address is ignored
  entirely, and so is a response whose source is not the address the request
  went to (a spoofed reply cannot answer someone else's request).
* ANNOUNCE and UNANNOUNCE without a valid token for the source address are
  refused with ``INVALID_TOKEN``; records are verified (signature, topic,
  bounded expiry) before they are stored; a bad one is refused with its code.
* A datagram that does not decode is dropped and counted; it never raises.
* Stored records are charged to the ANNOUNCE's source group and key, bounded
  per source, per key and per topic, and a key owns its own key topic
  (:mod:`._storage`); every refused ANNOUNCE is counted by its error code.
* Nothing goes to an asker that it cannot reach: no loopback (link-local)
  contact in ``closer`` and no record it could dial nothing of in a LOOKUP
  reply, unless the asker came over loopback (link-local) itself
  (:func:`p2p.addresses.visible_to`). One observed address from off our
  host beats any number of loopback (link-local) ones.
"""

from __future__ import annotations

import functools
import os
import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from ..addresses import Scope, address_scope, visible_to
from ._contact import Contact, canonical_address, node_id_for
from ._errors import DhtDecodeError, DhtProtocolError, DhtUsageError
from ._messages import (
    MAX_CLOSER,
    MAX_TID,
    Command,
    Request,
    Response,
    decode,
    encode,
    encode_with_records,
)
from ._records import PeerRecord, verify_record, verify_unannounce
from ._routing import Routing, id_matches, target_id
from ._storage import (
    DEFAULT_MAX_RECORDS_PER_KEY,
    DEFAULT_MAX_RECORDS_PER_SOURCE,
    DEFAULT_MAX_TOPICS,
    PutResult,
    RecordStore,
)
from ._tokens import TokenIssuer

__all__ = ["NodeConfig", "NodeCore", "NodeStatistics", "Outgoing", "ResponseReceived"]

Address = tuple[str, int]

#: Requests we wait for at once; beyond it make_request refuses (the driver waits).
DEFAULT_MAX_PENDING = 4096
#: Observed-address votes kept (one per responder, most recent wins).
_MAX_VOTES = 32
#: Reachability checks of ours in flight at once (each asks one node).
_MAX_REACH_CHECKS = 16
#: Probes we send for others: a bucket of this many, refilled at this rate, so
#: spoofed PING_BACKs cannot turn us into a datagram cannon.
_PROBE_BURST = 32
_PROBES_PER_S = 16.0


@dataclass(frozen=True)
class NodeConfig:
    """Parameters of one node; validated when built."""

    k: int = 20
    """Kademlia's *k*: bucket size and contacts per reply."""

    request_timeout_s: float = 1.0
    """Seconds before an unanswered request counts as failed."""

    token_rotate_s: float = 60.0
    """Write-token secret rotation period (tokens live one to two periods)."""

    max_pending: int = DEFAULT_MAX_PENDING
    """Requests in flight at once."""

    max_records_per_reply: int = 20
    """Records a LOOKUP reply carries at most (fewer if they do not fit)."""

    max_topics: int = DEFAULT_MAX_TOPICS
    """Topics our store holds at most (then a new topic is ``STORE_FULL``)."""

    max_records_per_source: int = DEFAULT_MAX_RECORDS_PER_SOURCE
    """Records one source group (IPv4 address, IPv6 /64) may hold in our store."""

    max_records_per_key: int = DEFAULT_MAX_RECORDS_PER_KEY
    """Records one announcer key may hold in our store, over all topics."""

    def __post_init__(self) -> None:
        if self.k < 1 or self.max_pending < 1 or self.max_records_per_reply < 0:
            raise DhtUsageError("k and max_pending must be >= 1", code="BAD_CONFIG")
        if min(self.max_topics, self.max_records_per_source, self.max_records_per_key) < 1:
            raise DhtUsageError("store bounds must be >= 1", code="BAD_CONFIG")
        if self.request_timeout_s <= 0 or self.token_rotate_s <= 0:
            raise DhtUsageError("timeouts must be positive", code="BAD_CONFIG")


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A datagram to send."""

    data: bytes
    address: Address
    #: Send it from the probe socket, not the node's own (a PING_BACK's PROBE).
    from_probe_socket: bool = False


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    """A verified response to our request ``tid`` (from ``contact``)."""

    tid: int
    contact: Contact
    response: Response


@dataclass(frozen=True)
class NodeStatistics:
    requests_served: int
    bad_datagrams: int
    ignored_responses: int
    invalid_tokens: int
    records_refused: int
    timeouts: int
    pending: int
    contacts: int
    records: int
    probes_sent: int
    probes_refused: int
    reachable: bool
    #: ANNOUNCE and UNANNOUNCE requests answered with an error, by code
    #: (``SOURCE_FULL``, ``KEY_FULL``, ``TOPIC_OWNED``, ``STORE_FULL`` ...), sorted.
    refused_by_code: tuple[tuple[str, int], ...] = ()


@dataclass
class _Pending:
    address: Address
    command: Command
    deadline: float
    #: For a bucket-head ping: the head's id, whose fate the answer decides.
    head: bytes | None = None


# visible_to parses both addresses (ipaddress) on every call, and a node asks
# it for each of the k contacts of every reply: remember the answers, small.
# Anyone may use a private or public address (p2p.addresses.usable_by), so
# only narrow hosts (loopback, link-local: few) need the asker too. Pure
# functions; fresh hosts from a hostile stream only evict.
_scope = functools.lru_cache(maxsize=1024)(address_scope)
_narrow_visible_to = functools.lru_cache(maxsize=256)(visible_to)
_EVERYONE_MAY_USE = frozenset({Scope.PRIVATE, Scope.PUBLIC})


def _visible_to(host: str, viewer_host: str) -> bool:
    if _scope(host) in _EVERYONE_MAY_USE:
        return True
    return _narrow_visible_to(host, viewer_host)


def _narrow(host: str) -> bool:
    """True for addresses that mean something only on one host or link."""
    return _scope(host) in (Scope.LOOPBACK, Scope.LINK_LOCAL, None)


class NodeCore:
    """One DHT node's state machine.

    Args:
        now: current unix time in seconds.
        config: parameters.
        persistent: True for a node that wants to be stored in others'
            tables (bootstrap and plain nodes); it is, once its address is
            known and it is :attr:`reachable`. False for ephemeral nodes
            (clients), which query but are never stored.
        address: the address others see us at, if known (the bound address of
            a bootstrap node); otherwise it is learned from replies.
        reachable: True to skip the reachability check (a bootstrap node whose
            operator vouches for its address; the first node has nobody to
            ask). Learning a different address clears it.
        rng: randomness for request ids and refresh targets (seeded in tests).
        token_seed: secret seed of the write tokens (random if omitted).
    """

    def __init__(
        self,
        *,
        now: float,
        config: NodeConfig | None = None,
        persistent: bool = False,
        address: Address | None = None,
        reachable: bool = False,
        rng: random.Random | None = None,
        token_seed: bytes | None = None,
    ) -> None:
        self.config = config or NodeConfig()
        self.persistent = persistent
        #: True once an unsolicited datagram reached us (see the module doc).
        self.reachable = reachable
        self._rng = rng or random.Random()
        self._tokens = TokenIssuer(
            token_seed or os.urandom(32), rotate_every_s=self.config.token_rotate_s, now=now
        )
        self.store = RecordStore(
            max_topics=self.config.max_topics,
            max_records_per_source=self.config.max_records_per_source,
            max_records_per_key=self.config.max_records_per_key,
        )
        self._address: Address | None = canonical_address(*address) if address else None
        self._votes: dict[Address, Address] = {}  # responder -> the address it saw
        self.routing = self._new_routing(now)
        self._pending: dict[int, _Pending] = {}
        self._served = 0
        self._bad = 0
        self._ignored = 0
        self._invalid_tokens = 0
        self._refused = 0
        # Bounded: keys are the fixed set of error codes.
        self._refused_by_code: Counter[str] = Counter()
        self._timeouts = 0
        #: Our reachability checks: nonce -> (the node asked, deadline).
        self._reach_checks: dict[bytes, tuple[Address, float]] = {}
        self._probe_tokens = float(_PROBE_BURST)
        self._probe_refill_at = now
        self._probes_sent = 0
        self._probes_refused = 0

    # -- identity ------------------------------------------------------------

    @property
    def address(self) -> Address | None:
        """The address others see us at (configured, or the majority of replies)."""
        return self._address

    @property
    def node_id(self) -> bytes | None:
        return node_id_for(*self._address) if self._address else None

    @property
    def advertised_id(self) -> bytes | None:
        """The id we put in messages: only a persistent node that proved reachable
        sends one (others would store an unreachable contact and route into it)."""
        if self.persistent and self.reachable:
            return self.node_id
        return None

    @property
    def observations(self) -> dict[Address, Address]:
        """Where each recent responder saw us (responder → observed address)."""
        return dict(self._votes)

    def _new_routing(self, now: float) -> Routing:
        local = self.node_id or bytes(20)
        return Routing(local, now=now, rng=self._rng, k=self.config.k)

    def _learn_address(self, responder: Address, observed: Address, now: float) -> None:
        if self._votes.get(responder) == observed and self._address is not None:
            # The same vote again: the votes, and so their outcome, are as
            # they were when it was first counted (a re-set key keeps its place).
            return
        self._votes[responder] = observed
        if len(self._votes) > _MAX_VOTES:
            del self._votes[next(iter(self._votes))]
        # Loopback and link-local observations count only while there is no
        # other: a DHT node on our own host sees us at 127.0.0.1, which means
        # nothing to anyone else; one observation from elsewhere says where the
        # rest of the world finds us (a relay must not announce 127.0.0.1 to
        # others). Among wide addresses the majority rules as
        # before, so one liar cannot move a node seen at a wide address.
        votes = list(self._votes.values())
        wide = [a for a in votes if not _narrow(a[0])]
        winner, count = Counter(wide or votes).most_common(1)[0]
        leaves_narrow = self._address is None or (
            _narrow(self._address[0]) and not _narrow(winner[0]))
        if winner != self._address and (count >= 2 or leaves_narrow):
            old = self.routing
            if self._address is not None:
                self.reachable = False  # a new address must prove itself again
            self._address = winner
            # Our id follows our address: rebuild the table around the new id.
            self.routing = self._new_routing(now)
            for contact in old.contacts():
                self.routing.add(contact, now)

    # -- requests we send ----------------------------------------------------

    def make_request(
        self,
        command: Command,
        address: Address,
        now: float,
        *,
        target: bytes | None = None,
        token: bytes | None = None,
        value: Any = None,
    ) -> tuple[int, Outgoing]:
        """Build a request to ``address``; its answer comes back as a ResponseReceived.

        Raises:
            DhtUsageError: ``TOO_MANY_PENDING`` at the bound (wait for answers).
        """
        if len(self._pending) >= self.config.max_pending:
            raise DhtUsageError("too many requests in flight", code="TOO_MANY_PENDING")
        address = canonical_address(*address)
        tid = self._rng.randrange(1, MAX_TID)
        while tid in self._pending:
            tid = self._rng.randrange(1, MAX_TID)
        request = Request(tid, command, target, self.advertised_id, token, value)
        self._pending[tid] = _Pending(address, command, now + self.config.request_timeout_s)
        return tid, Outgoing(encode(request), address)

    def make_reach_check(self, address: Address, now: float) -> tuple[int, Outgoing]:
        """Ask the node at ``address`` to probe us from another socket (PING_BACK).

        :attr:`reachable` turns True when its PROBE arrives; the answer to the
        request itself says nothing about reachability.

        Raises:
            DhtUsageError: ``TOO_MANY_PENDING`` at the bound of checks or requests.
        """
        if len(self._reach_checks) >= _MAX_REACH_CHECKS:
            raise DhtUsageError("too many reachability checks in flight",
                                code="TOO_MANY_PENDING")
        nonce = self._rng.randbytes(20)
        tid, outgoing = self.make_request(Command.PING_BACK, address, now, target=nonce)
        deadline = now + 2 * self.config.request_timeout_s
        self._reach_checks[nonce] = (canonical_address(*address), deadline)
        return tid, outgoing

    def cancel(self, tid: int) -> None:
        """Forget a request (its answer, if it comes, is ignored)."""
        self._pending.pop(tid, None)

    def expire(self, now: float) -> list[int]:
        """Drop requests past their deadline; return their tids (the driver fails them)."""
        expired = [tid for tid, p in self._pending.items() if p.deadline <= now]
        for tid in expired:
            pending = self._pending.pop(tid)
            if pending.head is not None:
                self.routing.ping_result(pending.head, False, now)
        self._timeouts += len(expired)
        for nonce, (_, deadline) in list(self._reach_checks.items()):
            if deadline <= now:
                del self._reach_checks[nonce]
        return expired

    def maintenance(self, now: float) -> list[Outgoing]:
        """Housekeeping to run every few seconds: drop expired records and ping
        the bucket heads whose buckets have a newcomer waiting (Kademlia §2.2:
        the least recently seen contact is kept if it still answers)."""
        self.store.expire(now)
        out = []
        for head in self.routing.pings_to_send():
            if len(self._pending) >= self.config.max_pending:
                break
            tid, datagram = self.make_request(Command.PING, head.address, now)
            self._pending[tid].head = head.id
            out.append(datagram)
        return out

    def next_deadline(self) -> float | None:
        deadlines = [p.deadline for p in self._pending.values()]
        deadlines += [deadline for _, deadline in self._reach_checks.values()]
        return min(deadlines, default=None)

    # -- datagrams in ----------------------------------------------------------

    def receive_datagram(
        self, data: bytes, source: Address, now: float
    ) -> tuple[list[Outgoing], ResponseReceived | None]:
        """Handle one datagram; return what to send and, for an answer, the event."""
        try:
            source = canonical_address(*source)
            message = decode(data)
        except (DhtDecodeError, DhtUsageError):
            self._bad += 1
            return [], None
        if isinstance(message, Request):
            if message.command is Command.PROBE:
                self._on_probe(message.target, source)
                return [], None
            return self._serve(message, source, now), None
        return [], self._on_response(message, source, now)

    def _on_probe(self, nonce: bytes | None, source: Address) -> None:
        check = self._reach_checks.get(nonce) if nonce is not None else None
        # From the node we asked, the probe could be a plain reply that any
        # firewall lets through: only another source port proves anything.
        if check is None or check[0] == source:
            self._ignored += 1
            return
        del self._reach_checks[nonce]
        self.reachable = True

    def _on_response(self, response: Response, source: Address, now: float):
        pending = self._pending.get(response.tid)
        if pending is None or pending.address != source:
            self._ignored += 1  # unsolicited, late, or spoofed from another address
            return None
        if response.responder_id is not None and not id_matches(response.responder_id, *source):
            self._ignored += 1
            del self._pending[response.tid]
            return None
        del self._pending[response.tid]
        contact = Contact(node_id_for(*source), *source)
        if pending.head is not None:
            self.routing.ping_result(pending.head, True, now)
        if response.responder_id is not None:
            self.routing.add(contact, now)
        self._learn_address(source, response.observed, now)
        return ResponseReceived(response.tid, contact, response)

    # -- serving -------------------------------------------------------------

    def _serve(self, request: Request, source: Address, now: float) -> list[Outgoing]:
        self._served += 1
        if request.sender_id is not None and id_matches(request.sender_id, *source):
            self.routing.add(Contact(request.sender_id, *source), now)
        command = request.command
        # Closer contacts go in at construction: every Response is validated
        # when built, and replace() would validate it once more (hot path).
        closer: tuple[Contact, ...] = ()
        if command is Command.FIND_NODE:
            closer = self._closest(request.target, source)
        elif command is Command.LOOKUP:
            closer = self._closest(target_id(request.target), source)
        reply = Response(
            request.tid,
            self.advertised_id,
            source,
            self._tokens.issue(source[0], source[1], now),
            closer,
        )
        if command is Command.LOOKUP:
            return [Outgoing(self._lookup_reply(reply, request.target, source, now), source)]
        try:
            if command is Command.ANNOUNCE:
                reply = self._announce(reply, request, source, now)
            elif command is Command.UNANNOUNCE:
                reply = self._unannounce(reply, request, source, now)
        except DhtProtocolError as exc:
            self._refused += 1
            reply = replace(reply, error=exc.code)
        if reply.error is not None and command in (Command.ANNOUNCE, Command.UNANNOUNCE):
            self._refused_by_code[reply.error] += 1
        out = [Outgoing(encode(reply), source)]
        if command is Command.PING_BACK:
            probe = self._probe(request.target, source, now)
            if probe is not None:
                out.append(probe)
        return out

    def _probe(self, nonce: bytes | None, source: Address, now: float) -> Outgoing | None:
        elapsed = max(0.0, now - self._probe_refill_at)
        self._probe_refill_at = now
        self._probe_tokens = min(_PROBE_BURST, self._probe_tokens + elapsed * _PROBES_PER_S)
        if self._probe_tokens < 1:
            self._probes_refused += 1
            return None
        self._probe_tokens -= 1
        self._probes_sent += 1
        probe = Request(self._rng.randrange(1, MAX_TID), Command.PROBE, nonce)
        return Outgoing(encode(probe), source, from_probe_socket=True)

    def _closest(self, key: bytes | None, exclude: Address) -> tuple[Contact, ...]:
        """The contacts closest to ``key`` that the asker at ``exclude`` can reach.

        Never the asker itself, and never a loopback (or link-local) contact
        for an asker that is not on our host (link): it would dial its own.
        """
        if key is None:
            return ()
        count = min(self.config.k, MAX_CLOSER)
        # The asker is often in our table (and among the closest, in a small
        # network): leave it out up front rather than ask the table twice.
        host, port = exclude
        contacts = self.routing.closest(key, count=count, exclude=(node_id_for(host, port),))
        kept = [c for c in contacts
                if (c.port != port or c.host != host) and _visible_to(c.host, host)]
        if len(kept) < len(contacts) and len(contacts) == count:
            # Some were dropped: look a little further for replacements.
            contacts = self.routing.closest(key, count=2 * count,
                                            exclude=(node_id_for(host, port),))
            kept = [c for c in contacts
                    if (c.port != port or c.host != host) and _visible_to(c.host, host)][:count]
        return tuple(kept)

    def _lookup_reply(self, reply: Response, topic: bytes, source: Address, now: float) -> bytes:
        """The datagram answering a LOOKUP: ``reply`` and the records that fit."""
        # A reply holds about ten signed records. When a topic has more, each
        # reply carries a random sample, so that repeated lookups (and the k
        # nodes of one lookup) show every announcer, not the same newest ten.
        stored = self.store.get(topic, now, self.store.max_records_per_topic)
        # Records are signed, so they cannot be trimmed; leave out those of
        # which the asker could dial nothing (only loopback or link-local
        # addresses of a host or link it is not on, and no relays).
        stored = [r for r in stored if r.relays
                  or any(_visible_to(host, source[0]) for host, _ in r.addresses)]
        if len(stored) > 1:
            self._rng.shuffle(stored)
        records = [record.to_wire() for record in stored[: self.config.max_records_per_reply]]
        return encode_with_records(reply, records)[0]

    def _check_token(self, request: Request, source: Address, now: float) -> None:
        if request.token is None or not self._tokens.check(request.token, *source, now):
            self._invalid_tokens += 1
            raise DhtProtocolError("missing or invalid write token", code="INVALID_TOKEN")

    def _announce(self, reply: Response, request: Request, source: Address, now: float):
        self._check_token(request, source, now)
        record = PeerRecord.from_wire(request.value)
        verify_record(record, request.target, now=now)
        result = self.store.put(request.target, record, now, source[0])
        reply = replace(reply, closer=self._closest(target_id(request.target), source))
        if result.accepted:
            return reply
        if result is not PutResult.IGNORED_OLDER_SEQ:
            self._refused += 1
        return replace(reply, error=result.code)

    def _unannounce(self, reply: Response, request: Request, source: Address, now: float):
        self._check_token(request, source, now)
        value = request.value
        if not (isinstance(value, list) and len(value) == 3):
            raise DhtDecodeError("an unannounce carries [public_key, seq, signature]")
        public_key, seq, signature = value
        if not (isinstance(public_key, bytes) and isinstance(seq, int)
                and isinstance(signature, bytes) and not isinstance(seq, bool)):
            raise DhtDecodeError("an unannounce carries [public_key, seq, signature]")
        if not verify_unannounce(public_key, request.target, seq, signature):
            raise DhtProtocolError("unannounce signature does not verify", code="BAD_SIGNATURE")
        self.store.remove(request.target, public_key, seq)
        return reply

    def statistics(self) -> NodeStatistics:
        return NodeStatistics(
            requests_served=self._served,
            bad_datagrams=self._bad,
            ignored_responses=self._ignored,
            invalid_tokens=self._invalid_tokens,
            records_refused=self._refused,
            timeouts=self._timeouts,
            pending=len(self._pending),
            contacts=len(self.routing),
            records=len(self.store),
            probes_sent=self._probes_sent,
            probes_refused=self._probes_refused,
            reachable=self.reachable,
            refused_by_code=tuple(sorted(self._refused_by_code.items())),
        )
