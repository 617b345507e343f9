"""What a DHT node does with its requests: join, stay reachable, look up, announce.

:class:`DhtNode` is the trio driver of a node: on the datagram I/O and request
matching of :class:`~._endpoint.DhtEndpoint` it bootstraps, checks that it is
reachable, and walks the key space with :class:`~._lookup.IterativeLookup`, α
queries at a time, for lookups, announces and bucket refreshes.

Announcing (:meth:`DhtNode.announce`) looks the topic up to find its k closest
nodes and collect their write tokens, then sends each a signed record; it
repeats every 5 to 10 minutes (jittered) with a higher ``seq``, so records never
lapse while the announcer lives, and unannounces when cancelled. A persistent
node that is itself among the topic's closest nodes (always so in a network of
one, such as a relay started without bootstrap nodes, which others bootstrap
from) also keeps the record in its own store, since lookups ask it too; and
:meth:`DhtNode.lookup` reads its own store before it walks.

Addresses announced by default (:meth:`DhtNode.announce` without
``addresses``): the address the DHT observes us at, and, for a node bound to a
wildcard, its interface addresses and loopback with its bound port
(:func:`p2p.addresses.announceable`; upstream's ``shareLocalAddress``), so a
node that its DHT sees only over loopback still names an address that other
hosts can use, and storing nodes and readers drop what they cannot use.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

import trio

from .. import addresses as _addresses
from ..keys import KeyPair, format_key
from ._contact import Contact, canonical_address
from ._endpoint import Address, DhtEndpoint
from ._errors import DhtError, DhtProtocolError, DhtUsageError
from ._lookup import IterativeLookup, LookupConfig, LookupStatistics
from ._messages import Command, Response
from ._nat import NatType, classify_nat
from ._node import NodeConfig
from ._records import (
    MAX_RECORD_TTL_S,
    PeerRecord,
    record_topic_for_key,
    sign_record,
    sign_unannounce,
    verify_record,
)
from ._routing import target_id
from ._transport import DatagramTransport

__all__ = ["DhtNode"]

log = logging.getLogger(__name__)

#: Re-announce between these bounds (HyperDHT: 10 min + 0-2 min; our records
#: live 20 min, so two refreshes fit in one life even if one is lost).
REANNOUNCE_MIN_S = 300.0
REANNOUNCE_MAX_S = 600.0
#: Tries per bootstrap node beyond the first (a lost datagram must not leave a
#: node alone; HyperDHT retries every request 3 times).
BOOTSTRAP_RETRIES = 2
#: Distances (top bits of the id) a joining node looks into besides its own
#: neighbourhood, so its table knows some nodes in each far part of the space.
JOIN_REFRESH_DEPTH = 6
#: Records are announced to live this long (the store's bound is 20 minutes).
RECORD_TTL_S = MAX_RECORD_TTL_S
#: Nodes asked at once to probe us in a reachability check.
REACH_CHECKERS = 3
#: A node that failed its check tries again after this long, doubling up to the max.
RECHECK_MIN_S = 30.0
RECHECK_MAX_S = 600.0


class DhtNode(DhtEndpoint):
    """A DHT node over one datagram transport.

    Args:
        transport: a bound UDP or in-memory transport; owned by the node.
        bootstrap: addresses of nodes to join through.
        persistent: True for nodes others may store (bootstrap and plain
            nodes), once they pass the reachability check; ephemeral nodes
            (clients) only query.
        reachable: True to skip the check (a bootstrap node: the operator
            vouches for it, and the first node has nobody to ask).
        config: protocol parameters.
        rng: seeded randomness for tests.
        interfaces: returns this host's interface addresses, announced by a
            node bound to a wildcard (default
            :func:`p2p.addresses.interface_addresses`; tests pass their own).

    Start it with ``await nursery.start(node.run)``; it bootstraps before
    ``started`` is reported.
    """

    def __init__(
        self,
        transport: DatagramTransport,
        *,
        bootstrap: Iterable[Address] = (),
        persistent: bool = False,
        reachable: bool = False,
        config: NodeConfig | None = None,
        rng: random.Random | None = None,
        interfaces: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        bootstrap_addresses = [canonical_address(*a) for a in bootstrap]
        super().__init__(
            transport, persistent=persistent, reachable=reachable, config=config, rng=rng
        )
        self._interfaces = interfaces
        self.bootstrap_addresses = bootstrap_addresses
        self._nursery: trio.Nursery | None = None
        #: Statistics of the most recent iterative query (hops, messages).
        self.last_lookup: LookupStatistics | None = None
        #: Iterative queries started (lookups, announces, bootstrap, refreshes).
        self.walks = 0
        self.lookup_config = LookupConfig(
            k=self.config.k, request_timeout_s=self.config.request_timeout_s
        )

    # -- lifetime --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled: receive loop, timers, then bootstrap."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._receive_loop)
                nursery.start_soon(self._timer_loop)
                if self.bootstrap_addresses:
                    await self.bootstrap()
                if self.core.persistent:
                    nursery.start_soon(self._reachability_loop)
                task_status.started()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self._close_transports()

    async def bootstrap(self) -> None:
        """Join through the bootstrap addresses: ask them, check that we are
        reachable (if we want to be persistent), then walk to our own id."""
        async with trio.open_nursery() as nursery:
            for address in self.bootstrap_addresses:
                nursery.start_soon(self._quiet_request, Command.PING, address)
        # Before the walk, so that the walk already carries our id and the
        # nodes near us store us (a node found unreachable walks as a client).
        await self.check_reachable()
        own = self.core.node_id or self._rng.randbytes(20)
        await self.find_node(own)
        # Kademlia's join (paper 2.3) refreshes the buckets farther than the
        # nearest neighbour: a walk toward our own id only meets our own
        # neighbourhood, and a node that knows nobody in the other half of the
        # key space strands every lookup that starts from it there.
        async with trio.open_nursery() as nursery:
            for key in self._far_ids(own, JOIN_REFRESH_DEPTH):
                nursery.start_soon(self._refresh_bucket, key)

    async def _quiet_request(self, command: Command, address: Address) -> None:
        try:
            await self.request(command, address, retries=BOOTSTRAP_RETRIES)
        except DhtError as exc:
            log.debug("dht.bootstrap_failed address=%s code=%s", address, exc.code)

    # -- reachability ----------------------------------------------------------

    async def check_reachable(self) -> bool:
        """Ask a few known nodes to probe us from another socket; True if one got through.

        Does nothing (and returns the current state) for an ephemeral node, a
        node already reachable, or one that does not know its address yet.
        """
        core = self.core
        if not core.persistent or core.reachable or core.address is None:
            return core.reachable
        own = core.node_id or bytes(20)
        checkers = [c.address for c in core.routing.closest(own, count=REACH_CHECKERS)]
        checkers += [a for a in self.bootstrap_addresses if a not in checkers]
        became = self._became_reachable
        with trio.move_on_after(2 * self.config.request_timeout_s):
            async with trio.open_nursery() as nursery:
                for address in checkers[:REACH_CHECKERS]:
                    nursery.start_soon(self._ask_for_probe, address)
                await became.wait()
                nursery.cancel_scope.cancel()
        log.info("dht.reachability address=%s reachable=%s", core.address, core.reachable)
        return core.reachable

    async def _reachability_loop(self) -> None:
        """Keep a persistent node checking until it is reachable, and again after
        its address changes; once it is, walk to our own id so the nodes near us
        hear our id and store us."""
        delay = RECHECK_MIN_S
        while True:
            changed = self._address_changed
            if not self.core.reachable and self.core.address is not None:
                if await self.check_reachable():
                    delay = RECHECK_MIN_S
                    await self._refresh_bucket(self.core.node_id or bytes(20))
                    continue
                with trio.move_on_after(delay):
                    await changed.wait()
                delay = min(2 * delay, RECHECK_MAX_S)
            else:
                await changed.wait()

    # -- iterative queries -----------------------------------------------------

    def _seeds(self, key: bytes) -> list[Contact]:
        seeds = self.core.routing.closest(key, count=self.config.k)
        if len(seeds) < self.config.k:
            known = {c.address for c in seeds}
            seeds += [Contact.at(*a) for a in self.bootstrap_addresses if a not in known]
        return seeds

    async def _walk(self, key: bytes, command: Command, target: bytes, on_answer=None):
        """Run one iterative lookup; call ``on_answer(contact, response)`` per answer.

        Returns:
            The finished :class:`IterativeLookup` (its closest answered contacts).
        """
        lookup = IterativeLookup(
            key, self._seeds(key), config=self.lookup_config, local_id=self.core.node_id
        )
        self.walks += 1
        # The walk is one task: requests go out from here and their ends come
        # back through callbacks run by the receive and timer loops, which queue
        # them and wake us. No task, event or cancel scope per request (issue
        # 26: py-spy put a sixth of a lookup's CPU, both sides counted, in the
        # per-request tasks and their hand-offs).
        ended: deque[tuple[Contact, Contact | None, Response | None]] = deque()
        in_flight: dict[bytes, int] = {}  # contact id -> tid
        wake = trio.Event()

        def answered_by(asked: Contact):
            def on_end(contact: Contact | None, response: Response | None) -> None:
                in_flight.pop(asked.id, None)
                ended.append((asked, contact, response))
                wake.set()
            return on_end

        try:
            while True:
                for contact in lookup.next_queries(self.now()):
                    try:
                        in_flight[contact.id] = await self.send_request(
                            command, contact.address, answered_by(contact), target=target
                        )
                    except DhtUsageError:  # TOO_MANY_PENDING: this one fails, others go on
                        lookup.on_failure(contact.id)
                if lookup.finished:
                    break
                if not ended:
                    await wake.wait()
                    wake = trio.Event()
                while ended:
                    asked, contact, response = ended.popleft()
                    if response is None or contact is None:
                        lookup.on_failure(asked.id)
                        continue
                    lookup.on_response(asked.id, response.closer)
                    if on_answer is not None:
                        await on_answer(contact, response)
        finally:
            for tid in in_flight.values():
                self.forget_request(tid)
        self.last_lookup = lookup.statistics()
        return lookup

    def _far_ids(self, own: bytes, depth: int) -> list[bytes]:
        """One random id at each distance 2**159, 2**158, ... from ``own``."""
        own_int = int.from_bytes(own, "big")
        ids = []
        for bit in range(depth):
            flip = 1 << (159 - bit)
            low = self._rng.getrandbits(159 - bit)
            prefix = (own_int ^ flip) >> (159 - bit) << (159 - bit)
            ids.append((prefix | low).to_bytes(20, "big"))
        return ids

    async def _refresh_bucket(self, key: bytes) -> None:
        try:
            await self.find_node(key)
        except DhtError as exc:
            log.debug("dht.refresh_failed code=%s", exc.code)

    def _bucket_stale(self, key: bytes) -> None:
        """The timer loop found a stale bucket: walk to ``key``, in its range."""
        self._running_nursery().start_soon(self._refresh_bucket, key)

    async def find_node(self, node_id: bytes) -> list[Contact]:
        """The k closest nodes to ``node_id`` that answered."""
        lookup = await self._walk(node_id, Command.FIND_NODE, node_id)
        return lookup.closest()

    async def lookup(self, topic: bytes) -> AsyncIterator[PeerRecord]:
        """Yield verified records for ``topic`` as they arrive, once per public key
        and seq: a key is yielded again only with a newer record (a peer that
        moved, whose old record some nodes still hold; keep the latest).

        Records that fail verification (signature, topic, expiry) are dropped.
        The iterator ends when the lookup settles. The walk runs in the node's
        own nursery (an async generator must not yield inside one); leaving the
        iteration early cancels it. Use ``contextlib.aclosing`` to leave early.

        Raises:
            DhtUsageError: ``NOT_RUNNING`` if :meth:`run` is not running.
        """
        send, receive = trio.open_memory_channel[PeerRecord](math.inf)
        seen: dict[bytes, int] = {}  # key -> highest seq yielded
        scope = trio.CancelScope()

        def take(wires: object, source: str) -> None:
            for wire in wires if isinstance(wires, list | tuple) else ():
                if _yielded_already(wire, seen):
                    continue  # most of the k replies repeat what an earlier one carried
                try:
                    record = PeerRecord.from_wire(wire)
                    verify_record(record, topic, now=self.now())
                except DhtProtocolError as exc:
                    log.debug("dht.record_dropped from=%s code=%s", source, exc.code)
                    continue
                if record.seq > seen.get(record.public_key, -1):
                    seen[record.public_key] = record.seq
                    try:
                        send.send_nowait(record)
                    except trio.BrokenResourceError:
                        scope.cancel()  # the consumer left

        async def on_answer(contact: Contact, response: Response) -> None:
            take(response.value, contact.host)

        async def walk() -> None:
            with scope:
                async with send:
                    # Our own store first: a walk never asks the node itself.
                    take([r.to_wire() for r in self.core.store.get(topic, self.now())], "self")
                    await self._walk(target_id(topic), Command.LOOKUP, topic, on_answer)

        self._running_nursery().start_soon(walk)
        try:
            async with receive:
                async for record in receive:
                    yield record
        finally:
            scope.cancel()

    def _running_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise DhtUsageError("start DhtNode.run() first", code="NOT_RUNNING")
        return self._nursery

    async def find_peer(self, public_key: bytes) -> PeerRecord | None:
        """The newest record ``public_key`` announced under its own topic, if any.

        Runs the whole lookup: a node may still hold a record from before the
        peer restarted on another port, and the newest one wins."""
        topic = record_topic_for_key(public_key)
        newest: PeerRecord | None = None
        async with contextlib.aclosing(self.lookup(topic)) as records:
            async for record in records:
                if record.public_key == public_key and (newest is None
                                                         or record.seq > newest.seq):
                    newest = record
        return newest

    # -- announcing ------------------------------------------------------------

    async def announce_once(
        self,
        topic: bytes,
        keypair: KeyPair,
        *,
        addresses: Iterable[Address],
        relays: Iterable[bytes] = (),
        seq: int,
    ) -> int:
        """Store a signed record on the topic's k closest nodes; return how many took it."""
        record = sign_record(
            keypair,
            topic,
            addresses=list(addresses),
            relays=list(relays),
            seq=seq,
            expires=int(self.now() + RECORD_TTL_S),
        )
        tokens: dict[Address, bytes] = {}

        async def on_answer(contact: Contact, response: Response) -> None:
            tokens[contact.address] = response.token

        lookup = await self._walk(target_id(topic), Command.LOOKUP, topic, on_answer)
        stored = 0
        if (self._stores_locally(target_id(topic), lookup.closest())
                and self.core.store.put(topic, record, self.now()).accepted):
            stored += 1

        async def commit(contact: Contact) -> None:
            nonlocal stored
            token = tokens.get(contact.address)
            if token is None:
                return
            try:
                _, response = await self.request(
                    Command.ANNOUNCE, contact.address, target=topic, token=token,
                    value=record.to_wire(),
                )
            except DhtError:
                return
            if response.error is None:
                stored += 1

        async with trio.open_nursery() as nursery:
            for contact in lookup.closest():
                nursery.start_soon(commit, contact)
        log.debug("dht.announced topic=%s stored=%d", format_key(topic)[:12], stored)
        return stored

    def _stores_locally(self, key: bytes, closest: Sequence[Contact]) -> bool:
        """True if our own store should hold a record we announce under ``key``.

        A persistent node serves lookups; when it is one of the k nodes
        closest to the key (or the walk found fewer than k, as in a network of
        one), lookups for the key ask it, so it must hold the record too.
        """
        if not self.core.persistent:
            return False
        if len(closest) < self.config.k:
            return True
        own = self.core.node_id
        if own is None:
            return False
        distance = int.from_bytes(own, "big") ^ int.from_bytes(key, "big")
        farthest = max(int.from_bytes(c.id, "big") ^ int.from_bytes(key, "big")
                       for c in closest)
        return distance < farthest

    def nat_type(self) -> NatType:
        """The NAT this node's socket is behind, from where DHT nodes saw it
        (:func:`~._nat.classify_nat`)."""
        return classify_nat(self.core.observations, local_port=self.transport.local_address[1],
                            local_hosts=self.local_hosts())

    def local_hosts(self) -> list[str]:
        """The hosts this node names besides its observed address.

        Bound to a wildcard: the interface addresses of its family (``::``
        also covers IPv4), then loopback. Bound to one address: that one.
        """
        host = self.transport.local_address[0]
        if host not in ("0.0.0.0", "::"):
            return [host]
        found = self._interface_hosts()
        v6 = host == "::"
        hosts = [h for h in found if v6 or ":" not in h]
        return list(dict.fromkeys([*hosts, "127.0.0.1", *(["::1"] if v6 else [])]))

    def dial_order(self, addresses: Iterable[Address]) -> list[Address]:
        """A record's addresses that this node's host can use, best first.

        Drops loopback and link-local addresses unless the DHT sees us in that
        scope too (:func:`p2p.addresses.usable_by` with our observed address),
        then puts this host's and its subnets' addresses first, public ones
        next, other private ones last (:func:`p2p.addresses.order_for_dialer`).
        For addresses read from records; ones a user typed need no filter.
        """
        viewer = self.address[0] if self.address is not None else None
        own = self._interface_hosts()
        return _addresses.order_for_dialer(_addresses.usable_by(addresses, viewer), own)

    def _interface_hosts(self) -> list[str]:
        interfaces = self._interfaces or _addresses.interface_addresses
        try:
            return list(interfaces())
        except Exception:  # a user's callable; announcing and dialling must go on
            log.exception("dht.interfaces_failed")
            return []

    def announce_addresses(self) -> list[Address]:
        """What :meth:`announce` names without ``addresses``: see the module doc.

        Raises:
            DhtUsageError: ``NO_ADDRESS``; nothing is known to announce.
        """
        port = self.transport.local_address[1]
        found = _addresses.announceable(self.address, self.local_hosts(), port)
        if not found:
            raise DhtUsageError("no address to announce (not bootstrapped?)", code="NO_ADDRESS")
        return found

    async def unannounce(self, topic: bytes, keypair: KeyPair, seq: int) -> None:
        """Ask the topic's closest nodes to drop our record (signed)."""
        signature = sign_unannounce(keypair, topic, seq)
        value = [keypair.public_key, seq, signature]
        tokens: dict[Address, bytes] = {}

        async def on_answer(contact: Contact, response: Response) -> None:
            tokens[contact.address] = response.token

        self.core.store.remove(topic, keypair.public_key, seq)
        await self._walk(target_id(topic), Command.LOOKUP, topic, on_answer)
        async with trio.open_nursery() as nursery:
            for address, token in tokens.items():
                nursery.start_soon(self._unannounce_at, address, topic, token, value)

    async def _unannounce_at(self, address, topic, token, value) -> None:
        try:
            await self.request(Command.UNANNOUNCE, address, target=topic, token=token, value=value)
        except DhtError:
            pass

    async def announce(
        self,
        topic: bytes,
        keypair: KeyPair,
        *,
        addresses: Iterable[Address] | None = None,
        relays: Iterable[bytes] = (),
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep ``keypair`` announced on ``topic`` until cancelled, then unannounce.

        Reports how many nodes stored the first announce through ``task_status``.
        Each refresh carries a higher ``seq`` (stores keep only the newest).
        Without ``addresses`` the record names this node's own address (and,
        bound to a wildcard, its interface addresses: :meth:`announce_addresses`),
        and a change of that address is re-announced at once.
        The unannounce on cancellation needs the node itself still running:
        cancel the announcer first, then the node.
        """
        follow_own_address = addresses is None
        fixed = list(addresses) if addresses is not None else []

        def current() -> list[Address]:
            if not follow_own_address:
                return fixed  # may be empty: a peer reachable only through its relays
            return self.announce_addresses()

        seq = int(self.now() * 1000)  # grows across restarts of the announcer too
        try:
            stored = await self.announce_once(
                topic, keypair, addresses=current(), relays=relays, seq=seq
            )
            task_status.started(stored)
            while True:
                # Refresh on the timer, or at once when our address changed (a
                # record naming the old address would send peers nowhere).
                changed = self._address_changed
                with trio.move_on_after(self._rng.uniform(REANNOUNCE_MIN_S, REANNOUNCE_MAX_S)):
                    await changed.wait()
                seq += 1
                await self.announce_once(
                    topic, keypair, addresses=current(), relays=relays, seq=seq
                )
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.unannounce(topic, keypair, seq)


def _yielded_already(wire: object, seen: dict[bytes, int]) -> bool:
    """True if a lookup already yielded this wire record's key at its seq or a
    newer one, so it would drop the record whatever it holds: it is not worth
    decoding and verifying (the record's own checks come after, for the rest)."""
    if type(wire) is not list or len(wire) < 4:
        return False
    public_key, seq = wire[0], wire[3]
    if type(public_key) is not bytes or type(seq) is not int:
        return False
    return seen.get(public_key, -1) >= seq
