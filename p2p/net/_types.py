"""What a swarm needs from the network: streams out, streams in, datagrams, own addresses.

Two implementations follow these protocols: :class:`~._socket.SocketNetwork`
(trio sockets) and the hosts of a :class:`~._memory.MemoryInternet` (no
sockets, trio's clock). Code that takes a :class:`Network` runs unchanged on
both, so a whole swarm can be tested under the autojump clock.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import trio

from ..dht._transport import DatagramTransport

__all__ = ["Address", "Network", "StreamListener"]

#: ``(host, port)``: an IP address in text form and a port number.
Address = tuple[str, int]


@runtime_checkable
class StreamListener(Protocol):
    """A listening stream endpoint; :meth:`accept` hands out the connections made to it."""

    #: The ``(host, port)`` it listens on; the host is the one asked for, so a
    #: wildcard (``0.0.0.0``, ``::``) stays a wildcard, as ``getsockname()`` says.
    local_address: Address

    async def accept(self) -> tuple[trio.abc.HalfCloseableStream, Address]:
        """Wait for the next connection; return it and the dialer's ``(host, port)``.

        Raises:
            trio.ClosedResourceError: the listener was closed (before or during the wait).
        """
        ...

    async def aclose(self) -> None:
        """Stop listening; connects made afterwards are refused."""
        ...


@runtime_checkable
class Network(Protocol):
    """One host's view of the network: open and accept streams, bind datagrams."""

    async def open_stream(self, address: Address) -> trio.abc.HalfCloseableStream:
        """Connect to ``address``.

        Raises:
            ConnectionRefusedError: nothing listens there (errno ``ECONNREFUSED``).
            OSError: another failure. A path that drops packets hangs the way a
                TCP connect whose SYNs are dropped does (until the caller's
                cancel scope, or ``TimeoutError``/``ETIMEDOUT`` after the
                network's connect timeout): callers bound it with
                ``trio.fail_after``/``move_on_after``.
        """
        ...

    async def listen_stream(self, host: str, port: int) -> StreamListener:
        """Listen on ``host:port`` (``port`` 0: a free port; ``host`` may be a wildcard).

        Raises:
            OSError: ``EADDRINUSE`` when the port is taken, ``EADDRNOTAVAIL``
                when ``host`` is not one of this host's addresses.
        """
        ...

    async def bind_datagram(self, host: str, port: int) -> DatagramTransport:
        """A datagram endpoint on ``host:port`` (``port`` 0: a free port).

        Raises:
            OSError: as :meth:`listen_stream`.
        """
        ...

    def interface_hosts(self) -> list[str]:
        """This host's own addresses others may reach it on (no loopback, no link-local)."""
        ...
