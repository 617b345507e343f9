"""The swarm: topic discovery, one connection per peer, dialling through relays.

Theory of operation
-------------------
A :class:`Swarm` owns one TCP listener and one DHT node on the same port
number (TCP for streams, UDP for the DHT), both run by :meth:`Swarm.run`.

* ``join(topic, server=True)`` keeps a signed record of our key, our address
  and our relays announced on the topic; ``client=True`` looks the topic up
  (at once, then again after 0.5 s, 1 s, 2 s … up to ``lookup_max_s``) and
  dials every peer found. Two swarms that join at the same instant therefore
  meet on the second look, within about a second.
* The swarm also announces its key under the key's own topic, so
  ``connect(public_key)`` finds any running swarm by key alone.
* Dialling a record tries its addresses (all at once, ``direct_timeout_s``
  each), then its relays one by one: ask the relay for a pairing, attach to
  it, run the end-to-end handshake through it. The error names every address
  and relay tried and why each failed.
* With ``relays`` configured, the swarm keeps a reservation with each relay
  (reconnecting with backoff, e.g. after the relay restarts) and lists their
  keys in its records; a relay tells us when a dialler wants us, and we attach.
* One connection per remote key: a dial to a key that has a connection, or a
  dial in progress, returns that one. When both sides dial at once, both keep
  the connection that the larger key initiated (:mod:`._duplicates`).
* The firewall callback ``firewall(remote_key, how)`` runs before a dial and
  after an incoming handshake, before the connection carries any channel.
* A connection that ends is forgotten at once; if its peer belongs to a topic
  we look up, it is redialled after a backoff (:mod:`._peers`).

All tasks run in the nursery of :meth:`Swarm.run`; leaving it closes every
connection, unannounces and stops the DHT node.
"""

from __future__ import annotations

import errno
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

import trio

from ..connection import ChannelHandler, Connection, serve_channels
from ..dht import DhtError, DhtNode, PeerRecord, UdpTransport, record_topic_for_key
from ..errors import HandshakeError, P2PError
from ..keys import KeyPair, format_key
from ..mux import Channel
from ..noise import SecretStream
from ..relay import Incoming, Role, attach, keep_reservation, request_pair
from ._config import Address, Firewall, SwarmConfig
from ._connection import SwarmConnection
from ._duplicates import keep_new_connection
from ._errors import PeerNotFound, PeerRefused, PeerUnreachable, SwarmClosed, SwarmError
from ._metrics import SwarmMetrics
from ._peers import PeerTable

__all__ = ["Swarm"]

log = logging.getLogger(__name__)

_WILDCARDS = ("0.0.0.0", "::", "")
#: Binding TCP on port 0 then UDP on the same number can race another program
#: for the UDP port; try this many fresh ports before giving up.
_BIND_TRIES = 20


@dataclass(frozen=True)
class _Target:
    """Where a peer may be reached: direct addresses, then relays."""

    addresses: tuple[Address, ...]
    relays: tuple[bytes, ...]

    @classmethod
    def of(cls, record: PeerRecord) -> _Target:
        return cls(record.addresses, record.relays)


@dataclass
class _Attempt:
    done: trio.Event = field(default_factory=trio.Event)
    result: SwarmConnection | None = None
    error: SwarmError | None = None


@dataclass
class _Topic:
    topic: bytes
    server: bool
    client: bool
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    stopped: trio.Event = field(default_factory=trio.Event)
    announced: trio.Event = field(default_factory=trio.Event)
    refresh: trio.Event = field(default_factory=trio.Event)
    cycles_started: int = 0
    cycles_done: int = 0
    cycle_done: trio.Event = field(default_factory=trio.Event)


class Swarm:
    """Find peers by topic or key and keep one connection to each.

    Args:
        keypair: our identity.
        config: ports, bootstrap, relays, limits.
        handlers: channel handlers by protocol, listened for on every
            connection before it starts (as :func:`~p2p.connection.serve_tcp`).
        peer_handlers: the same, for handlers that must know whose channel it
            is: called as ``handler(channel, connection)``.
        on_connection: called in a task of its own for each new connection;
            cancelled when the connection closes.
        firewall: ``firewall(remote_key, how) -> bool``; False refuses the peer.
        rng: seeded randomness for tests.

    Start it with ``address = await nursery.start(swarm.run)``.
    """

    def __init__(
        self,
        keypair: KeyPair,
        *,
        config: SwarmConfig | None = None,
        handlers: Mapping[str, ChannelHandler] | None = None,
        peer_handlers: Mapping[str, PeerChannelHandler] | None = None,
        on_connection: Callable[[SwarmConnection], Awaitable[object]] | None = None,
        firewall: Firewall | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.keypair = keypair
        self.config = config or SwarmConfig()
        self.handlers = dict(handlers or {})
        self.peer_handlers = dict(peer_handlers or {})
        both = self.handlers.keys() & self.peer_handlers.keys()
        if both:
            raise ValueError(f"protocols with two handlers: {sorted(both)}")
        self.on_connection = on_connection
        self.firewall = firewall
        self._rng = rng or random.Random()
        self.peers = PeerTable(policy=self.config.backoff, rng=self._rng)
        self.connections: dict[bytes, SwarmConnection] = {}
        self.dht: DhtNode | None = None
        self.address: Address | None = None
        #: Relay keys holding a reservation for us right now.
        self.reserved_relays: set[bytes] = set()
        #: Set (and replaced) whenever ``reserved_relays`` changes.
        self.reservations_changed = trio.Event()
        self._dials: dict[bytes, _Attempt] = {}
        self._topics: dict[bytes, _Topic] = {}
        self._reconnects: set[bytes] = set()
        self._dial_slots = trio.Semaphore(self.config.max_parallel_dials)
        self._nursery: trio.Nursery | None = None
        self._relay_changed = trio.Event()
        self.metrics = SwarmMetrics(
            count_connections=lambda relayed: sum(
                c.relayed == relayed for c in self.connections.values()
            ),
            count_reservations=lambda: len(self.reserved_relays),
            live_bytes=self._live_bytes,
        )

    @property
    def public_key(self) -> bytes:
        return self.keypair.public_key

    # -- lifetime --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED):
        """Listen, join the DHT, keep reservations; until cancelled.

        Reports the bound ``(host, port)`` once the DHT node has bootstrapped.

        Raises:
            OSError: the port cannot be bound (in use, not a local address).
        """
        listener, transport = await self._bind()
        self.address = (self.config.host, transport.local_address[1])
        self.dht = DhtNode(transport, bootstrap=self.config.bootstrap,
                           persistent=self.config.dht_persistent,
                           reachable=self.config.dht_persistent and not self.config.bootstrap,
                           rng=self._rng)
        # The DHT node outlives everything else: on the way out, announcers
        # unannounce through it, so once it runs it is shielded and stops only
        # after they have finished. Not while it bootstraps: a cancel then
        # must stop it, or a swarm cancelled while starting would never end.
        dht_scope = trio.CancelScope()

        async def run_dht(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
            assert self.dht is not None
            with dht_scope:
                await self.dht.run(task_status=task_status)

        try:
            async with trio.open_nursery() as outer:
                await outer.start(run_dht)
                dht_scope.shield = True
                address = await outer.start(self._serve, listener, dht_scope)
                task_status.started(address)
        finally:
            self._nursery = None

    async def _serve(
        self, listener: trio.SocketListener, dht_scope: trio.CancelScope,
        task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Everything but the DHT node, which is stopped once this ends."""
        assert self.address is not None
        try:
            async with listener, trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(trio.serve_listeners, self._handle_tcp, [listener])
                if self.config.announce_key:
                    # Started means findable: connect(our key) works from here on.
                    await nursery.start(self._announce, record_topic_for_key(self.public_key),
                                        None)
                for relay_key in self.config.relays:
                    nursery.start_soon(self._keep_reservation, relay_key)
                log.info("swarm.started address=%s:%d key=%s relays=%d", *self.address,
                         format_key(self.public_key)[:12], len(self.config.relays))
                task_status.started(self.address)
        finally:
            dht_scope.cancel()

    async def _bind(self) -> tuple[trio.SocketListener, UdpTransport]:
        host, port = self.config.host, self.config.port
        for _ in range(_BIND_TRIES):
            listeners = await trio.open_tcp_listeners(port, host=host or None)
            listener = listeners[0]
            for extra in listeners[1:]:
                await extra.aclose()
            bound_port = listener.socket.getsockname()[1]
            try:
                transport = await UdpTransport.bind(host or "0.0.0.0", bound_port)
            except OSError as exc:
                await listener.aclose()
                if port != 0 or exc.errno != errno.EADDRINUSE:
                    raise
                continue
            return listener, transport
        raise OSError(errno.EADDRINUSE, f"no port free for both TCP and UDP on {host}")

    def _running_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise SwarmClosed("the swarm is not running: start Swarm.run() first")
        return self._nursery

    # -- topics ----------------------------------------------------------------

    def join(self, topic: bytes, *, server: bool = True, client: bool = True) -> None:
        """Announce on ``topic`` (server) and/or find and dial its peers (client).

        Joining again changes the modes. Returns at once; :meth:`flush` waits.
        """
        if not (server or client):
            raise ValueError("join needs server=True, client=True or both")
        nursery = self._running_nursery()
        current = self._topics.get(topic)
        if current is not None:
            if (current.server, current.client) == (server, client):
                return
            current.scope.cancel()
        state = _Topic(topic, server, client)
        self._topics[topic] = state
        nursery.start_soon(self._discover, state)

    async def leave(self, topic: bytes) -> None:
        """Stop announcing (unannouncing our record) and looking up ``topic``.

        Connections stay open; peers are no longer redialled for this topic.
        """
        state = self._topics.pop(topic, None)
        if state is None:
            await trio.lowlevel.checkpoint()
            return
        state.scope.cancel()
        await state.stopped.wait()
        self.peers.forget_topic(topic)
        for connection in self.connections.values():
            connection.topics.discard(topic)

    async def flush(self) -> None:
        """Wait until every joined topic has announced once and has run a lookup
        that started after this call, with the dials it queued settled."""
        waits = []
        for state in list(self._topics.values()):
            if state.server:
                waits.append(state.announced.wait)
            if state.client:
                waits.append(functools.partial(self._wait_cycle, state))
        async with trio.open_nursery() as nursery:
            for wait in waits:
                nursery.start_soon(wait)

    async def _wait_cycle(self, state: _Topic) -> None:
        target = state.cycles_started + 1
        state.refresh.set()
        # cycle_done is replaced each time it fires, and fires once more when
        # the topic is left, so this loop always wakes up.
        while state.cycles_done < target and not state.stopped.is_set():
            await state.cycle_done.wait()

    async def _discover(self, state: _Topic) -> None:
        try:
            with state.scope:
                async with trio.open_nursery() as nursery:
                    if state.server:
                        nursery.start_soon(self._announce, state.topic, state)
                    if state.client:
                        nursery.start_soon(self._lookup_loop, state)
        finally:
            state.stopped.set()
            state.cycle_done.set()

    def _announced_addresses(self) -> list[Address] | None:
        """Our TCP address for records; None follows the DHT's observed address
        (its UDP port is our TCP port)."""
        assert self.address is not None
        if self.config.announce_addresses is not None:
            return list(self.config.announce_addresses)
        host, port = self.address
        return None if host in _WILDCARDS else [(host, port)]

    async def _announce(
        self, topic: bytes, state: _Topic | None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Keep our record on ``topic`` (re-announced at once when relays change).

        Reports started after the first announce, stored or not."""
        assert self.dht is not None
        started = False
        while True:
            changed = self._relay_changed
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(functools.partial(
                        self.dht.announce, topic, self.keypair,
                        addresses=self._announced_addresses(),
                        relays=list(self.config.relays),
                    ))
                    if state is not None:
                        state.announced.set()
                    if not started:
                        started = True
                        task_status.started()
                    await changed.wait()
                    nursery.cancel_scope.cancel()
            except DhtError as exc:
                log.warning("swarm.announce_failed topic=%s code=%s", format_key(topic)[:12],
                            exc.code)
                if state is not None:
                    state.announced.set()  # flush() must not wait for ever
                if not started:
                    started = True
                    task_status.started()
                await trio.sleep(self.config.lookup_min_s * 4)

    async def _lookup_loop(self, state: _Topic) -> None:
        delay = self.config.lookup_min_s
        while True:
            state.refresh = trio.Event()
            state.cycles_started += 1
            try:
                await self._lookup_and_dial(state.topic)
            except DhtError as exc:
                log.info("swarm.lookup_failed topic=%s code=%s", format_key(state.topic)[:12],
                         exc.code)
            state.cycles_done += 1
            done, state.cycle_done = state.cycle_done, trio.Event()
            done.set()
            with trio.move_on_after(delay * (0.75 + 0.5 * self._rng.random())):
                await state.refresh.wait()
            delay = min(2 * delay, self.config.lookup_max_s)

    async def _lookup_and_dial(self, topic: bytes) -> None:
        assert self.dht is not None
        how = f"topic:{format_key(topic)}"
        async with trio.open_nursery() as dials:
            async for record in self.dht.lookup(topic):
                key = record.public_key
                if key == self.public_key:
                    continue
                self.peers.found(record, topic)
                existing = self.connections.get(key)
                if existing is not None:
                    existing.topics.add(topic)
                elif self.peers.may_dial(key, trio.current_time()) or key in self._dials:
                    dials.start_soon(self._dial_quietly, key, _Target.of(record), how, topic)

    async def _dial_quietly(
        self, key: bytes, target: _Target, how: str, topic: bytes | None
    ) -> None:
        try:
            connection = await self._dial(key, target, how)
        except SwarmError as exc:
            log.info("swarm.dial_failed peer=%s code=%s reason=%s", format_key(key)[:12],
                     exc.code, exc)
            return
        if topic is not None:
            connection.topics.add(topic)

    # -- dialling --------------------------------------------------------------

    async def connect(
        self, public_key: bytes, *, addresses: Iterable[Address] | None = None
    ) -> SwarmConnection:
        """The connection to ``public_key``: the existing one, or a new one found
        through the DHT (or at ``addresses``, skipping the DHT).

        Raises:
            PeerNotFound: the DHT has no record for the key.
            PeerUnreachable: no address or relay worked (each named, with why).
            PeerRefused: the firewall callback refused the key.
            SwarmClosed: the swarm is not running.
        """
        self._running_nursery()
        existing = self.connections.get(public_key)
        if existing is not None:
            await trio.lowlevel.checkpoint()
            return existing
        if addresses is not None:
            target = _Target(tuple(addresses), ())
        else:
            target = _Target.of(await self._find(public_key))
        return await self._dial(public_key, target, "connect")

    async def _find(self, public_key: bytes) -> PeerRecord:
        assert self.dht is not None
        record = None
        try:
            record = await self.dht.find_peer(public_key)
        except DhtError as exc:
            log.info("swarm.find_failed peer=%s code=%s", format_key(public_key)[:12], exc.code)
        if record is None:
            state = self.peers.get(public_key)
            if state is not None and state.record is not None:
                return state.record  # the last one we saw is better than nothing
            raise PeerNotFound(f"no record for peer {format_key(public_key)[:16]}… on the DHT")
        self.peers.found(record, None)
        return record

    def _allowed(self, key: bytes, how: str) -> bool:
        if self.firewall is None:
            return True
        try:
            return bool(self.firewall(key, how))
        except Exception:
            log.exception("swarm.firewall_failed peer=%s", format_key(key)[:12])
            return False

    async def _dial(self, key: bytes, target: _Target, how: str) -> SwarmConnection:
        if key == self.public_key:
            raise PeerRefused("refusing to connect to ourselves", code="SELF")
        existing = self.connections.get(key)
        if existing is not None:
            return existing
        attempt = self._dials.get(key)
        if attempt is not None:  # one dial per key: wait for the one in flight
            await attempt.done.wait()
            if attempt.result is not None:
                return attempt.result
            assert attempt.error is not None
            raise attempt.error
        attempt = self._dials[key] = _Attempt()
        self.peers.dialling(key)
        try:
            if not self._allowed(key, how):
                self.metrics.refused.labels("firewall").inc()
                raise PeerRefused(f"the firewall refused peer {format_key(key)[:16]}…")
            if len(self.connections) >= self.config.max_connections:
                raise SwarmError(f"at the limit of {self.config.max_connections} connections",
                                 code="TOO_MANY_CONNECTIONS")
            async with self._dial_slots:
                connection = await self._dial_target(key, target)
            attempt.result = connection
            return connection
        except SwarmError as exc:
            attempt.error = exc
            self.metrics.failures.labels(exc.code).inc()
            wait = self.peers.failed(key, trio.current_time(), exc.code)
            log.debug("swarm.dial_failed peer=%s code=%s retry_in=%.1f", format_key(key)[:12],
                      exc.code, wait)
            raise
        finally:
            del self._dials[key]
            if attempt.result is None and attempt.error is None:
                state = self.peers.get(key)
                if state is not None:
                    state.dialling = False  # cancelled: no verdict on the peer
            attempt.done.set()

    async def _dial_target(self, key: bytes, target: _Target) -> SwarmConnection:
        failures: list[tuple[str, str]] = []
        if target.addresses:
            self.metrics.attempts.labels("direct").inc()
            found = await self._dial_direct(key, target.addresses, failures)
            if found is not None:
                return found
        for relay_key in target.relays:
            if relay_key in (key, self.public_key):
                continue
            self.metrics.attempts.labels("relayed").inc()
            label = f"relay {format_key(relay_key)[:12]}"
            try:
                with trio.fail_after(self.config.relay_timeout_s):
                    return await self._dial_via_relay(key, relay_key)
            except trio.TooSlowError:
                failures.append((label, f"timed out after {self.config.relay_timeout_s} s"))
            except (P2PError, OSError) as exc:
                failures.append((label, _reason(exc)))
        raise PeerUnreachable(key, failures)

    async def _dial_direct(
        self, key: bytes, addresses: Iterable[Address], failures: list[tuple[str, str]]
    ) -> SwarmConnection | None:
        """Try every address at once; the first handshake wins, the rest are cancelled."""
        won: list[tuple[SecretStream, Address]] = []
        timeout = self.config.direct_timeout_s

        async def try_one(address: Address, cancel_rest: trio.CancelScope) -> None:
            host, port = address
            label = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            try:
                with trio.fail_after(timeout):
                    raw = await trio.open_tcp_stream(host, port)
                    stream = await SecretStream.initiator(
                        raw, self.keypair, key, config=self.config.connection.stream
                    )
            except trio.TooSlowError:
                failures.append((label, f"timed out after {timeout} s"))
                return
            except (OSError, HandshakeError) as exc:
                failures.append((label, _reason(exc)))
                return
            if won:  # another address won the race meanwhile
                await stream.aclose()
                return
            won.append((stream, address))
            cancel_rest.cancel()

        async with trio.open_nursery() as nursery:
            for address in list(addresses)[:8]:
                nursery.start_soon(try_one, address, nursery.cancel_scope)
        if not won:
            return None
        stream, address = won[0]
        return await self._adopt(stream, address, relay_key=None)

    async def _dial_via_relay(self, key: bytes, relay_key: bytes) -> SwarmConnection:
        relay = await self.connect(relay_key)
        if relay.relayed:
            raise SwarmError("the relay itself is only reachable through a relay",
                             code="RELAY_UNREACHABLE")
        ticket = await request_pair(relay.connection, key)
        raw = await attach(relay.remote_address, ticket.token, role=Role.INITIATOR,
                           timeout_s=ticket.timeout_s)
        stream = await SecretStream.initiator(raw, self.keypair, key,
                                              config=self.config.connection.stream)
        return await self._adopt(stream, relay.remote_address, relay_key=relay_key)

    # -- relays ----------------------------------------------------------------

    async def _keep_reservation(self, relay_key: bytes) -> None:
        """Hold a reservation with one relay for as long as the swarm runs."""
        delay = 1.0
        label = format_key(relay_key)[:12]
        while True:
            try:
                relay = await self.connect(relay_key)
                if relay.relayed:
                    raise SwarmError("relay reachable only through a relay",
                                     code="RELAY_UNREACHABLE")
                on_incoming = functools.partial(self._on_relay_incoming, relay_key,
                                                relay.remote_address)
                async with trio.open_nursery() as nursery:
                    await nursery.start(functools.partial(
                        keep_reservation, relay.connection, on_incoming
                    ))
                    self._set_reserved(relay_key, True)
                    log.info("swarm.reserved relay=%s address=%s:%d", label,
                             *relay.remote_address)
                    delay = 1.0
            except* (P2PError, OSError) as group:  # the reservation runs in a nursery
                log.info("swarm.reservation_lost relay=%s reason=%s", label,
                         _reason(group.exceptions[0]))
            finally:
                self._set_reserved(relay_key, False)
            await trio.sleep(delay * (0.5 + self._rng.random()))
            delay = min(2 * delay, self.config.reservation_retry_max_s)

    def _set_reserved(self, relay_key: bytes, held: bool) -> None:
        if (relay_key in self.reserved_relays) == held:
            return
        if held:
            self.reserved_relays.add(relay_key)
        else:
            self.reserved_relays.discard(relay_key)
        changed, self.reservations_changed = self.reservations_changed, trio.Event()
        changed.set()

    def _on_relay_incoming(self, relay_key: bytes, relay_address: Address,
                           incoming: Incoming) -> None:
        self._running_nursery().start_soon(
            self._accept_relayed, relay_key, relay_address, incoming
        )

    async def _accept_relayed(self, relay_key: bytes, relay_address: Address,
                              incoming: Incoming) -> None:
        peer = format_key(incoming.initiator)[:12]
        if not self._allowed(incoming.initiator, "relayed"):
            self.metrics.refused.labels("firewall").inc()
            log.info("swarm.refused peer=%s via=relay reason=firewall", peer)
            return
        try:
            with trio.fail_after(self.config.relay_timeout_s):
                raw = await attach(relay_address, incoming.token, role=Role.RESPONDER,
                                   timeout_s=self.config.relay_timeout_s)
                stream = await SecretStream.responder(raw, self.keypair,
                                                      config=self.config.connection.stream)
        except (P2PError, OSError, trio.TooSlowError) as exc:
            log.info("swarm.relayed_accept_failed peer=%s reason=%s", peer, _reason(exc))
            return
        if stream.remote_public_key != incoming.initiator:
            # The relay named one peer and another arrived: not who we agreed to meet.
            log.warning("swarm.relayed_key_mismatch expected=%s", peer)
            await stream.aclose()
            return
        self.metrics.accepted.labels("relayed").inc()
        await self._own_connection(stream, relay_address, relay_key)

    # -- incoming --------------------------------------------------------------

    async def _handle_tcp(self, raw: trio.SocketStream) -> None:
        try:
            host, port = raw.socket.getpeername()[:2]
        except OSError:
            await raw.aclose()
            return
        try:
            stream = await SecretStream.responder(raw, self.keypair,
                                                  config=self.config.connection.stream)
        except HandshakeError as exc:
            log.info("swarm.handshake_failed from=%s:%d code=%s", host, port, exc.code)
            return
        if not self._allowed(stream.remote_public_key, "incoming"):
            self.metrics.refused.labels("firewall").inc()
            log.info("swarm.refused peer=%s reason=firewall",
                     format_key(stream.remote_public_key)[:12])
            await stream.aclose()
            return
        self.metrics.accepted.labels("direct").inc()
        # This task owns the connection until it ends: trio.serve_listeners
        # closes the socket when the handler returns.
        await self._own_connection(stream, (host, port), None)

    # -- owning connections ----------------------------------------------------

    async def _adopt(
        self, stream: SecretStream, address: Address, *, relay_key: bytes | None
    ) -> SwarmConnection:
        """Make a connection of a fresh stream, settle duplicates, and run it in
        the swarm's nursery; return the connection that now serves its peer."""
        result = await self._running_nursery().start(
            self._own_connection, stream, address, relay_key
        )
        if result is None:
            raise SwarmError("connection refused by the swarm's limits", code="REFUSED")
        return result

    async def _own_connection(
        self, stream: SecretStream, address: Address, relay_key: bytes | None,
        *, task_status: trio.TaskStatus[SwarmConnection | None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        key = stream.remote_public_key
        peer = format_key(key)[:12]
        connection = SwarmConnection(
            Connection(stream, config=self.config.connection), address, relay_key=relay_key
        )
        state = self.peers.get(key)
        if state is not None:
            connection.topics |= state.topics
        existing = self.connections.get(key)
        if key == self.public_key:
            self.metrics.refused.labels("self").inc()
            await stream.aclose()
            task_status.started(None)
            return
        if existing is not None:
            if not keep_new_connection(
                self.public_key, key, existing_initiated_by_us=existing.is_initiator,
                new_initiated_by_us=connection.is_initiator,
            ):
                self.metrics.refused.labels("duplicate").inc()
                log.debug("swarm.duplicate_dropped peer=%s kept=existing", peer)
                await stream.aclose()
                task_status.started(existing)
                return
            log.debug("swarm.duplicate_dropped peer=%s kept=new", peer)
            del self.connections[key]
            connection.topics |= existing.topics
            self._running_nursery().start_soon(existing.aclose)
        elif len(self.connections) >= self.config.max_connections:
            self.metrics.refused.labels("full").inc()
            log.info("swarm.refused peer=%s reason=full", peer)
            await stream.aclose()
            task_status.started(None)
            return
        self.connections[key] = connection
        self.peers.connected(key, trio.current_time())
        channel_handlers: dict[str, ChannelHandler] = dict(self.handlers)
        for protocol, peer_handler in self.peer_handlers.items():
            channel_handlers[protocol] = functools.partial(_call_with_peer, peer_handler,
                                                   connection=connection)
        listeners = {protocol: connection.listen(protocol) for protocol in channel_handlers}
        path = "relayed" if relay_key else "direct"
        log.info("swarm.connected peer=%s path=%s address=%s:%d initiator=%s", peer, path,
                 *address, connection.is_initiator)
        handler_scope = trio.CancelScope()

        async def run_handlers() -> None:
            with handler_scope:
                async with trio.open_nursery() as handlers:
                    for protocol, listener in listeners.items():
                        handlers.start_soon(serve_channels, listener, channel_handlers[protocol],
                                            peer)
                    if self.on_connection is not None:
                        handlers.start_soon(self._call_on_connection, connection)

        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(connection.connection.run)
                nursery.start_soon(run_handlers)
                task_status.started(connection)
                await connection.connection.mux.wait_closed()
                self._forget(connection, path)
                # Channels still hold what arrived before the end: let handlers
                # read it (a peer that sent its last bytes and hung up must not
                # lose them), then cancel what is left.
                handler_scope.deadline = trio.current_time() + self.config.drain_timeout_s
        finally:
            with trio.CancelScope(shield=True):
                await connection.aclose()  # bounded by the stream's close timeout
            stats = stream.statistics()
            self.metrics.closed_bytes["sent"] += stats.bytes_sent
            self.metrics.closed_bytes["received"] += stats.bytes_received
            self._forget(connection, path)

    def _forget(self, connection: SwarmConnection, path: str) -> None:
        """The connection ended: free its slot at once (idempotent)."""
        if connection.closed.is_set():
            return
        connection.closed.set()
        key = connection.remote_public_key
        if self.connections.get(key) is connection:
            del self.connections[key]
            wait = self.peers.disconnected(key, trio.current_time())
            log.info("swarm.disconnected peer=%s path=%s", format_key(key)[:12], path)
            self._maybe_reconnect(key, wait)

    async def _call_on_connection(self, connection: SwarmConnection) -> None:
        assert self.on_connection is not None
        try:
            await self.on_connection(connection)
        except Exception:
            log.exception("swarm.on_connection_failed peer=%s",
                          format_key(connection.remote_public_key)[:12])

    def _maybe_reconnect(self, key: bytes, wait: float) -> None:
        """Redial a peer of a topic we look up, after ``wait`` seconds."""
        state = self.peers.get(key)
        client_topics = {t for t, s in self._topics.items() if s.client}
        if (state is None or not (state.topics & client_topics) or key in self._reconnects
                or self._nursery is None):
            return
        self._reconnects.add(key)
        self._nursery.start_soon(self._reconnect, key, wait)

    async def _reconnect(self, key: bytes, wait: float) -> None:
        try:
            await trio.sleep(wait)
            if key in self.connections or key in self._dials:
                return
            state = self.peers.get(key)
            topics = state.topics if state else set()
            if not topics & {t for t, s in self._topics.items() if s.client}:
                return
            try:
                # The peer may be back on a new port: look for its newest record.
                target = _Target.of(await self._find(key))
                connection = await self._dial(key, target, "reconnect")
            except SwarmError as exc:
                log.info("swarm.reconnect_failed peer=%s code=%s", format_key(key)[:12],
                         exc.code)
                state = self.peers.get(key)
                if state is not None:
                    self._reconnects.discard(key)
                    self._maybe_reconnect(key, max(0.0, state.next_attempt_at
                                                   - trio.current_time()))
                return
            connection.topics |= topics
        finally:
            self._reconnects.discard(key)

    # -- introspection ---------------------------------------------------------

    def _live_bytes(self) -> Iterable[tuple[int, int]]:
        for connection in list(self.connections.values()):
            stats = connection.connection.stream.statistics()
            yield stats.bytes_sent, stats.bytes_received

    def topics(self) -> list[bytes]:
        return list(self._topics)


PeerChannelHandler = Callable[[Channel, SwarmConnection], Awaitable[object]]


async def _call_with_peer(handler: PeerChannelHandler, channel: Channel, *,
                          connection: SwarmConnection) -> object:
    return await handler(channel, connection)


def _reason(exc: BaseException) -> str:
    """One line saying why an attempt failed."""
    if isinstance(exc, P2PError):
        return f"{exc.code}: {exc}"
    if isinstance(exc, OSError):
        causes = getattr(exc.__cause__, "exceptions", None) or [exc]
        first = causes[0]
        if isinstance(first, ConnectionRefusedError):
            return "connection refused"
        return getattr(first, "strerror", None) or str(first) or type(first).__name__
    return str(exc) or type(exc).__name__

