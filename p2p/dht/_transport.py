"""Datagram transports for the DHT: real UDP, and an in-memory network for tests.

The DHT driver talks to a :class:`DatagramTransport`: ``send(data, address)``
never blocks for long and may silently lose a datagram (as UDP may);
``receive()`` returns the next ``(data, source)``. Two implementations:

* :class:`UdpTransport` — a trio UDP socket bound to one address, IPv4 or IPv6
  (``::`` with ``dual_stack=True`` also takes IPv4, seen as IPv4 addresses).
* :class:`MemoryNetwork` / :class:`MemoryTransport` — many nodes in one process
  with no sockets, like trio's ``FakeNet``: a router delivers datagrams after a
  latency, drops and duplicates them with a seeded ``random.Random``, and runs
  on trio's clock, so tests under the autojump clock never sleep in real time.

Both keep a bounded receive queue; a datagram arriving at a full queue is
dropped and counted, as a kernel drops at a full socket buffer.
"""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from ._contact import canonical_address

__all__ = [
    "DatagramTransport",
    "LinkProfile",
    "MemoryNetwork",
    "MemoryTransport",
    "TransportStatistics",
    "UdpTransport",
]

Address = tuple[str, int]

#: Datagrams queued for a node that has not read them yet; beyond it, drops.
DEFAULT_RECEIVE_QUEUE = 1024
#: Largest datagram read; our messages stay under 1,400 bytes.
_RECEIVE_BYTES = 2048


class DatagramTransport(Protocol):
    local_address: Address

    async def send(self, data: bytes, address: Address) -> None: ...

    async def open_sibling(self) -> DatagramTransport:
        """Another endpoint on the same host, on a port of its own (the source
        of reachability probes)."""
        ...

    async def receive(self) -> tuple[bytes, Address]: ...

    async def aclose(self) -> None: ...


@dataclass
class TransportStatistics:
    sent: int = 0
    received: int = 0
    send_errors: int = 0
    dropped_queue_full: int = 0


class UdpTransport:
    """One UDP socket. Build with :meth:`bind`."""

    def __init__(self, raw: socket.socket) -> None:
        # The datagram path calls the non-blocking stdlib socket itself and
        # waits on it with trio's wait_readable/wait_writable: trio's
        # sendto/recvfrom re-resolve the address and re-read the family on
        # every call, a third of a small datagram's cost (py-spy, issue 26).
        raw.setblocking(False)
        self._raw = raw
        self._socket = trio.socket.from_stdlib_socket(raw)  # closes with notify_closing
        self._v6 = raw.family == socket.AF_INET6
        sock = self._socket
        host, port = sock.getsockname()[:2]
        self.local_address: Address = canonical_address(host, port)
        self.stats = TransportStatistics()

    @classmethod
    async def bind(cls, host: str = "127.0.0.1", port: int = 0, *, dual_stack: bool = False):
        """Bind a UDP socket on ``host:port`` (port 0: any free port).

        Raises:
            OSError: the address cannot be bound (in use, not local ...).
        """
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
            # Numeric hosts only (no resolver); trio's bind would resolve in a thread.
            info = await trio.socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM)
            sock.bind(info[0][4])
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    async def open_sibling(self) -> UdpTransport:
        family = self._socket.family
        dual = family == socket.AF_INET6 and not self._socket.getsockopt(
            socket.IPPROTO_IPV6, socket.IPV6_V6ONLY
        )
        return await UdpTransport.bind(self.local_address[0], 0, dual_stack=dual)

    async def send(self, data: bytes, address: Address) -> None:
        """Send one datagram. Returns at once unless the socket buffer is full
        (then it waits until it drains): a send is not a checkpoint, callers
        that loop over sends yield elsewhere (a receive, an event)."""
        target = address
        if self._v6 and ":" not in address[0]:
            target = (f"::ffff:{address[0]}", address[1])  # IPv4 peer, dual-stack socket
        if self._raw.fileno() == -1:
            raise trio.ClosedResourceError("transport closed")
        while True:
            try:
                self._raw.sendto(data, target)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(self._raw)
                continue
            except OSError as exc:
                # UDP is lossy anyway: an unreachable or refused peer is a lost datagram.
                if exc.errno not in (errno.ECONNREFUSED, errno.ENETUNREACH, errno.EHOSTUNREACH,
                                     errno.EAFNOSUPPORT, errno.EINVAL, errno.EPERM):
                    raise
                self.stats.send_errors += 1
                return
            self.stats.sent += 1
            return

    async def receive(self) -> tuple[bytes, Address]:
        # Yields once per datagram, as trio's recvfrom: waiting for one is a
        # yield, and one that was already there is followed by a checkpoint,
        # so a flood of datagrams cannot keep the other tasks from running.
        waited = False
        while True:
            try:
                data, source = self._raw.recvfrom(_RECEIVE_BYTES)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._raw)
                waited = True
                continue
            except ConnectionRefusedError:
                continue  # ICMP port unreachable from an earlier send: not for us
            except OSError:
                if self._raw.fileno() == -1:
                    raise trio.ClosedResourceError("transport closed") from None
                raise
            self.stats.received += 1
            if not waited:
                await trio.lowlevel.checkpoint()
            return data, canonical_address(source[0], source[1])

    async def aclose(self) -> None:
        self._socket.close()
        await trio.lowlevel.checkpoint()


@dataclass
class LinkProfile:
    """How the in-memory network treats datagrams (all randomness seeded)."""

    latency_s: float = 0.0005
    """One-way delay of every datagram."""

    jitter_s: float = 0.0
    """Extra uniform random delay in [0, jitter_s]."""

    loss: float = 0.0
    """Probability that a datagram is lost."""

    duplicate: float = 0.0
    """Probability that a datagram arrives twice."""


@dataclass
class MemoryNetwork:
    """A router for in-memory transports on addresses ``10.x.y.z:port``.

    Delivery runs as tasks in the nursery given to :meth:`run`, which must be
    started before nodes send.
    """

    profile: LinkProfile = field(default_factory=LinkProfile)
    seed: int = 0
    receive_queue: int = DEFAULT_RECEIVE_QUEUE
    #: Optional filter ``(source, destination) -> bool``: False drops (a firewall).
    allow: Callable[[Address, Address], bool] | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._nodes: dict[Address, MemoryTransport] = {}
        self._next_host = 1
        self._deliveries: trio.MemorySendChannel | None = None
        self.delivered = 0
        self.lost = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Deliver datagrams until cancelled."""
        send, receive = trio.open_memory_channel[tuple[float, bytes, Address, Address]](
            float("inf")  # bounded by the senders: each send puts at most two entries
        )
        self._deliveries = send
        async with trio.open_nursery() as nursery:
            task_status.started()
            async for due, data, source, destination in receive:
                nursery.start_soon(self._deliver_at, due, data, source, destination)

    def transport(self, address: Address | None = None) -> MemoryTransport:
        """A new node's transport, at ``address`` or the next free 10.x.y.z:9000."""
        if address is None:
            n = self._next_host
            self._next_host += 1
            address = (f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", 9000)
        address = canonical_address(*address)
        if address in self._nodes:
            raise OSError(errno.EADDRINUSE, f"{address} is in use")
        node = MemoryTransport(self, address, self.receive_queue)
        self._nodes[address] = node
        return node

    def _route(self, data: bytes, source: Address, destination: Address) -> None:
        if self._deliveries is None:
            raise RuntimeError("MemoryNetwork.run() must be started before sending")
        if self.allow is not None and not self.allow(source, destination):
            self.lost += 1
            return
        profile = self.profile
        copies = 2 if self._rng.random() < profile.duplicate else 1
        for _ in range(copies):
            if self._rng.random() < profile.loss:
                self.lost += 1
                continue
            delay = profile.latency_s + self._rng.random() * profile.jitter_s
            self._deliveries.send_nowait((trio.current_time() + delay, data, source, destination))

    async def _deliver_at(self, due: float, data: bytes, source: Address, dest: Address) -> None:
        await trio.sleep_until(due)
        node = self._nodes.get(dest)
        if node is None or node.closed:
            self.lost += 1
            return
        node._arrive(data, source)
        self.delivered += 1

    def _forget(self, address: Address) -> None:
        self._nodes.pop(address, None)


class MemoryTransport:
    """One node's endpoint on a :class:`MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, address: Address, queue: int) -> None:
        self._network = network
        self.local_address = address
        self.closed = False
        self.stats = TransportStatistics()
        self._send, self._receive = trio.open_memory_channel[tuple[bytes, Address]](queue)

    async def open_sibling(self) -> MemoryTransport:
        await trio.lowlevel.checkpoint()
        host = self.local_address[0]
        port = self.local_address[1] + 1
        while (host, port) in self._network._nodes:
            port += 1
        return self._network.transport((host, port))

    async def send(self, data: bytes, address: Address) -> None:
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise trio.ClosedResourceError("transport closed")
        self.stats.sent += 1
        self._network._route(bytes(data), self.local_address, canonical_address(*address))

    async def receive(self) -> tuple[bytes, Address]:
        data, source = await self._receive.receive()
        self.stats.received += 1
        return data, source

    def _arrive(self, data: bytes, source: Address) -> None:
        try:
            self._send.send_nowait((data, source))
        except trio.WouldBlock:
            self.stats.dropped_queue_full += 1

    async def aclose(self) -> None:
        self.closed = True
        self._network._forget(self.local_address)
        await self._receive.aclose()
