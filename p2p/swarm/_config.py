"""The swarm's parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..connection import Address, ConnectionConfig
from ..host import Firewall
from ..lan import LanConfig
from ..punch import PunchConfig
from ._peers import BackoffPolicy

__all__ = ["Address", "Firewall", "LanConfig", "SwarmConfig"]


@dataclass(frozen=True)
class SwarmConfig:
    """Parameters of one swarm."""

    host: str = "0.0.0.0"
    """Address to listen on (TCP and UDP)."""

    port: int = 0
    """Port for both the TCP listener and the DHT's UDP socket (0: a free one)."""

    bootstrap: tuple[Address, ...] = ()
    """DHT nodes to join through; none makes this swarm's node a network of one."""

    relays: tuple[bytes, ...] = ()
    """Relay keys to hold reservations with and to list in our records."""

    lan: LanConfig | None = None
    """Beacon our key and addresses on a LAN multicast group and learn others'
    (``p2p.lan``): peers of one LAN find each other with no DHT, and ``connect``
    tries a peer's LAN addresses first. None (the default): off, as a multicast
    packet reaches every host of the segment, which the operator decides."""

    hole_punching: PunchConfig | None = field(default_factory=PunchConfig)
    """Move relayed connections to direct ones by TCP hole punching, keeping the
    session (``p2p.punch``); None: stay on the relay."""

    known_peers: tuple[tuple[bytes, tuple[Address, ...]], ...] = ()
    """Peers whose addresses the deployment already knows (its relays), as (key,
    addresses): ``connect(key)`` dials them there before asking the DHT, so a
    relay is reached, and a peer paired through it, with no DHT reachable."""

    announce_addresses: tuple[Address, ...] | None = None
    """Addresses to put in our records instead of the listener's (a port
    forwarded on a NAT, say); ``()`` lists none, so peers come through relays."""

    dht_in_background: bool = False
    """Report the swarm started before its DHT node has bootstrapped: for a client
    that can reach its peer another way (a relay by its known address), so a DHT
    it cannot reach does not hold it for the bootstrap's timeouts (~5 s)."""

    announce_key: bool = True
    """Announce our key under its own topic, so ``connect(key)`` finds us."""

    dht_persistent: bool = False
    """Offer our DHT node to others' routing tables (once proven reachable)."""

    max_connections: int = 64
    """Connections at once; dials beyond it fail and incoming ones are closed."""

    reserved_connections: int = 16
    """Connection slots kept for the peers the daemon serves
    (:meth:`Swarm.add_reserved`) and those it dials: strangers share the other
    ``max_connections - reserved_connections``."""

    max_connections_per_address: int | None = None
    """Strangers' connections from one source (an IPv4 address, an IPv6 /64,
    all of loopback); reserved peers are not counted. None: half the
    strangers' slots (24 by default)."""

    stranger_evict_after_s: float = 10.0
    """A stranger finding the strangers' slots (or its address's) taken evicts
    the oldest stranger connected at least this long: one client holding on
    keeps a newcomer out no longer. A daemon whose only strangers are peers
    about to prove themselves (a worker's new agents, before their hello) sets
    it short."""

    max_handshakes: int = 64
    """Incoming handshakes in flight at once; when all are taken a newcomer
    evicts the least advanced one of the source holding the most
    (``swarm_connections_refused{reason="evicted"}``)."""

    max_handshakes_per_address: int = 16
    """Incoming handshakes in flight from one source; one more evicts that
    source's least advanced handshake."""

    first_bytes_timeout_s: float = 2.0
    """An accepted socket that sends nothing for this long is closed."""

    handshake_timeout_s: float = 5.0
    """An accepted socket must finish its handshake within this long."""

    max_parallel_dials: int = 8
    """Dials in flight at once."""

    direct_timeout_s: float = 2.0
    """TCP connect plus handshake, per announced address."""

    relay_timeout_s: float = 10.0
    """Pairing through one relay, end-to-end handshake included."""

    lookup_min_s: float = 0.5
    """First pause between two lookups of a topic (doubles up to the max)."""

    lookup_max_s: float = 300.0
    """Longest pause between two lookups of a topic."""

    reservation_retry_max_s: float = 30.0
    """Longest wait before a lost relay reservation is tried again."""

    drain_timeout_s: float = 10.0
    """After a connection ends, how long its channel handlers may go on reading
    what had already arrived before they are cancelled."""

    connection: ConnectionConfig = field(default_factory=ConnectionConfig)
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
