"""Ports for servers that must be told their port before they bind (a daemon
started as a process, a double, ``cosmicac up``'s base port).

Asking the kernel for port 0 and releasing it hands out a port of the
ephemeral range, the same range every outgoing connection takes its local
port from: on a busy machine (a second suite beside this one) a client socket
may hold that port by the time the server binds it, and the server fails, or
a peer waits for it in vain. These are drawn at random below that range and
checked free (TCP, and UDP if asked) on 127.0.0.1 before they are returned.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Lowest port handed out: above the registered services tests might meet.
LOWEST = 20000
#: Where the ephemeral range starts when /proc does not say.
_EPHEMERAL_DEFAULT = 32768
_TRIES = 100


def _ephemeral_first() -> int:
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_DEFAULT
    return first if first > LOWEST + 1000 else _EPHEMERAL_DEFAULT


def free_ports(count: int = 1, *, udp: bool = False) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 (TCP, and UDP
    with ``udp``), below the ephemeral range."""
    kinds = (socket.SOCK_STREAM, socket.SOCK_DGRAM) if udp else (socket.SOCK_STREAM,)
    highest = _ephemeral_first() - count
    for _ in range(_TRIES):
        base = random.randrange(LOWEST, highest)
        try:
            for port in range(base, base + count):
                for kind in kinds:
                    with socket.socket(socket.AF_INET, kind) as sock:
                        sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no {count} free consecutive ports in {LOWEST}-{highest + count}")


def free_port(*, udp: bool = False) -> int:
    """One port free on 127.0.0.1, below the ephemeral range."""
    return free_ports(1, udp=udp)
