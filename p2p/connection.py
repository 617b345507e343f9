"""A connection to a peer: one secret stream, its channel multiplexer and keep-alives.

This is the one connection type of the stack: the swarm, the plain TCP
server, the relay daemon and ``beam`` all hand out :class:`Connection`. It
knows the remote key (proven by the handshake), where the bytes come from (a
direct address, or a relay), the topics that led to the peer, and runs the
mux's reader and writer and the stream's keep-alives in one nursery.

Accepting connections and serving protocols on them is :mod:`p2p.host`'s job;
:func:`dial_tcp` makes an outgoing one over plain TCP.
"""

from __future__ import annotations

import ipaddress
import logging
import random
from dataclasses import dataclass, field

import trio

from .errors import HandshakeError
from .keys import KeyPair, format_key
from .mux import Channel, ChannelListener, Mux, MuxConfig
from .noise import SecretStream, SecretStreamConfig

__all__ = [
    "Address",
    "Connection",
    "ConnectionConfig",
    "closed_handshake_pause",
    "dial_tcp",
    "is_local_address",
    "worth_another_socket",
]

log = logging.getLogger(__name__)

Address = tuple[str, int]


@dataclass(frozen=True)
class ConnectionConfig:
    """Configuration of one connection's layers."""

    stream: SecretStreamConfig = field(default_factory=SecretStreamConfig)
    """Handshake, keep-alive and idle timeouts, read sizes."""

    mux: MuxConfig = field(default_factory=MuxConfig)
    """Channel windows and limits."""

    connect_timeout_s: float = 10.0
    """TCP connect, per attempt."""

    closed_handshake_retries: int = 2
    """New sockets to try when the responder closes ours before the handshake
    completes (see :func:`worth_another_socket`)."""


def worth_another_socket(error: BaseException) -> bool:
    """Is a failed dial worth a new socket at once?

    A daemon under a flood of silent sockets closes the least advanced
    handshake of a busy source to make room (:mod:`p2p.host`'s admission); a
    dialler descheduled between its TCP connect and its first message looks
    silent for that moment, and its socket is closed before the responder read
    a byte. That close (``CLOSED`` before the handshake completed) says
    nothing about the next socket, whose first message goes out at once. A
    wrong key, a bad proof or a timeout would fail the same way again.
    """
    return isinstance(error, HandshakeError) and error.code == "CLOSED"


def closed_handshake_pause(retry: int) -> float:
    """Seconds to wait before the ``retry``-th new socket (from 0): short and
    jittered, so dialers evicted together do not come back together."""
    return random.uniform(0.01, 0.05) * (retry + 1)


def is_local_address(host: str) -> bool:
    """True for loopback, private (RFC 1918, ULA) and link-local addresses."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    return ip.is_loopback or ip.is_private or ip.is_link_local


class Connection:
    """A secret stream to one peer with channels over it.

    Start it with ``await nursery.start(connection.run)``; it runs until the
    stream ends or :meth:`aclose` is called. A connection that a
    :class:`~p2p.host.PeerHost` (or a swarm) owns is started by it.

    Attributes:
        remote_public_key: the peer's key, proven by the handshake.
        remote_address: the address at the other end of our socket: the
            peer's for a direct connection, the relay's for a relayed one
            (None when the stream has no address, e.g. an in-memory pair).
        relay_key: the blind relay the bytes go through, or None.
        path: how the bytes go: ``direct`` (dialled or accepted), ``relayed``,
            or ``punched`` (started relayed, moved to a hole-punched TCP
            connection, :mod:`p2p.punch`).
        topics: the topics whose lookups led to this peer.
        closed: set once the connection has ended and its slot is free.
    """

    def __init__(
        self,
        stream: SecretStream,
        *,
        config: ConnectionConfig | None = None,
        remote_address: Address | None = None,
        relay_key: bytes | None = None,
        topics: set[bytes] | None = None,
    ) -> None:
        self.config = config or ConnectionConfig()
        self.stream = stream
        self.remote_address = remote_address
        self.relay_key = relay_key
        self.path = "relayed" if relay_key is not None else "direct"
        #: The relay (key, address) a punched connection came through.
        self._relayed_via: tuple[bytes, Address | None] | None = None
        #: Why a relayed connection stayed relayed (:mod:`p2p.punch`), or None.
        self.punch_outcome: str | None = None
        self._path_changed = trio.Event()
        self.topics: set[bytes] = set(topics or ())
        self._topics_changed = trio.Event()
        self.closed = trio.Event()
        self.opened_at = trio.current_time()
        peer = format_key(stream.remote_public_key)[:12]
        self.mux = Mux(stream, config=self.config.mux, name=peer)

    @property
    def remote_public_key(self) -> bytes:
        return self.stream.remote_public_key

    @property
    def public_key(self) -> bytes:
        return self.stream.public_key

    @property
    def is_initiator(self) -> bool:
        return self.stream.is_initiator

    @property
    def relayed(self) -> bool:
        return self.relay_key is not None

    @property
    def is_local(self) -> bool:
        """The remote address is loopback, private or link-local."""
        return self.remote_address is not None and is_local_address(self.remote_address[0])

    @property
    def peer_label(self) -> str:
        """The first 12 hex characters of the remote key, for logs."""
        return format_key(self.remote_public_key)[:12]

    def add_topics(self, topics: set[bytes] | frozenset[bytes] | list[bytes]) -> None:
        """Note topics that led to this peer (wakes :meth:`wait_topics_changed`)."""
        new = set(topics) - self.topics
        if new:
            self.topics |= new
            changed, self._topics_changed = self._topics_changed, trio.Event()
            changed.set()

    async def wait_topics_changed(self) -> None:
        """Wait until :meth:`add_topics` adds a topic."""
        await self._topics_changed.wait()

    def moved(self, remote_address: Address | None, path: str) -> None:
        """The session now runs on another path (its stream migrated)."""
        if self.relay_key is not None and path != "relayed":
            self._relayed_via = (self.relay_key, self.remote_address)
        self.remote_address = remote_address
        self.relay_key = None if path != "relayed" else self.relay_key
        self.path = path
        changed, self._path_changed = self._path_changed, trio.Event()
        changed.set()

    def back_on_relay(self) -> None:
        """The punched path died and the session fell back to the relayed one."""
        if self._relayed_via is None:
            return
        self.relay_key, self.remote_address = self._relayed_via
        self.path = "relayed"
        changed, self._path_changed = self._path_changed, trio.Event()
        changed.set()

    async def wait_path_changed(self) -> None:
        """Wait until :meth:`moved` (or the punch's verdict, ``punch_outcome``)."""
        await self._path_changed.wait()

    def punch_settled(self, outcome: str) -> None:
        """The hole punch on this connection is over: ``outcome`` says how."""
        self.punch_outcome = outcome
        changed, self._path_changed = self._path_changed, trio.Event()
        changed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Drive the mux and the keep-alives until the connection ends."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.stream.keep_alive)
            await nursery.start(self.mux.run)
            task_status.started()
            await self.mux.wait_closed()
            nursery.cancel_scope.cancel()

    async def open_channel(self, protocol: str, id: bytes = b"") -> Channel:
        return await self.mux.open_channel(protocol, id)

    def listen(self, protocol: str) -> ChannelListener:
        return self.mux.listen(protocol)

    async def aclose(self) -> None:
        await self.mux.aclose()

    async def wait_closed(self) -> None:
        """Wait until the connection has ended (its owner has let it go)."""
        await self.closed.wait()

    def __repr__(self) -> str:
        path = f"relay {format_key(self.relay_key)[:8]}" if self.relay_key else self.path
        where = ""
        if self.remote_address is not None:
            host, port = self.remote_address
            where = f" {host}:{port}"
        return f"<Connection peer={self.peer_label} {path}{where}>"


async def dial_tcp(
    host: str,
    port: int,
    keypair: KeyPair,
    remote_public_key: bytes | None,
    *,
    config: ConnectionConfig | None = None,
) -> Connection:
    """Connect over TCP, run the handshake as initiator, return the connection.

    The caller starts it: ``await nursery.start(connection.run)``.

    Raises:
        OSError: the TCP connection could not be made.
        HandshakeError: the peer is not ``remote_public_key`` or the handshake
            failed (a close before it completed, after
            ``config.closed_handshake_retries`` new sockets).
    """
    config = config or ConnectionConfig()
    retry = 0
    while True:  # bounded: closed_handshake_retries new sockets at most
        with trio.fail_after(config.connect_timeout_s):
            raw = await trio.open_tcp_stream(host, port)
        try:
            stream = await SecretStream.initiator(raw, keypair, remote_public_key,
                                                  config=config.stream)
        except HandshakeError as exc:
            if not worth_another_socket(exc) or retry >= config.closed_handshake_retries:
                raise
            log.debug("dial.handshake_closed to=%s:%s retry=%d", host, port, retry + 1)
            await trio.sleep(closed_handshake_pause(retry))
            retry += 1
            continue
        return Connection(stream, config=config, remote_address=(host, port))
