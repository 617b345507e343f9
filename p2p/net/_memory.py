"""Many hosts in one process with no sockets: streams and datagrams on trio's clock.

Theory of operation
-------------------
A :class:`MemoryInternet` holds hosts by address. ``internet.host(address)``
gives one host's :class:`MemoryHost`, which is a :class:`~._types.Network`:
code written against ``Network`` (a swarm, a relay, the replicator) runs on
it unchanged, and under trio's autojump clock whole clusters run in no real
time.

*Streams.* ``open_stream`` models a TCP connect: the SYN travels the
forward latency, the destination host looks up a listener on (address,
port) (a wildcard listener takes every address of its host), and the answer
travels back. No listener (or a host that was closed): ``ConnectionRefusedError``
after the round trip. An address no host holds, or a path that
:meth:`MemoryInternet.block` blocks: the SYNs are dropped, so the connect
hangs until the caller's cancel scope, or raises ``TimeoutError``
(``ETIMEDOUT``) after ``connect_timeout_s`` (127 s, Linux's default
``tcp_syn_retries=6``). The connection is a pair of
:class:`~._memory_stream.MemoryStream` with the latency of each direction
fixed when it is made; the listener sees the dialer's address and an
ephemeral port from the dialer's host.

*Datagrams* go through a :class:`p2p.dht.MemoryNetwork` (its latency, loss
and duplication from a :class:`p2p.dht.LinkProfile`), so :meth:`run` must
be started in a nursery before anyone sends.

*Firewalls.* :meth:`MemoryInternet.block` (one direction, one pair of hosts)
and :meth:`MemoryInternet.block_inbound` (everyone except some hosts, into
one host) model a stateful firewall: new connections on a blocked path hang;
connections already made keep flowing; a datagram on a blocked path passes
only as a reply, that is when its destination sent a datagram to its source
(same addresses and ports) within ``udp_flow_timeout_s`` (30 s, Linux's
``nf_conntrack_udp_timeout``), as NAT and conntrack let replies in.

Bounds: each listener queues at most ``backlog`` unaccepted connections (a
connect waits beyond it, as a full SYN queue makes a client retry); the
flow table is swept of expired flows whenever it doubles past 4,096 entries.

Shortcomings: one primary address per host for outgoing connections and
wildcard datagram binds; no IPv6 link-local scopes; no bandwidth limit (only
latency and each direction's buffer); datagram latency is one profile for
all paths (stream latency is per direction). ``open_sibling`` of a datagram
transport is bound by the DHT's network, not tracked by the host, so closing
the host does not close it.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from ..dht._transport import DatagramTransport, LinkProfile, MemoryNetwork, MemoryTransport
from ._memory_stream import DEFAULT_STREAM_BUFFER_BYTES, MemoryStream, memory_stream_pair
from ._types import Address

__all__ = ["InternetStatistics", "MemoryHost", "MemoryInternet", "MemoryStreamListener"]

#: Linux gives up a connect after tcp_syn_retries=6: 1+2+4+8+16+32+64 s.
DEFAULT_CONNECT_TIMEOUT_S = 127.0
#: Linux's nf_conntrack_udp_timeout: a reply may come back within 30 s.
DEFAULT_UDP_FLOW_TIMEOUT_S = 30.0
#: One-way delay of every stream direction unless set per path: a LAN's.
DEFAULT_LATENCY_S = 0.0005
#: Unaccepted connections a listener queues (Linux's default somaxconn is 4096;
#: trio's open_tcp_listeners asks for 65535 and gets that cap).
DEFAULT_BACKLOG = 128
#: Ports handed out for port 0 and outgoing connections (Linux's
#: ip_local_port_range is 32768-60999).
_EPHEMERAL = range(32768, 61000)
_FLOW_SWEEP_AT = 4096
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True)
class InternetStatistics:
    """Counters of a :class:`MemoryInternet` since it was made (``statistics()``)."""

    #: Connects that reached a listener.
    connects: int
    #: Connects refused: no listener, or a closed host.
    refused_connects: int
    #: Connects dropped: a blocked path or an address no host holds.
    dropped_connects: int
    #: Datagrams delivered, and lost (loss, firewall, nobody bound, closed).
    datagrams_delivered: int
    datagrams_lost: int


def _check_host(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address") from None


def _check_port(port: int, *, allow_zero: bool) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not (
        (0 if allow_zero else 1) <= port <= 65535
    ):
        raise OSError(errno.EINVAL, f"port out of range: {port!r}")
    return port


class MemoryInternet:
    """A set of in-memory hosts that reach each other by address.

    Args:
        latency_s: one-way delay of each stream direction (see :meth:`set_latency`).
        datagram_profile: latency, jitter, loss and duplication of datagrams.
        seed: seeds the datagram network's randomness.
        stream_buffer_bytes: unread bytes one stream direction holds before
            ``send_all`` waits.
        backlog: unaccepted connections per listener.
        connect_timeout_s: how long a connect on a blocked path hangs before
            ``TimeoutError`` (if the caller's cancel scope has not ended it).
        udp_flow_timeout_s: how long a datagram flow lets replies through a block.
    """

    def __init__(
        self,
        *,
        latency_s: float = DEFAULT_LATENCY_S,
        datagram_profile: LinkProfile | None = None,
        seed: int = 0,
        stream_buffer_bytes: int = DEFAULT_STREAM_BUFFER_BYTES,
        backlog: int = DEFAULT_BACKLOG,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        udp_flow_timeout_s: float = DEFAULT_UDP_FLOW_TIMEOUT_S,
    ) -> None:
        if latency_s < 0 or stream_buffer_bytes < 1 or backlog < 1 or connect_timeout_s <= 0:
            raise ValueError("latency_s >= 0, stream_buffer_bytes >= 1, backlog >= 1 and "
                             "connect_timeout_s > 0 are required")
        self.latency_s = latency_s
        self.stream_buffer_bytes = stream_buffer_bytes
        self.backlog = backlog
        self.connect_timeout_s = connect_timeout_s
        self.udp_flow_timeout_s = udp_flow_timeout_s
        self.datagrams = MemoryNetwork(profile=datagram_profile or LinkProfile(latency_s=latency_s),
                                       seed=seed, allow=self._allow_datagram)
        #: Every address of every host (primary and interfaces) -> its host.
        self._hosts: dict[str, MemoryHost] = {}
        self._latency: dict[tuple[str, str], float] = {}
        self._blocked: set[tuple[str, str]] = set()
        #: Host -> hosts still allowed in (block_inbound).
        self._inbound_only: dict[str, frozenset[str]] = {}
        #: (source, destination) datagram flows -> when they stop admitting replies.
        self._flows: dict[tuple[Address, Address], float] = {}
        self._flow_sweep_at = _FLOW_SWEEP_AT
        self._connects = 0
        self._refused_connects = 0
        self._dropped_connects = 0

    def statistics(self) -> InternetStatistics:
        return InternetStatistics(
            connects=self._connects,
            refused_connects=self._refused_connects,
            dropped_connects=self._dropped_connects,
            datagrams_delivered=self.datagrams.delivered,
            datagrams_lost=self.datagrams.lost,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver datagrams until cancelled (streams need no task)."""
        await self.datagrams.run(task_status=task_status)

    # -- hosts -----------------------------------------------------------------

    def host(self, address: str, *, interfaces: Iterable[str] | None = None) -> MemoryHost:
        """The host at ``address``, made on first use.

        Args:
            address: its primary address (the source of its connections);
                tests use 127.x.y.z addresses.
            interfaces: all the addresses it holds and reports from
                ``interface_hosts()`` (default: just ``address``).

        A closed host's addresses go to a new host on the next call (a
        restarted machine); until then connects to them are refused.

        Raises:
            ValueError: not an IP address, or an address another live host holds.
        """
        address = _check_host(address)
        existing = self._hosts.get(address)
        if existing is not None and not existing.closed:
            if interfaces is not None and set(map(_check_host, interfaces)) | {address} != set(
                existing.addresses
            ):
                raise ValueError(f"host {address} exists with other interfaces")
            return existing
        names = [address] + [a for a in map(_check_host, interfaces or ()) if a != address]
        for name in names:
            other = self._hosts.get(name)
            if other is not None and not other.closed and other.address != address:
                raise ValueError(f"{name} belongs to host {other.address}")
        host = MemoryHost(self, address, names)
        for name in names:
            self._hosts[name] = host
        return host

    # -- paths -----------------------------------------------------------------

    def set_latency(self, source: str, destination: str, latency_s: float) -> None:
        """One-way delay from ``source`` to ``destination`` for streams made from now on."""
        if latency_s < 0:
            raise ValueError("latency must not be negative")
        self._latency[_check_host(source), _check_host(destination)] = latency_s

    def latency(self, source: str, destination: str) -> float:
        return self._latency.get((source, destination), self.latency_s)

    def block(self, source: str, destination: str) -> None:
        """Drop new connections (and unsolicited datagrams) from ``source`` to ``destination``.

        One direction only: ``destination`` can still connect to ``source``,
        and replies to its datagrams get through (a stateful firewall).
        Connections already made are not touched.
        """
        self._blocked.add((_check_host(source), _check_host(destination)))

    def unblock(self, source: str, destination: str) -> None:
        self._blocked.discard((_check_host(source), _check_host(destination)))

    def block_inbound(self, destination: str, *, allow_from: Iterable[str] = ()) -> None:
        """Firewall ``destination``: only hosts in ``allow_from`` may open paths to it.

        For a firewalled cluster, give every member the other members as
        ``allow_from``; members still connect out to anyone.
        """
        self._inbound_only[_check_host(destination)] = frozenset(map(_check_host, allow_from))

    def unblock_inbound(self, destination: str) -> None:
        self._inbound_only.pop(_check_host(destination), None)

    def blocked(self, source: str, destination: str) -> bool:
        """Whether new connections from ``source`` to ``destination`` are dropped."""
        if source == destination:
            return False
        if (source, destination) in self._blocked:
            return True
        allowed = self._inbound_only.get(destination)
        if allowed is not None and source not in allowed:
            source_host = self._hosts.get(source)
            # Another address of the destination host itself is not "inbound".
            return source_host is None or destination not in source_host.addresses
        return False

    def _allow_datagram(self, source: Address, destination: Address) -> bool:
        now = trio.current_time()
        if self.blocked(source[0], destination[0]):
            reply_until = self._flows.get((destination, source))
            if reply_until is None or reply_until < now:
                return False
        self._flows[source, destination] = now + self.udp_flow_timeout_s
        if len(self._flows) >= self._flow_sweep_at:
            self._flows = {flow: until for flow, until in self._flows.items() if until >= now}
            self._flow_sweep_at = max(_FLOW_SWEEP_AT, 2 * len(self._flows))
        return True


class MemoryStreamListener:
    """A listener on a :class:`MemoryHost` (a :class:`~._types.StreamListener`)."""

    def __init__(self, host: MemoryHost, bind_host: str, port: int, backlog: int) -> None:
        self._host = host
        self.local_address: Address = (bind_host, port)
        self._send, self._receive = trio.open_memory_channel[tuple[MemoryStream, Address]](
            backlog
        )
        self.closed = False

    async def accept(self) -> tuple[trio.abc.HalfCloseableStream, Address]:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise trio.ClosedResourceError("the listener is closed") from None

    async def _enqueue(self, stream: MemoryStream, remote: Address) -> None:
        """Queue a connection; waits while the backlog is full."""
        await self._send.send((stream, remote))

    async def aclose(self) -> None:
        self._close_now()
        await trio.lowlevel.checkpoint()

    def _close_now(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._host._forget_listener(self)
        self._send.close()
        # Connections made but never accepted are reset, as a closed
        # listening socket resets its queue.
        while True:
            try:
                stream, _ = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            stream.abort()
        self._receive.close()


class MemoryHost:
    """One host of a :class:`MemoryInternet`; a :class:`~._types.Network`.

    Build with :meth:`MemoryInternet.host`.
    """

    def __init__(self, internet: MemoryInternet, address: str, addresses: list[str]) -> None:
        self._internet = internet
        self.address = address
        self.addresses = tuple(addresses)
        self.closed = False
        self._listeners: dict[tuple[str, int], MemoryStreamListener] = {}
        #: Local TCP ports of outgoing connections (listeners' ports are the
        #: keys of _listeners).
        self._out_ports: set[int] = set()
        self._next_ephemeral = {"tcp": _EPHEMERAL.start, "udp": _EPHEMERAL.start}
        self._streams: set[MemoryStream] = set()
        self._datagrams: list[MemoryTransport] = []

    def __repr__(self) -> str:
        return f"<MemoryHost {self.address}{' closed' if self.closed else ''}>"

    def _check_open(self) -> None:
        if self.closed:
            raise OSError(errno.ENETDOWN, f"host {self.address} is closed")

    def _local(self, host: str) -> str:
        """The bind address for ``host``: a wildcard, or one of ours."""
        if host in _WILDCARDS:
            return "0.0.0.0" if host == "" else host
        host = _check_host(host)
        if host not in self.addresses:
            raise OSError(errno.EADDRNOTAVAIL, f"{host} is not an address of {self.address}")
        return host

    def _tcp_port_taken(self, port: int) -> bool:
        return port in self._out_ports or any(port == p for _, p in self._listeners)

    def _ephemeral(self, kind: str, taken) -> int:
        start = self._next_ephemeral[kind]
        span = len(_EPHEMERAL)
        for step in range(span):
            port = _EPHEMERAL.start + (start - _EPHEMERAL.start + step) % span
            if not taken(port):
                self._next_ephemeral[kind] = port + 1 if port + 1 < _EPHEMERAL.stop else \
                    _EPHEMERAL.start
                return port
        raise OSError(errno.EADDRINUSE, f"no free {kind} port on {self.address}")

    # -- Network ---------------------------------------------------------------

    def interface_hosts(self) -> list[str]:
        return list(self.addresses)

    async def listen_stream(self, host: str, port: int) -> MemoryStreamListener:
        await trio.lowlevel.checkpoint()
        self._check_open()
        bind = self._local(host)
        port = _check_port(port, allow_zero=True)
        if port == 0:
            port = self._ephemeral("tcp", self._tcp_port_taken)
        for bound_host, bound_port in self._listeners:
            if bound_port == port and (
                bound_host == bind or bound_host in _WILDCARDS or bind in _WILDCARDS
            ):
                raise OSError(errno.EADDRINUSE, f"{bind}:{port} is in use")
        listener = MemoryStreamListener(self, bind, port, self._internet.backlog)
        self._listeners[bind, port] = listener
        return listener

    def _forget_listener(self, listener: MemoryStreamListener) -> None:
        if self._listeners.get(listener.local_address) is listener:
            del self._listeners[listener.local_address]

    def _listener_for(self, host: str, port: int) -> MemoryStreamListener | None:
        if self.closed:
            return None
        listener = self._listeners.get((host, port))
        if listener is None:
            for wildcard in _WILDCARDS:
                listener = self._listeners.get((wildcard, port))
                if listener is not None:
                    break
        return listener

    async def open_stream(self, address: Address) -> trio.abc.HalfCloseableStream:
        await trio.lowlevel.checkpoint()
        self._check_open()
        host, port = address
        host = _check_host(host)
        port = _check_port(port, allow_zero=False)
        internet = self._internet
        target = internet._hosts.get(host)
        if target is None or internet.blocked(self.address, host):
            # SYNs into the void: hang as a dropped connect does.
            internet._dropped_connects += 1
            await trio.sleep(internet.connect_timeout_s)
            raise TimeoutError(errno.ETIMEDOUT, f"connect to {host}:{port} timed out")
        forward = internet.latency(self.address, host)
        back = internet.latency(host, self.address)
        await trio.sleep(forward)
        listener = target._listener_for(host, port)
        if listener is None:
            internet._refused_connects += 1
            await trio.sleep(back)
            raise ConnectionRefusedError(errno.ECONNREFUSED,
                                         f"nothing listens on {host}:{port}")
        self._check_open()
        local_port = self._ephemeral("tcp", self._tcp_port_taken)
        local = (self.address, local_port)
        ours, theirs = memory_stream_pair(latency_s=forward, reverse_latency_s=back,
                                          capacity_bytes=internet.stream_buffer_bytes,
                                          left_address=local, right_address=(host, port))
        self._out_ports.add(local_port)
        self._own(ours, release_port=local_port)
        target._own(theirs)
        try:
            await listener._enqueue(theirs, local)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            ours.abort()
            theirs.abort()
            internet._refused_connects += 1
            await trio.sleep(back)
            raise ConnectionRefusedError(errno.ECONNREFUSED,
                                         f"nothing listens on {host}:{port}") from None
        except BaseException:
            ours.abort()
            theirs.abort()
            raise
        internet._connects += 1
        try:
            await trio.sleep(back)  # the SYN-ACK's way back
        except BaseException:
            ours.abort()
            raise
        return ours

    def _own(self, stream: MemoryStream, *, release_port: int | None = None) -> None:
        self._streams.add(stream)

        def forget() -> None:
            self._streams.discard(stream)
            if release_port is not None:
                self._out_ports.discard(release_port)

        stream.on_close = forget

    async def bind_datagram(self, host: str, port: int) -> DatagramTransport:
        await trio.lowlevel.checkpoint()
        self._check_open()
        bind = self._local(host)
        if bind in _WILDCARDS:
            bind = self.address
        port = _check_port(port, allow_zero=True)
        network = self._internet.datagrams
        if port != 0:
            transport = network.transport((bind, port))
        else:
            for _ in range(len(_EPHEMERAL)):
                candidate = self._ephemeral("udp", lambda p: False)
                try:
                    transport = network.transport((bind, candidate))
                    break
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise
            else:
                raise OSError(errno.EADDRINUSE, f"no free udp port on {self.address}")
        # Forget endpoints closed by their owners (bounded by the live ones).
        self._datagrams = [t for t in self._datagrams if not t.closed]
        self._datagrams.append(transport)
        return transport

    # -- closing ---------------------------------------------------------------

    async def aclose(self) -> None:
        """Take the host down: close its listeners and datagram endpoints, reset its
        connections (their other ends break). Connects to it are refused from now on."""
        self.closed = True
        for listener in list(self._listeners.values()):
            listener._close_now()
        for stream in list(self._streams):
            stream.abort()
        for transport in self._datagrams:
            if not transport.closed:
                await transport.aclose()
        self._datagrams.clear()
        await trio.lowlevel.checkpoint()
