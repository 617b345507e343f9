"""The swarm: one peer on the network, its services, topics, dials and relays.

Theory of operation
-------------------
A :class:`Swarm` is one peer (one identity) with one stream listener and one
DHT node on the same port number (streams for connections, datagrams for the
DHT), both taken from its :class:`~p2p.net.Network` (real sockets by default,
an in-memory network in tests) and run by :meth:`Swarm.run`. Its parts:

* :class:`~p2p.host.PeerHost` (``swarm.host``): the one accept path, one
  connection per peer, and the **services** a daemon plugs in
  (:meth:`add_service`, :meth:`remove_service`) with their firewalls;
* :class:`~._topics.Topics`: joined topics, announcing and looking up;
* :class:`~._dialer.Dialer`: ``connect``, dialling addresses then relays, reconnects;
* :class:`~._reservations.Reservations`: reservations with our relays, and
  peers that reach us through them;
* :class:`~._peers.PeerTable`: the I/O-free table of peers, backoff and skipping.

The swarm also announces its key under the key's own topic, so
``connect(public_key)`` finds any running swarm by key alone.

All tasks run in the nursery of :meth:`Swarm.run`; leaving it closes every
connection, unannounces and stops the DHT node.
"""

from __future__ import annotations

import errno
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from ..connection import Address, Connection
from ..dht import DhtNode, record_topic_for_key
from ..dht._nat import NatType
from ..host import Firewall, HostConfig, PeerHost, Reserved, Service
from ..keys import KeyPair, format_key
from ..lan import LanDiscovery
from ..net import Network, SocketNetwork
from ..punch import HolePunchService, PunchMetrics
from ._config import SwarmConfig
from ._dialer import Dialer
from ._errors import SwarmClosed
from ._metrics import SwarmMetrics
from ._peers import PeerTable
from ._reservations import Reservations
from ._topics import Topics

__all__ = ["Swarm", "SwarmStatistics"]

log = logging.getLogger(__name__)

_WILDCARDS = ("0.0.0.0", "::", "")
#: Binding streams on port 0 then datagrams on the same number can race another
#: program for the UDP port; try this many fresh ports before giving up.
_BIND_TRIES = 20


class Swarm:
    """Find peers by topic or key, keep one connection to each, serve services.

    Args:
        keypair: our identity.
        config: ports, bootstrap, relays, limits.
        network: where sockets come from (``SocketNetwork()`` by default).
        services: served on every connection from the start (more can be
            added and removed while the swarm runs).
        firewall: ``firewall(remote_key, how) -> bool``; False refuses the peer.
        rng: seeded randomness for tests.

    Start it with ``address = await nursery.start(swarm.run)``.
    """

    def __init__(
        self,
        keypair: KeyPair,
        *,
        config: SwarmConfig | None = None,
        network: Network | None = None,
        services: Iterable[Service] = (),
        firewall: Firewall | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.keypair = keypair
        self.config = config or SwarmConfig()
        self.network = network if network is not None else SocketNetwork()
        self.rng = rng or random.Random()
        self.peers = PeerTable(policy=self.config.backoff, rng=self.rng)
        self.metrics = SwarmMetrics(
            count_connections=lambda path: sum(
                c.path == path for c in self.connections.values()
            ),
            count_reservations=lambda: len(self.reservations.reserved),
        )
        self.host = PeerHost(
            keypair,
            config=HostConfig(connection=self.config.connection,
                              max_connections=self.config.max_connections,
                              max_handshakes=self.config.max_handshakes,
                              max_handshakes_per_address=self.config.max_handshakes_per_address,
                              first_bytes_timeout_s=self.config.first_bytes_timeout_s,
                              handshake_timeout_s=self.config.handshake_timeout_s,
                              reserved_connections=min(self.config.reserved_connections,
                                                       self.config.max_connections - 1),
                              max_connections_per_address=self.config.max_connections_per_address,
                              stranger_evict_after_s=self.config.stranger_evict_after_s,
                              drain_timeout_s=self.config.drain_timeout_s),
            metrics_prefix="swarm", registry=self.metrics.registry,
            on_connected=self._connected, on_disconnected=self._disconnected,
        )
        self.metrics.count_bytes(self.host.metrics.closed_bytes, self.host.live_bytes)
        if firewall is not None:
            self.host.add_firewall(firewall)
        for service in services:
            self.host.add_service(service)
        #: Hole punching on relayed connections (``config.hole_punching``).
        self.punch: HolePunchService | None = None
        # Punch sockets are the host's real TCP sockets: not on a simulated network.
        if self.config.hole_punching is not None and isinstance(self.network, SocketNetwork):
            self.punch = HolePunchService(
                local_hosts=self._punch_hosts, nat_type=self._nat_type,
                config=self.config.hole_punching,
                metrics=PunchMetrics(self.metrics.registry))
            self.host.add_service(self.punch)
        self.topics = Topics(self)
        self.dialer = Dialer(self)
        self.reservations = Reservations(self)
        self.dht: DhtNode | None = None
        self.address: Address | None = None
        #: LAN discovery, while it runs (``config.lan``).
        self.lan: LanDiscovery | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def public_key(self) -> bytes:
        return self.keypair.public_key

    @property
    def connections(self) -> dict[bytes, Connection]:
        """Live connections by remote key (one per peer)."""
        return self.host.connections

    @property
    def reserved_relays(self) -> set[bytes]:
        """Relay keys holding a reservation for us right now."""
        return self.reservations.reserved

    @property
    def reservations_changed(self) -> trio.Event:
        """Set (and replaced) whenever ``reserved_relays`` changes."""
        return self.reservations.changed

    # -- services --------------------------------------------------------------

    def add_service(self, service: Service) -> None:
        """Serve ``service`` on every connection, live ones included (see
        :meth:`p2p.host.PeerHost.add_service`)."""
        self.host.add_service(service)

    def remove_service(self, protocol: str) -> None:
        """Stop serving ``protocol`` on every connection."""
        self.host.remove_service(protocol)

    def add_firewall(self, firewall: Firewall) -> object:
        """Add a firewall every peer must pass; returns a function that removes it."""
        return self.host.add_firewall(firewall)

    def add_reserved(self, reserved: Reserved | Iterable[bytes]) -> Callable[[], None]:
        """Keep connection slots for the peers ``reserved`` names (a predicate on
        the key or a set of keys: the keys this daemon is configured to serve);
        see :meth:`p2p.host.PeerHost.add_reserved`. Returns its remover."""
        return self.host.add_reserved(reserved)

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
                           interfaces=self.network.interface_hosts, rng=self.rng)
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
                if self.config.dht_in_background:
                    # _serve's way out cancels the scope itself, shield or not.
                    dht_scope.shield = True
                    outer.start_soon(run_dht)
                else:
                    await outer.start(run_dht)
                    dht_scope.shield = True
                address = await outer.start(self._serve, listener, dht_scope)
                task_status.started(address)
        finally:
            self._nursery = None

    async def _serve(
        self, listener, dht_scope: trio.CancelScope,
        task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Everything but the DHT node, which is stopped once this ends."""
        assert self.address is not None
        try:
            async with trio.open_nursery() as nursery:
                try:
                    await nursery.start(self.host.run)
                    await nursery.start(self.host.serve_listener, listener)
                    self._nursery = nursery
                    if self.config.announce_key:
                        # Started means findable: connect(our key) works from here on.
                        await nursery.start(self.topics.announce,
                                            record_topic_for_key(self.public_key), None)
                    for relay_key in self.config.relays:
                        nursery.start_soon(self.reservations.keep, relay_key)
                    if self.config.lan is not None:
                        self.lan = LanDiscovery(self.keypair, self._lan_addresses,
                                                self.config.lan,
                                                interfaces=self.network.interface_hosts)
                        await nursery.start(self.lan.run)
                    log.info("swarm.started address=%s:%d key=%s relays=%d services=%s",
                             *self.address, format_key(self.public_key)[:12],
                             len(self.config.relays), ",".join(self.host.services) or "-")
                    task_status.started(self.address)
                    await trio.sleep_forever()
                finally:
                    self._nursery = None
                    with trio.CancelScope(shield=True):
                        await listener.aclose()
        finally:
            dht_scope.cancel()

    async def _bind(self):
        host, port = self.config.host, self.config.port
        for _ in range(_BIND_TRIES):
            listener = await self.network.listen_stream(host, port)
            bound_port = listener.local_address[1]
            try:
                transport = await self.network.bind_datagram(host or "0.0.0.0", bound_port)
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
        self.topics.join(topic, server=server, client=client)

    async def leave(self, topic: bytes) -> None:
        """Stop announcing (unannouncing our record) and looking up ``topic``.

        Connections stay open; peers are no longer redialled for this topic.
        """
        await self.topics.leave(topic)

    async def flush(self) -> None:
        """Wait until every joined topic has announced once and has run a lookup
        that started after this call, with the dials it queued settled."""
        await self.topics.flush()

    def announced_addresses(self) -> list[Address] | None:
        """Our stream addresses for records; None lets the DHT name them: the
        address peers observe (its UDP port is our TCP port) and, on a
        wildcard, our interfaces' and loopback (:meth:`DhtNode.announce_addresses`)."""
        assert self.address is not None
        if self.config.announce_addresses is not None:
            return list(self.config.announce_addresses)
        host, port = self.address
        return None if host in _WILDCARDS else [(host, port)]

    def order_addresses(self, addresses: Iterable[Address]) -> list[Address]:
        """A record's addresses that our host can use, those that fit our own
        network first (:meth:`p2p.dht.DhtNode.dial_order`)."""
        if self.dht is None:
            return list(addresses)
        return self.dht.dial_order(addresses)

    # -- dialling --------------------------------------------------------------

    def known_addresses(self, public_key: bytes) -> tuple[Address, ...]:
        """Where ``public_key`` is known to listen without the DHT: its LAN beacon's
        addresses (nearest first), then what ``config.known_peers`` gives it."""
        found: list[Address] = []
        if self.lan is not None:
            found += self.lan.book.addresses(public_key, trio.current_time())
        for key, addresses in self.config.known_peers:
            if key == public_key:
                found += addresses
        return tuple(dict.fromkeys(found))

    def _nat_type(self) -> NatType:
        return self.dht.nat_type() if self.dht is not None else NatType.UNKNOWN

    def _punch_hosts(self, connection: Connection) -> list[str]:
        """Hosts a peer may punch us on: where the DHT sees us, then our
        interfaces' (a peer on our LAN); only loopback when the relay is local."""
        relay = connection.remote_address
        if relay is not None and relay[0].startswith("127."):
            return ["127.0.0.1"]  # the peer is on this machine, behind the same relay
        hosts: list[str] = []
        seen = self.dht.core.address if self.dht is not None else None
        if seen is not None and not seen[0].startswith("127."):
            hosts.append(seen[0])  # private ranges too: a NAT inside a larger network
        hosts += self.network.interface_hosts()
        return hosts

    def _lan_addresses(self) -> list[Address]:
        """What our LAN beacons name: the listener on each IPv4 interface address."""
        if self.address is None:
            return []
        host, port = self.address
        if host not in ("0.0.0.0", "::", ""):
            return [(host, port)] if ":" not in host else []
        hosts = self.lan._interface_hosts() if self.lan is not None else []
        return [(h, port) for h in hosts]

    async def connect(
        self, public_key: bytes, *, addresses: Iterable[Address] | None = None,
        relays: Iterable[bytes] | None = None,
    ) -> Connection:
        """The connection to ``public_key``: the existing one, or a new one found
        through the DHT (or at ``addresses`` and through ``relays``, skipping the DHT).

        Args:
            public_key: the peer's key.
            addresses: direct addresses to try (the DHT is not asked when given).
            relays: relay keys to dial through after the addresses, as a record's
                relays are (the DHT is not asked when given): for a caller that
                knows where the peer reserved, a CLI told on its command line.

        Raises:
            PeerNotFound: the DHT has no record for the key.
            PeerUnreachable: no address or relay worked (each named, with why).
            PeerRefused: the firewall refused the key.
            SwarmClosed: the swarm is not running.
        """
        self._running_nursery()
        return await self.dialer.connect(public_key, addresses, relays)

    # -- the host's hooks ------------------------------------------------------

    def _connected(self, connection: Connection) -> None:
        key = connection.remote_public_key
        state = self.peers.get(key)
        if state is not None:
            connection.add_topics(state.topics)
        self.peers.connected(key, trio.current_time())

    def _disconnected(self, connection: Connection) -> None:
        key = connection.remote_public_key
        if key in self.connections:
            return  # a newer connection to the same peer took over
        wait = self.peers.disconnected(key, trio.current_time())
        self.dialer.maybe_reconnect(key, wait)

    def statistics(self) -> SwarmStatistics:
        """A snapshot of what the swarm holds now."""
        return SwarmStatistics(connections=len(self.connections),
                               topics=len(list(self.topics)),
                               reserved_relays=len(self.reserved_relays),
                               services=tuple(self.host.services))


@dataclass(frozen=True)
class SwarmStatistics:
    connections: int
    topics: int
    reserved_relays: int
    services: tuple[str, ...]
