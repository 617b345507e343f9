"""The real network: TCP streams and UDP datagrams on trio sockets.

:class:`SocketNetwork` does what the swarm, the relay client and the CLI did
by hand: ``trio.open_tcp_stream`` / ``trio.open_tcp_listeners`` for streams
(trio's ``SocketStream`` sets ``TCP_NODELAY``; we set it again so the promise
does not rest on trio's default) and :meth:`p2p.dht.UdpTransport.bind` for
datagrams. A wildcard host (``""``, ``0.0.0.0``, ``::``) listens as
``open_tcp_listeners`` does; when it opens several sockets (IPv4 and IPv6
for ``""``), the first is kept and the others are closed, as the swarm did.
"""

from __future__ import annotations

import socket
import time

import trio

from ..addresses import interface_addresses
from ..dht._contact import canonical_address
from ..dht._transport import DatagramTransport, UdpTransport
from ._types import Address

__all__ = ["SocketNetwork", "SocketStreamListener"]

#: Linux's ioctl to read an interface's (first) IPv4 address.


def _set_nodelay(stream: trio.SocketStream) -> None:
    try:
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
    except OSError:  # pragma: no cover - a socket that is already shut
        pass


def _peer(stream: trio.SocketStream) -> Address:
    host, port = stream.socket.getpeername()[:2]
    try:
        return canonical_address(host, port)
    except ValueError:  # pragma: no cover - not an IP socket
        return (host, port)


def _one_error(exc: OSError, host: str, port: int) -> OSError:
    """The error to raise for a failed ``open_tcp_stream``.

    trio raises a bare ``OSError("all attempts ... failed")`` (no errno) from
    an exception group of each address's error. When they agree (one address
    refused, say) raise that one's type and errno, so callers can tell
    ``ConnectionRefusedError`` from a timeout as the protocol promises.
    """
    if exc.errno is not None:
        return exc
    cause = exc.__cause__
    errors = list(cause.exceptions) if isinstance(cause, BaseExceptionGroup) else []
    codes = {getattr(error, "errno", None) for error in errors}
    if len(codes) != 1 or None in codes:
        return exc
    first = errors[0]
    return type(first)(first.errno, f"cannot connect to {host}:{port}: {first.strerror}")


class SocketStreamListener:
    """One listening TCP socket (a :class:`~._types.StreamListener`)."""

    def __init__(self, listener: trio.SocketListener) -> None:
        self.listener = listener
        host, port = listener.socket.getsockname()[:2]
        self.local_address: Address = (host, port)

    async def accept(self) -> tuple[trio.abc.HalfCloseableStream, Address]:
        stream = await self.listener.accept()
        _set_nodelay(stream)
        try:
            return stream, _peer(stream)
        except OSError:
            # The peer reset before we asked its name (ENOTCONN): drop it and
            # let the caller accept the next one, as trio's listener does for
            # ECONNABORTED.
            await trio.aclose_forcefully(stream)
            return await self.accept()

    async def aclose(self) -> None:
        await self.listener.aclose()


#: How long SocketNetwork keeps what it read of the interface tables.
INTERFACES_TTL_S = 5.0


class SocketNetwork:
    """The host's real network (a :class:`~._types.Network`)."""

    def __init__(self) -> None:
        self._interfaces: tuple[float, list[str]] | None = None

    async def open_stream(self, address: Address) -> trio.abc.HalfCloseableStream:
        host, port = address
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise _one_error(exc, host, port) from exc
        _set_nodelay(stream)
        return stream

    async def listen_stream(self, host: str, port: int) -> SocketStreamListener:
        listeners = await trio.open_tcp_listeners(port, host=host or None)
        for extra in listeners[1:]:
            await extra.aclose()
        return SocketStreamListener(listeners[0])

    async def bind_datagram(self, host: str, port: int) -> DatagramTransport:
        return await UdpTransport.bind(host or "0.0.0.0", port, dual_stack=host == "::")

    def interface_hosts(self) -> list[str]:
        """This host's reachable interface addresses (:func:`p2p.addresses.interface_addresses`).

        Read at most every ``INTERFACES_TTL_S``: every dial and announce asks,
        and reading the kernel's tables costs about 0.2 ms; interfaces change
        rarely, and a change is seen within the TTL."""
        now = time.monotonic()
        if self._interfaces is None or now - self._interfaces[0] >= INTERFACES_TTL_S:
            self._interfaces = (now, interface_addresses())
        return list(self._interfaces[1])
