"""The host: the one accept path of the stack, and the services on every connection.

Theory of operation
-------------------
A :class:`PeerHost` is one peer's side of all its connections. The swarm, the
plain TCP server (:func:`serve_tcp`), the relay daemon and ``beam`` each own
one; nothing else accepts a secret stream or decides which protocols a
connection serves.

* **Accepting** (:meth:`PeerHost.accept`): a raw stream from a listener is
  handshaken as the Noise responder. At most ``max_handshakes`` run at once
  (beyond, the socket is closed at once: a flood of half-open handshakes costs
  a counter, not memory). *Any* failure of the peer's bytes (a bad handshake,
  a broken socket, an exception the handshake did not foresee) ends that
  socket only, is counted in ``<prefix>_connections_refused{reason}`` and
  logged; it never reaches the host's nursery. Then every firewall must allow
  the peer's proven key: those the owner added and every service's.
* **Owning** (:meth:`PeerHost.serve_connection`): one connection per remote
  key. When a second one to the same key arrives (both sides dialled at once,
  or the peer reconnected), both sides keep the same one (:mod:`._duplicates`).
  A connection beyond ``max_connections`` is refused and counted (``full``).
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

import errno
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import trio
from prometheus_client import CollectorRegistry

from ..connection import Address, Connection, ConnectionConfig
from ..errors import LocalProtocolError
from ..keys import KeyPair, format_key
from ..mux import Channel, ChannelListener
from ..net import StreamListener
from ..noise import SecretStream
from ._duplicates import keep_new_connection
from ._errors import HostError
from ._metrics import HostMetrics
from ._service import Service

__all__ = ["Firewall", "HostConfig", "PeerHost", "StreamListener"]

log = logging.getLogger(__name__)

#: ``firewall(remote_key, how) -> allowed``; ``how`` is "incoming", "relayed",
#: "connect", "reconnect" or "topic:<hex>" (the topic whose lookup found the peer).
Firewall = Callable[[bytes, str], bool]

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
    """Live connections at once; one more is refused and counted (``full``).
    Each costs about 30 KB plus what its channels buffer."""

    max_handshakes: int = 64
    """Handshakes in flight at once; a socket beyond it is closed at once and
    counted (``busy``). Each is bounded by the stream's handshake timeout."""

    drain_timeout_s: float = 10.0
    """After a connection ends, how long its channel handlers may go on reading
    what had already arrived before they are cancelled."""

    one_per_peer: bool = True
    """Keep one connection per remote key (a swarm: both sides agree which).
    False lets a key hold several (a relay, whose clients are independent
    programs that may share a key); ``connections`` then maps each key to its
    newest one."""

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_handshakes"):
            if getattr(self, name) < 1:
                raise LocalProtocolError(f"{name} must be at least 1", code="BAD_CONFIG")
        if self.drain_timeout_s < 0:
            raise LocalProtocolError("drain_timeout_s must not be negative", code="BAD_CONFIG")


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
        self._handshakes = 0
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
        :meth:`accept` in a task of the host's nursery."""
        nursery = self._running_nursery()
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
            nursery.start_soon(self.accept, raw, address)

    async def accept(
        self, raw: trio.abc.Stream, remote_address: Address | None, *, how: str = "incoming",
    ) -> None:
        """Handshake ``raw`` as the responder and serve the connection until it ends.

        Never raises for anything the peer did: a failure is counted, logged
        and closes ``raw``. The caller's task owns the connection meanwhile.
        """
        where = _label(remote_address)
        if self._handshakes >= self.config.max_handshakes:
            self.metrics.refused.labels("busy").inc()
            log.info("host.refused from=%s reason=busy", where)
            await trio.aclose_forcefully(raw)
            return
        self._handshakes += 1
        try:
            stream = await SecretStream.responder(raw, self.keypair,
                                                  config=self.config.connection.stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.metrics.refused.labels("handshake").inc()
            log.info("host.handshake_failed from=%s reason=%s", where, exc)
            await trio.aclose_forcefully(raw)
            return
        except Exception as exc:
            # HandshakeError and anything else the peer's bytes could provoke:
            # that peer's socket ends, never the process.
            self.metrics.refused.labels("handshake").inc()
            code = getattr(exc, "code", type(exc).__name__)
            log.info("host.handshake_failed from=%s code=%s reason=%s", where, code, exc)
            await trio.aclose_forcefully(raw)
            return
        finally:
            self._handshakes -= 1
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
            self._forget(existing)
            if self._nursery is not None:
                self._nursery.start_soon(existing.aclose)
            return connection
        if len(self._live) >= self.config.max_connections:
            self.metrics.refused.labels("full").inc()
            log.info("host.refused peer=%s reason=full", connection.peer_label)
            return None
        self.connections[key] = connection
        self._live.add(connection)
        return connection

    def _forget(self, connection: Connection) -> None:
        """The connection ended: free its slot at once (idempotent)."""
        if connection.closed.is_set():
            return
        connection.closed.set()
        self._live.discard(connection)
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


def _label(address: Address | None) -> str:
    if address is None:
        return "memory"
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
