"""The host: the one accept path of the stack, and the services on every connection.

Theory of operation
-------------------
A :class:`PeerHost` is one peer's side of all its connections. The swarm, the
plain TCP server (:func:`serve_tcp`), the relay daemon and ``beam`` each own
one; nothing else accepts a secret stream or decides which protocols a
connection serves.

* **Accepting** (:meth:`PeerHost.accept`): a raw stream from a listener is
  handshaken as the Noise responder. Admission (:mod:`._admission`) bounds
  handshakes in flight in all and per source address: a full table evicts the
  least advanced handshake of the source holding the most rather than refuse
  a newcomer, a socket silent for ``first_bytes_timeout_s`` or unproven after
  ``handshake_timeout_s`` is closed (a flood of half-open handshakes costs a
  counter, not memory, and never a configured peer's slot). From a
  listener, a socket that has sent nothing waits parked in one epoll set
  (:class:`_Parking`), with no task of its own, until it speaks. *Any* failure
  of the peer's bytes (a bad handshake, a broken socket, an exception the
  handshake did not foresee) ends that socket only, is counted in
  ``<prefix>_connections_refused{reason}`` and logged; it never reaches the
  host's nursery. Then every firewall must allow
  the peer's proven key: those the owner added and every service's.
* **Owning** (:meth:`PeerHost.serve_connection`): one connection per remote
  key. When a second one to the same key arrives (both sides dialled at once,
  or the peer reconnected), both sides keep the same one (:mod:`._duplicates`).
  Connection slots: reserved peers (:meth:`PeerHost.add_reserved`, and peers
  we dialled) may use all ``max_connections``; strangers share what the
  reserve leaves, a few per source address (``full``, ``address_full``,
  ``key_full``); a reserved peer finding every slot taken evicts a stranger.
  Each service listens on the connection *before* it starts, so a peer's first
  open is never refused for arriving early; each channel a peer opens runs the
  service's ``serve_channel(channel, connection)`` in a task of its own, and
  each service's ``on_connection`` hook runs once per connection.
* **Services come and go** while the host runs (:meth:`add_service`,
  :meth:`remove_service`): a new one is listened for on every live connection,
  a removed one stops being listened for and its channels and hooks are
  cancelled on every connection.
* **Ending**: when a connection's mux ends, its slot is freed at once (so a
  reconnect is not refused as a duplicate); channels still hold what arrived
  before the end, so handlers get ``drain_timeout_s`` to read it before they
  are cancelled.

Everything runs in the nursery of :meth:`PeerHost.run`, or in the task of the
caller of :meth:`accept` (a listener's handler owns the connection it took).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import select
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import trio
from prometheus_client import CollectorRegistry

from ..connection import Address, Connection, ConnectionConfig
from ..errors import LocalProtocolError
from ..keys import KeyPair, format_key
from ..mux import Channel, ChannelListener
from ..net import StreamListener
from ..noise import SecretStream
from ._admission import (
    NO_ADDRESS_GROUP,
    ConnectionSlots,
    HandshakeSlots,
    LogLimiter,
    address_group,
)
from ._duplicates import keep_new_connection
from ._errors import HostError
from ._metrics import HostMetrics
from ._service import Service

__all__ = ["Firewall", "HostConfig", "PeerHost", "Reserved", "StreamListener"]

log = logging.getLogger(__name__)

#: ``firewall(remote_key, how) -> allowed``; ``how`` is "incoming", "relayed",
#: "connect", "reconnect" or "topic:<hex>" (the topic whose lookup found the peer).
Firewall = Callable[[bytes, str], bool]

#: ``reserved(remote_key) -> bool``: a peer the daemon is configured to serve,
#: which may use the connection slots kept from strangers.
Reserved = Callable[[bytes], bool]

#: accept() errors that mean "out of resources for now", as trio's
#: serve_listeners treats them: pause and retry instead of stopping.
_ACCEPT_CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}
_ACCEPT_PAUSE_S = 0.1


@dataclass(frozen=True)
class HostConfig:
    """Limits of one host."""

    connection: ConnectionConfig = field(default_factory=ConnectionConfig)
    """Each connection's layers (stream timeouts, mux windows)."""

    max_connections: int = 1024
    """Live connections at once. Each costs about 30 KB plus what its channels
    buffer. Reserved peers (:meth:`PeerHost.add_reserved`) may use every slot;
    strangers only ``max_connections - reserved_connections`` of them."""

    max_handshakes: int = 64
    """Handshakes in flight at once. When they are all taken a newcomer evicts
    the least advanced handshake of the source holding the most (``evicted``);
    see :mod:`._admission`."""

    max_handshakes_per_address: int | None = None
    """Handshakes in flight from one source (an IPv4 address, an IPv6 /64, all
    of loopback); one more evicts that source's least advanced one. None: a
    quarter of ``max_handshakes`` (at least 1)."""

    handshake_grace_s: float = 1.0
    """A handshake whose peer's first message arrived whole and parsed (a
    byte is no progress) is evicted within this long only when no handshake
    silent for ``handshake_min_age_s``, nor one past its grace, may go
    instead; see :mod:`._admission` for the whole order."""

    handshake_min_age_s: float = 0.25
    """No handshake whose first message parsed is evicted younger than this
    (a newcomer finding only such ones is refused, ``busy``); one that has
    not parsed a message for this long goes first. A real handshake needs
    one round trip after its first message: milliseconds on loopback or a
    LAN, ~0.2 s across continents. A flood from one source at ``r``
    sockets/s, even of messages that parse, keeps each of its handshakes
    about ``max_handshakes_per_address / r`` seconds, never less than this."""

    first_bytes_timeout_s: float = 2.0
    """A socket that sends nothing for this long after it was accepted is
    closed (``first_bytes_timeout``): a real peer speaks first, at once."""

    handshake_timeout_s: float = 5.0
    """The whole handshake, from accept to the peer's proof
    (``handshake_timeout``); the stream's own timeout also applies."""

    reserved_connections: int | None = None
    """Slots strangers may not take, kept for reserved peers, once the host has
    any (:meth:`PeerHost.add_reserved`). None: a quarter of ``max_connections``."""

    max_connections_per_address: int | None = None
    """Strangers' connections from one source (``address_full``); reserved peers
    are not counted. None: half of the strangers' slots (at least 1)."""

    stranger_evict_after_s: float = 10.0
    """A stranger that finds the strangers' slots (or its address's) taken
    evicts the oldest stranger connected at least this long (``preempted``),
    so one client holding on keeps no newcomer out for long."""

    max_connections_per_key: int | None = None
    """Connections one key may hold when ``one_per_peer`` is off (``key_full``);
    None: no limit. With ``one_per_peer`` a key holds one anyway."""

    drain_timeout_s: float = 10.0
    """After a connection ends, how long its channel handlers may go on reading
    what had already arrived before they are cancelled."""

    one_per_peer: bool = True
    """Keep one connection per remote key (a swarm: both sides agree which).
    False lets a key hold several (a relay, whose clients are independent
    programs that may share a key); ``connections`` then maps each key to its
    newest one."""

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_handshakes", "max_handshakes_per_address",
                     "max_connections_per_address", "max_connections_per_key"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise LocalProtocolError(f"{name} must be at least 1", code="BAD_CONFIG")
        for name in ("first_bytes_timeout_s", "handshake_timeout_s"):
            if getattr(self, name) <= 0:
                raise LocalProtocolError(f"{name} must be positive", code="BAD_CONFIG")
        if self.first_bytes_timeout_s > self.handshake_timeout_s:
            raise LocalProtocolError("first_bytes_timeout_s must not exceed handshake_timeout_s",
                                     code="BAD_CONFIG")
        if self.reserved_connections is not None and not (
                0 <= self.reserved_connections < self.max_connections):
            raise LocalProtocolError(
                f"reserved_connections must be from 0 to {self.max_connections - 1} "
                "(strangers need a slot too)", code="BAD_CONFIG")
        for name in ("drain_timeout_s", "handshake_grace_s", "handshake_min_age_s",
                     "stranger_evict_after_s"):
            if getattr(self, name) < 0:
                raise LocalProtocolError(f"{name} must not be negative", code="BAD_CONFIG")

    @property
    def handshakes_per_address(self) -> int:
        if self.max_handshakes_per_address is not None:
            return min(self.max_handshakes_per_address, self.max_handshakes)
        return max(1, self.max_handshakes // 4)

    @property
    def reserve(self) -> int:
        if self.reserved_connections is not None:
            return self.reserved_connections
        return self.max_connections // 4

    @property
    def connections_per_address(self) -> int:
        if self.max_connections_per_address is not None:
            return self.max_connections_per_address
        return max(1, (self.max_connections - self.reserve) // 2)


class PeerHost:
    """One peer's connections and the services served on them.

    Args:
        keypair: our identity.
        config: limits.
        metrics_prefix: names this host's metrics (``<prefix>_connections_refused``).
        registry: where the metrics go (a registry of its own by default).
        on_connected: ``hook(connection)``, called synchronously once a
            connection holds its peer's slot (the swarm tracks peers with it).
        on_disconnected: ``hook(connection)``, called once when it lets go.

    Run it with ``await nursery.start(host.run)``.
    """

    def __init__(
        self,
        keypair: KeyPair,
        *,
        config: HostConfig | None = None,
        metrics_prefix: str = "peer",
        registry: CollectorRegistry | None = None,
        on_connected: Callable[[Connection], None] | None = None,
        on_disconnected: Callable[[Connection], None] | None = None,
    ) -> None:
        self.keypair = keypair
        self.config = config or HostConfig()
        #: The connection serving each peer (with ``one_per_peer`` off, its newest).
        self.connections: dict[bytes, Connection] = {}
        self._live: set[Connection] = set()
        self.metrics = HostMetrics(prefix=metrics_prefix, registry=registry,
                                   count_connections=lambda: len(self._live))
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self._services: dict[str, Service] = {}
        self._firewalls: list[Firewall] = []
        self._served: dict[Connection, _Served] = {}
        self._reserved: list[Reserved] = []
        self._handshakes = HandshakeSlots(max_total=self.config.max_handshakes,
                                          max_per_group=self.config.handshakes_per_address,
                                          grace_s=self.config.handshake_grace_s,
                                          min_age_s=self.config.handshake_min_age_s)
        #: The cancel scope of each handshake in flight, by ticket (to evict it).
        self._handshake_scopes: dict[int, trio.CancelScope] = {}
        self._evicted: set[int] = set()
        self._slots = ConnectionSlots(max_total=self.config.max_connections, reserve=0,
                                      max_per_group=self.config.connections_per_address,
                                      max_per_key=self.config.max_connections_per_key,
                                      evict_after_s=self.config.stranger_evict_after_s)
        self._log_limiter = LogLimiter()
        self._parking: _Parking | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def public_key(self) -> bytes:
        return self.keypair.public_key

    @property
    def services(self) -> Mapping[str, Service]:
        return dict(self._services)

    # -- lifetime --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the connections this host adopts, until cancelled (then close them)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def _running_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise HostError("the host is not running: start PeerHost.run() first",
                            code="NOT_RUNNING")
        return self._nursery

    # -- services and firewalls -----------------------------------------------

    def add_service(self, service: Service) -> None:
        """Serve ``service`` on every connection, live ones included.

        Raises:
            HostError: ``DUPLICATE_SERVICE`` if its protocol is served already.
            LocalProtocolError: the service names no protocol.
        """
        if not service.protocol:
            raise LocalProtocolError(f"{service!r} names no protocol", code="BAD_SERVICE")
        if service.protocol in self._services:
            raise HostError(f"protocol {service.protocol!r} is served already",
                            code="DUPLICATE_SERVICE")
        self._services[service.protocol] = service
        for served in list(self._served.values()):
            served.start(service)
        log.debug("host.service_added protocol=%s", service.protocol)

    def remove_service(self, protocol: str) -> None:
        """Stop serving ``protocol``: its channels and hooks are cancelled on
        every connection and new opens are refused. Unknown protocols are ignored."""
        if self._services.pop(protocol, None) is None:
            return
        for served in list(self._served.values()):
            served.stop(protocol)
        log.debug("host.service_removed protocol=%s", protocol)

    def add_firewall(self, firewall: Firewall) -> Callable[[], None]:
        """Add a firewall every peer must pass; returns a function that removes it."""
        self._firewalls.append(firewall)

        def remove() -> None:
            if firewall in self._firewalls:
                self._firewalls.remove(firewall)

        return remove

    def add_reserved(self, reserved: Reserved | Iterable[bytes]) -> Callable[[], None]:
        """Keep connection slots for the peers ``reserved`` names (a predicate
        on the key, or a set of keys): the keys this daemon is configured to
        serve. Strangers may then take only ``max_connections -
        reserved_connections`` slots, and a reserved peer that finds every slot
        taken evicts a stranger. Returns a function that removes it."""
        if not callable(reserved):
            keys = frozenset(reserved)
            reserved = keys.__contains__
        check: Reserved = reserved
        self._reserved.append(check)
        self._slots.reserve = self.config.reserve

        def remove() -> None:
            if check in self._reserved:
                self._reserved.remove(check)
            if not self._reserved:
                self._slots.reserve = 0

        return remove

    def is_reserved(self, remote_public_key: bytes) -> bool:
        """Is this one of the peers the host keeps slots for? A predicate that
        raises says no (and is logged)."""
        for check in list(self._reserved):
            try:
                if check(remote_public_key):
                    return True
            except Exception:
                log.exception("host.reserved_failed peer=%s", format_key(remote_public_key)[:12])
        return False

    def _refuse(self, reason: str, **fields: object) -> None:
        """Count a refusal; log it, at most once per reason every 10 s."""
        self.metrics.refused.labels(reason).inc()
        held = self._log_limiter.admit(reason, trio.current_time())
        if held is not None:
            details = " ".join(f"{name}={value}" for name, value in fields.items())
            log.info("host.refused reason=%s %s suppressed=%d", reason, details, held)

    def allows(self, remote_public_key: bytes, how: str) -> bool:
        """Do every firewall and every service allow this peer? A firewall that
        raises refuses (and is logged): a bug must not open the door."""
        checks: list[Firewall] = [*self._firewalls,
                                  *(service.allows for service in self._services.values())]
        for check in checks:
            try:
                if not check(remote_public_key, how):
                    return False
            except Exception:
                log.exception("host.firewall_failed peer=%s", format_key(remote_public_key)[:12])
                return False
        return True

    # -- accepting -------------------------------------------------------------

    async def serve_listener(
        self, listener: StreamListener, *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept from ``listener`` until cancelled; each stream is handled by
        :meth:`accept` in a task of the host's nursery. A socket that has sent
        nothing yet waits parked, with no task of its own, until it speaks
        (then it gets one), is evicted or times out: a flood of silent sockets
        costs the daemon an accept and a close each."""
        nursery = self._running_nursery()
        if self._parking is None and _Parking.available():
            self._parking = _Parking(self)
            nursery.start_soon(self._parking.run)
        task_status.started()
        while True:
            try:
                raw, address = await listener.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                    raise
                log.warning("host.accept_paused reason=%s", exc.strerror or exc)
                await trio.sleep(_ACCEPT_PAUSE_S)
                continue
            if self._parking is not None:
                # Parked sockets that spoke since are taken first, so their
                # handshakes start (and may parse) before a newcomer is ranked.
                self._parking.take_ready()
            if (self._parking is not None and isinstance(raw, trio.SocketStream)
                    and not _has_bytes(raw)):
                admitted = self._admit(address)
                if admitted is None:
                    raw.socket.close()
                else:
                    self._parking.park(raw, address, admitted)
                continue
            nursery.start_soon(self.accept, raw, address)

    async def accept(
        self, raw: trio.abc.Stream, remote_address: Address | None, *, how: str = "incoming",
    ) -> None:
        """Handshake ``raw`` as the responder and serve the connection until it ends.

        Never raises for anything the peer did: a failure is counted, logged
        and closes ``raw``. The caller's task owns the connection meanwhile.
        """
        admitted = self._admit(remote_address)
        if admitted is None:
            await trio.aclose_forcefully(raw)
            return
        await self._handshake(raw, remote_address, how, admitted, spoke=_has_bytes(raw))

    def _admit(self, remote_address: Address | None) -> _Admitted | None:
        """A handshake slot for a newcomer (evicting another if the policy says
        so), or None (refused and counted)."""
        now = trio.current_time()
        group = address_group(remote_address[0] if remote_address is not None else None)
        decision = self._handshakes.arrive(group, now)
        if decision.evict is not None:
            victim = decision.evict
            dropped = self._parking.drop(victim) if self._parking is not None else None
            if dropped is not None:
                self._handshakes.leave(victim)
                self._refuse("evicted", source=dropped.group)
            else:
                self._evicted.add(victim)
                scope = self._handshake_scopes.get(victim)
                if scope is not None:  # else its task has yet to start: it ends at once
                    scope.cancel()
        if decision.ticket is None:
            self._refuse(decision.reason, source=group, to=_label(remote_address))
            return None
        return _Admitted(decision.ticket, group, now)

    async def _handshake(self, raw: trio.abc.Stream, remote_address: Address | None, how: str,
                         admitted: _Admitted, *, spoke: bool) -> None:
        where = _label(remote_address)
        ticket, group, now = admitted
        config = self.config
        scope = self._handshake_scopes[ticket] = trio.CancelScope(
            deadline=now + config.first_bytes_timeout_s)
        if ticket in self._evicted:  # evicted after it left parking, before this task ran
            scope.cancel()

        progressed = False

        def received(_count: int) -> None:
            # Any byte moves the deadline from first_bytes to the handshake's;
            # only a whole first message (parsed) spares it from eviction.
            nonlocal progressed
            if not progressed:
                progressed = True
                self._handshakes.hear(ticket)
                scope.deadline = now + config.handshake_timeout_s

        def parsed() -> None:
            self._handshakes.progress(ticket)

        if spoke:  # its first message came with the connect, or woke it when parked
            received(0)
        failure: str | None = None
        try:
            with scope:
                if not progressed and isinstance(raw, trio.SocketStream):
                    # A silent socket costs a wait, not a handshake's set-up.
                    await trio.lowlevel.wait_readable(raw.socket)
                stream = await SecretStream.responder(raw, self.keypair,
                                                      config=config.connection.stream,
                                                      on_receive=received,
                                                      on_message=parsed)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            failure = f"reason={exc}"
        except Exception as exc:
            # HandshakeError and anything else the peer's bytes could provoke:
            # that peer's socket ends, never the process.
            code = getattr(exc, "code", type(exc).__name__)
            failure = f"code={code} reason={exc}"
        finally:
            self._handshakes.leave(ticket)
            del self._handshake_scopes[ticket]
        if failure is not None:
            self.metrics.refused.labels("handshake").inc()
            log.info("host.handshake_failed from=%s %s", where, failure)
            await trio.aclose_forcefully(raw)
            return
        if scope.cancelled_caught:
            if ticket in self._evicted:
                self._evicted.discard(ticket)
                reason = "evicted"
            elif progressed:
                reason = "handshake_timeout"
            else:
                reason = "first_bytes_timeout"
            self._refuse(reason, source=group, to=where)
            await trio.aclose_forcefully(raw)
            return
        self._evicted.discard(ticket)
        if not self.allows(stream.remote_public_key, how):
            self.metrics.refused.labels("firewall").inc()
            log.info("host.refused peer=%s from=%s reason=firewall",
                     format_key(stream.remote_public_key)[:12], where)
            await trio.aclose_forcefully(stream)
            return
        self.metrics.accepted.labels("direct").inc()
        try:
            await self.serve_connection(stream, remote_address)
        except Exception as exc:  # it failed to start: that peer's problem only
            log.warning("host.connection_failed peer=%s error=%r",
                        format_key(stream.remote_public_key)[:12], exc, exc_info=exc)

    async def adopt(
        self, stream: SecretStream, remote_address: Address | None, *,
        relay_key: bytes | None = None, topics: Iterable[bytes] = (),
    ) -> Connection:
        """Take on a handshaken stream (one we dialled, or a relayed one) in the
        host's nursery; return the connection that now serves its peer (an
        existing one if the rule for duplicates keeps that).

        Raises:
            HostError: ``REFUSED`` (at ``max_connections``, or our own key);
                ``NOT_RUNNING``.
        """
        result = await self._running_nursery().start(
            self._serve_started, stream, remote_address, relay_key, frozenset(topics))
        if result is None:
            raise HostError("connection refused by the host's limits", code="REFUSED")
        return result

    async def _serve_started(
        self, stream: SecretStream, remote_address: Address | None, relay_key: bytes | None,
        topics: frozenset[bytes], task_status: trio.TaskStatus[Connection | None],
    ) -> None:
        await self.serve_connection(stream, remote_address, relay_key=relay_key, topics=topics,
                                    task_status=task_status)

    # -- owning connections ----------------------------------------------------

    async def serve_connection(
        self, stream: SecretStream, remote_address: Address | None, *,
        relay_key: bytes | None = None, topics: Iterable[bytes] = (),
        task_status: trio.TaskStatus[Connection | None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Own a handshaken stream until it ends: settle duplicates and limits,
        serve every service on it. Reports the connection that serves the peer
        (None if refused). Exceptions of the connection's own machinery are
        logged and end only this connection."""
        connection = Connection(stream, config=self.config.connection,
                                remote_address=remote_address, relay_key=relay_key,
                                topics=set(topics))
        kept = self._take_slot(connection)
        if kept is not connection:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            task_status.started(kept)
            return
        served = self._served[connection] = _Served(self, connection)
        for service in list(self._services.values()):
            served.start(service)
        path = "relayed" if relay_key else "direct"
        log.info("host.connected peer=%s path=%s from=%s initiator=%s", connection.peer_label,
                 path, _label(remote_address), connection.is_initiator)
        if self._on_connected is not None:
            self._on_connected(connection)
        started = False
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(connection.run)
                nursery.start_soon(served.run)
                task_status.started(connection)
                started = True
                await connection.mux.wait_closed()
                self._forget(connection)
                served.mux_closed.set()
                # Channels still hold what arrived before the end: let handlers
                # read it (a peer that sent its last bytes and hung up must not
                # lose them), then cancel what is left.
                served.scope.deadline = trio.current_time() + self.config.drain_timeout_s
        except Exception as exc:
            if not started:
                raise
            # A bug below us must end this connection, not every connection.
            log.warning("host.connection_failed peer=%s error=%r", connection.peer_label, exc,
                        exc_info=exc)
        finally:
            with trio.CancelScope(shield=True):
                await connection.aclose()  # bounded by the stream's close timeout
            stats = stream.statistics()
            self.metrics.closed_bytes["sent"] += stats.bytes_sent
            self.metrics.closed_bytes["received"] += stats.bytes_received
            self._forget(connection)
            self._served.pop(connection, None)
            log.info("host.disconnected peer=%s path=%s", connection.peer_label, path)

    def _take_slot(self, connection: Connection) -> Connection | None:
        """Register ``connection`` for its peer; return the connection that
        serves the peer now (``connection``, an existing one, or None)."""
        key = connection.remote_public_key
        if key == self.public_key:
            self.metrics.refused.labels("self").inc()
            return None
        existing = self.connections.get(key) if self.config.one_per_peer else None
        if existing is not None:
            if not keep_new_connection(
                self.public_key, key, existing_initiated_by_us=existing.is_initiator,
                new_initiated_by_us=connection.is_initiator,
            ):
                self.metrics.refused.labels("duplicate").inc()
                log.debug("host.duplicate_dropped peer=%s kept=existing", connection.peer_label)
                return existing
            log.debug("host.duplicate_dropped peer=%s kept=new", connection.peer_label)
            connection.add_topics(existing.topics)
            # The new one holds the slot before the old one is let go, so the
            # owner's hooks never see the peer as gone.
            self.connections[key] = connection
            self._live.add(connection)
            self._slots.take(connection, key, _group(connection),
                             reserved=self._counts_as_reserved(connection),
                             now=trio.current_time())
            self._forget(existing)
            if self._nursery is not None:
                self._nursery.start_soon(existing.aclose)
            return connection
        reserved = self._counts_as_reserved(connection)
        group = _group(connection)
        now = trio.current_time()
        decision = self._slots.decide(key, group, reserved=reserved, now=now, busy=_asked)
        if not decision.ok or decision.evict is not None:
            # Strangers may have proved since to be reserved peers (an agent's
            # hello): count them as such before refusing or evicting anyone.
            self.promote_reserved()
            decision = self._slots.decide(key, group, reserved=reserved, now=now, busy=_asked)
        if not decision.ok:
            self._refuse(decision.reason, peer=connection.peer_label, source=group)
            return None
        if isinstance(decision.evict, Connection):
            victim = decision.evict
            self._refuse("preempted", peer=victim.peer_label, source=_group(victim))
            self._forget(victim)
            if self._nursery is not None:
                self._nursery.start_soon(victim.aclose)
        self.connections[key] = connection
        self._live.add(connection)
        self._slots.take(connection, key, group, reserved=reserved, now=now)
        return connection

    def promote_reserved(self) -> None:
        """Count strangers' connections whose keys are now reserved (an agent
        bound by its hello, a rack registered since) as reserved peers'."""
        for handle, key in self._slots.strangers_held():
            if self.is_reserved(key):
                self._slots.promote(handle)

    def _counts_as_reserved(self, connection: Connection) -> bool:
        """A peer we dialled ourselves, or one the daemon is configured to serve."""
        return connection.is_initiator or self.is_reserved(connection.remote_public_key)

    def _forget(self, connection: Connection) -> None:
        """The connection ended: free its slot at once (idempotent)."""
        if connection.closed.is_set():
            return
        connection.closed.set()
        self._live.discard(connection)
        self._slots.release(connection)
        key = connection.remote_public_key
        if self.connections.get(key) is connection:
            del self.connections[key]
            if not self.config.one_per_peer:
                # Another of its connections may still be live: it serves the peer now.
                others = [c for c in self._live if c.remote_public_key == key]
                if others:
                    self.connections[key] = max(others, key=lambda c: c.opened_at)
        if self._on_disconnected is not None:
            self._on_disconnected(connection)

    def live_bytes(self) -> Iterable[tuple[int, int]]:
        """(sent, received) of every live connection, for byte counters."""
        for connection in list(self._live):
            stats = connection.stream.statistics()
            yield stats.bytes_sent, stats.bytes_received


class _Served:
    """The services running on one connection: a listener, a cancel scope and
    a hook task per service, inside one handler nursery."""

    def __init__(self, host: PeerHost, connection: Connection) -> None:
        self.host = host
        self.connection = connection
        #: Cancelled (after the drain deadline) once the connection ends.
        self.scope = trio.CancelScope()
        self.mux_closed = trio.Event()
        self._waiting: dict[str, tuple[Service, ChannelListener]] = {}
        self._scopes: dict[str, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None

    def start(self, service: Service) -> None:
        """Listen for ``service`` now; serve it once the handler nursery runs."""
        try:
            listener = self.connection.listen(service.protocol)
        except Exception as exc:  # the mux already ended: nothing to serve
            log.debug("host.listen_failed peer=%s protocol=%s reason=%r",
                      self.connection.peer_label, service.protocol, exc)
            return
        if self._nursery is None:
            self._waiting[service.protocol] = (service, listener)
        else:
            self._nursery.start_soon(self._serve, service, listener)

    def stop(self, protocol: str) -> None:
        waiting = self._waiting.pop(protocol, None)
        if waiting is not None:
            waiting[1].close()
        scope = self._scopes.get(protocol)
        if scope is not None:
            scope.cancel()

    async def run(self) -> None:
        with self.scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                waiting, self._waiting = self._waiting, {}
                for service, listener in waiting.values():
                    nursery.start_soon(self._serve, service, listener)
                # Services added later start here too, until the connection ends.
                await self.mux_closed.wait()
                self._nursery = None

    async def _serve(self, service: Service, listener: ChannelListener) -> None:
        scope = self._scopes[service.protocol] = trio.CancelScope()
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._run_hook, service)
                    await serve_channels(listener, service, self.connection)
        finally:
            if self._scopes.get(service.protocol) is scope:
                del self._scopes[service.protocol]
            listener.close()

    async def _run_hook(self, service: Service) -> None:
        try:
            await service.on_connection(self.connection)
        except Exception:
            log.exception("host.hook_failed peer=%s protocol=%s", self.connection.peer_label,
                          service.protocol)


async def serve_channels(listener: ChannelListener, service: Service,
                         connection: Connection) -> None:
    """Run ``service.serve_channel(channel, connection)`` in a task of its own for
    every channel accepted, until the listener closes; a handler that raises is
    logged, the rest go on."""

    async def run_one(channel: Channel) -> None:
        try:
            await service.serve_channel(channel, connection)
        except Exception:
            # One bad channel (or handler bug) must not take the connection down.
            log.exception("host.channel_failed peer=%s protocol=%s", connection.peer_label,
                          channel.protocol)
        finally:
            await channel.aclose()

    async with trio.open_nursery() as nursery:
        while True:
            try:
                channel = await listener.accept()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            nursery.start_soon(run_one, channel)


class _Admitted(NamedTuple):
    ticket: int
    group: str
    started: float


class _Parking:
    """Silent accepted sockets, with no task each: one epoll set watched by
    one task. A socket that speaks gets a handshake task; one that is evicted
    or stays silent past ``first_bytes_timeout_s`` is closed where it sits."""

    def __init__(self, host: PeerHost) -> None:
        self._host = host
        self._epoll = select.epoll()
        #: ticket -> (socket, address, admission), in order of arrival.
        self._parked: dict[int, tuple[trio.SocketStream, Address | None, _Admitted]] = {}
        self._by_fd: dict[int, int] = {}
        self._changed = trio.Event()
        #: The watcher ended (the host is stopping): nothing parks any more.
        self.closed = False

    @staticmethod
    def available() -> bool:
        return hasattr(select, "epoll")

    def park(self, raw: trio.SocketStream, address: Address | None,
             admitted: _Admitted) -> None:
        fd = raw.socket.fileno()
        try:
            if self.closed:
                # A listener in another nursery may still accept for a moment
                # after the host's nursery (and so the watcher) was cancelled.
                raise OSError("the host is stopping")
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
        except OSError:
            raw.socket.close()
            self._host._handshakes.leave(admitted.ticket)
            return
        self._parked[admitted.ticket] = (raw, address, admitted)
        self._by_fd[fd] = admitted.ticket
        if len(self._parked) == 1:
            self._changed.set()  # the watcher's deadline changed

    def _unpark(self, ticket: int) -> tuple[trio.SocketStream, Address | None,
                                            _Admitted] | None:
        parked = self._parked.pop(ticket, None)
        if parked is None:
            return None
        fd = parked[0].socket.fileno()
        self._by_fd.pop(fd, None)
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(fd)
        return parked

    def drop(self, ticket: int) -> _Admitted | None:
        """Close a parked socket (evicted); None if it is not parked."""
        parked = self._unpark(ticket)
        if parked is None:
            return None
        parked[0].socket.close()
        return parked[2]

    def take_ready(self) -> None:
        """Give every parked socket that spoke (or hung up) a handshake task."""
        if not self._parked or self.closed:
            return
        host = self._host
        for fd, _mask in self._epoll.poll(0):
            ticket = self._by_fd.get(fd)
            parked = None if ticket is None else self._unpark(ticket)
            if parked is not None:
                raw, address, admitted = parked
                host._handshakes.hear(admitted.ticket)  # after silent ones, from now on
                host._running_nursery().start_soon(functools.partial(
                    host._handshake, raw, address, "incoming", admitted, spoke=True))

    async def run(self) -> None:
        host = self._host
        timeout = host.config.first_bytes_timeout_s
        try:
            while True:
                oldest = next(iter(self._parked.values()), None)
                deadline = math.inf if oldest is None else oldest[2].started + timeout
                with trio.move_on_at(deadline):
                    if oldest is None:
                        await self._changed.wait()
                        self._changed = trio.Event()
                    else:
                        await trio.lowlevel.wait_readable(self._epoll.fileno())
                self.take_ready()
                now = trio.current_time()
                for ticket, (_raw, _address, admitted) in list(self._parked.items()):
                    if now < admitted.started + timeout:
                        break
                    self.drop(ticket)
                    host._handshakes.leave(ticket)
                    host._refuse("first_bytes_timeout", source=admitted.group)
        finally:
            self.closed = True
            for ticket in list(self._parked):
                self.drop(ticket)
                host._handshakes.leave(ticket)
            self._epoll.close()


def _has_bytes(raw: trio.abc.Stream) -> bool:
    """Are bytes waiting on this socket already (without reading them)?"""
    if not isinstance(raw, trio.SocketStream):
        return False
    try:
        poller = select.poll()
        poller.register(raw.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return False


def _group(connection: Connection) -> str:
    """The source a connection counts against (a relayed one: its relay's)."""
    address = connection.remote_address
    return address_group(address[0]) if address is not None else NO_ADDRESS_GROUP


def _asked(connection: object) -> bool:
    """Has this stranger asked for anything (opened a channel)? An idle one
    is evicted first (see ``_admission``)."""
    return isinstance(connection, Connection) and connection.mux.peer_opens > 0


def _label(address: Address | None) -> str:
    if address is None:
        return "memory"
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
