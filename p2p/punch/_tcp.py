"""TCP simultaneous open: both ends connect() to each other from a port they told
each other, so each NAT sees an outgoing SYN before the peer's arrives and lets
it in (shared/reference/nat-traversal.md §3.3).

Every socket of one punch binds the same local port (``SO_REUSEPORT``), one per
address of the peer, so a port-preserving NAT maps them all to one public port,
the one announced. A refused or unanswered connect is retried with a fresh
socket until the deadline: a NAT or host that answers the first SYN with a RST
(the peer's own SYN not sent yet) refuses only that one.

The port also listens while the punch runs. Where nothing drops the first SYN
(a LAN, loopback, an open host) it meets no socket of the peer's in SYN-SENT
and would be refused; the listener takes it instead. Where a NAT dropped it, the
peer's retransmitted SYN finds our own connect in SYN-SENT (the kernel matches
a connection's exact addresses before any listener): a simultaneous open.
"""

from __future__ import annotations

import errno
import socket

import trio

__all__ = ["PunchSocket", "simultaneous_open"]

Address = tuple[str, int]

#: connect() failures that mean "not yet": the peer's SYN or mapping is not
#: there yet, or a router on the way refused this one.
_RETRYABLE = {errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
              errno.ECONNRESET, errno.EADDRNOTAVAIL, errno.EADDRINUSE}


_BACKLOG = 8


def _socket(port: int) -> trio.socket.SocketType:
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


class PunchSocket:
    """The local port of one punch, held and listening while it runs."""

    def __init__(self) -> None:
        self._holder = _socket(0)

    async def bind(self) -> int:
        await self._holder.bind(("0.0.0.0", 0))
        self._holder.listen(_BACKLOG)
        return self.port

    async def accept(self) -> tuple[trio.SocketStream, Address]:
        sock, address = await self._holder.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return trio.SocketStream(sock), address[:2]

    @property
    def port(self) -> int:
        return self._holder.getsockname()[1]

    def close(self) -> None:
        self._holder.close()


async def simultaneous_open(port: int, address: Address, *, deadline: float,
                            try_s: float = 2.0, pause_s: float = 0.1) -> trio.SocketStream:
    """Connect from ``port`` to ``address`` until it works or ``deadline`` passes.

    Raises:
        TimeoutError: no attempt connected before the deadline.
        OSError: a failure that retrying cannot cure (a bad address, say).
    """
    attempts = 0
    last: OSError | None = None
    while trio.current_time() < deadline:  # bounded by the deadline
        attempts += 1
        sock = _socket(port)
        try:
            await sock.bind(("0.0.0.0", port))
            with trio.move_on_at(min(deadline, trio.current_time() + try_s)):
                await sock.connect(address)
                return trio.SocketStream(sock)
            last = TimeoutError(errno.ETIMEDOUT, "no answer")
        except OSError as exc:
            if exc.errno not in _RETRYABLE:
                sock.close()
                raise
            last = exc
        sock.close()
        await trio.sleep(pause_s)
    raise TimeoutError(errno.ETIMEDOUT, f"no simultaneous open with {address[0]}:{address[1]} "
                       f"in {attempts} attempts (last: {last})")
