"""TCP simultaneous open: both ends connect() to each other from a port they told
each other, so each NAT sees an outgoing SYN before the peer's arrives and lets
it in (shared/reference/nat-traversal.md §3.3).

Every socket of one punch binds the same local port (``SO_REUSEPORT``), one per
address of the peer, so a port-preserving NAT maps them all to one public port,
the one announced. A refused or unanswered connect is retried with a fresh
socket until the deadline: a NAT or host that answers the first SYN with a RST
(the peer's own SYN not sent yet) refuses only that one.

The first SYN goes out with a small TTL (2: through our own NAT, which then
holds a mapping for the peer, and no further than the next router): a NAT whose
own stack answers unsolicited packets (a RST) would otherwise answer the peer's
SYN if it came first, and conntrack, seeing that closed entry clash with ours,
would move our mapping to another port (reference §4.2). The SYN at full TTL
follows a moment later, when both NATs expect the other's.

The port also listens while the punch runs. Where nothing drops the first SYN
(a LAN, loopback, an open host) it meets no socket of the peer's in SYN-SENT
and would be refused; the listener takes it instead. Where a NAT dropped it, the
peer's retransmitted SYN finds our own connect in SYN-SENT (the kernel matches
a connection's exact addresses before any listener): a simultaneous open.
"""

from __future__ import annotations

import errno
import logging
import os
import socket

import trio

__all__ = ["PunchSocket", "simultaneous_open"]

log = logging.getLogger(__name__)

Address = tuple[str, int]

#: connect() failures that mean "not yet": the peer's SYN or mapping is not
#: there yet, or a router on the way refused this one.
_RETRYABLE = {errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH,
              errno.ECONNRESET, errno.EADDRNOTAVAIL, errno.EADDRINUSE}


_BACKLOG = 8
#: Linux's default IP TTL (net.ipv4.ip_default_ttl).
_DEFAULT_TTL = 64


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
        log.debug("punch.accepted from=%s:%d", *address[:2])
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return trio.SocketStream(sock), address[:2]

    @property
    def port(self) -> int:
        return self._holder.getsockname()[1]

    def close(self) -> None:
        self._holder.close()


async def _connect(port: int, address: Address, *, ttl: int | None,
                   wait_s: float) -> trio.SocketStream | None:
    """One connect from ``port``; its first SYN at ``ttl`` hops (then the
    socket's later packets, retransmitted SYNs included, at full TTL). None if
    nothing answered within ``wait_s``; OSError if it failed."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("0.0.0.0", port))
        if ttl is not None:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
        # The SYN leaves inside connect_ex(): the TTL can be raised at once, so a
        # retransmitted SYN (same sequence number) travels the whole way.
        code = sock.connect_ex(address)
        if ttl is not None:
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, _DEFAULT_TTL)
        if code not in (0, errno.EINPROGRESS):
            raise OSError(code, os.strerror(code))
        with trio.move_on_after(wait_s):
            await trio.lowlevel.wait_writable(sock)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise OSError(code, os.strerror(code))
            stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
            sock = None  # the stream owns it now
            return stream
        return None
    finally:
        if sock is not None:
            sock.close()


async def simultaneous_open(port: int, address: Address, *, deadline: float,
                            try_s: float = 2.0, pause_s: float = 0.1,
                            first_ttl: int | None = 2) -> trio.SocketStream:
    """Connect from ``port`` to ``address`` until it works or ``deadline`` passes.

    The first SYN goes ``first_ttl`` hops (None: the whole way). When a router
    on the way kills it with a time-exceeded error, the next attempt follows at
    once: a NAT tracks the mapping by the SYN's sequence number, and the kernel's
    next one for the same addresses is within the NAT's window only for a few
    milliseconds (Linux's initial sequence numbers advance with the clock).

    Raises:
        TimeoutError: no attempt connected before the deadline.
        OSError: a failure that retrying cannot cure (a bad address, say).
    """
    attempts = 0
    last: OSError | None = None
    while trio.current_time() < deadline:  # bounded by the deadline
        attempts += 1
        opening = attempts == 1 and first_ttl is not None
        wait = max(0.0, min(deadline - trio.current_time(), try_s))
        try:
            stream = await _connect(port, address, ttl=first_ttl if opening else None,
                                    wait_s=wait)
            if stream is not None:
                return stream
            last = TimeoutError(errno.ETIMEDOUT, "no answer")
        except OSError as exc:
            if exc.errno not in _RETRYABLE:
                raise
            last = exc
        log.debug("punch.attempt to=%s:%d ttl=%s result=%s", *address,
                  first_ttl if opening else "default", last)
        if not (opening and last.errno == errno.EHOSTUNREACH):
            await trio.sleep(pause_s)
    raise TimeoutError(errno.ETIMEDOUT, f"no simultaneous open with {address[0]}:{address[1]} "
                       f"in {attempts} attempts (last: {last})")
