"""Ports for servers that must be told their port before they bind (a daemon
started as a process, a double, ``cosmicac up``'s base port).

Asking the kernel for port 0 and releasing it hands out a port of the
ephemeral range, the same range every outgoing connection takes its local
port from: on a busy machine (a second suite beside this one) a client socket
may hold that port by the time the server binds it, and the server fails, or
a peer waits for it in vain. These are drawn at random below that range and
checked free (TCP, and UDP if asked) on 127.0.0.1 before they are returned.

A port checked free is not yet bound: between the check and the server's bind
(a process start, a second or more) another caller — this process, another
xdist worker, a second suite beside this one — could draw it too. So each port
handed out is also reserved machine-wide, as a file created exclusively in a
shared folder, and no caller takes a port reserved in the last
``RESERVED_FOR_S`` seconds.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

#: Lowest port handed out: above the registered services tests might meet.
LOWEST = 20000
#: Where the ephemeral range starts when /proc does not say.
_EPHEMERAL_DEFAULT = 32768
_TRIES = 200
#: How long a port handed out stays out of other callers' reach.
RESERVED_FOR_S = 900.0
RESERVATIONS = Path(tempfile.gettempdir()) / "cosmicac-test-ports"


def _ephemeral_first() -> int:
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_DEFAULT
    return first if first > LOWEST + 1000 else _EPHEMERAL_DEFAULT


def _reserve(port: int) -> bool:
    """Take ``port``'s reservation, unless another caller holds a live one."""
    path = RESERVATIONS / str(port)
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return True
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime < RESERVED_FOR_S:
                    return False
                path.unlink()  # stale: take it over (of two racing takers one wins)
            except FileNotFoundError:
                pass
    return False


def _release(port: int) -> None:
    (RESERVATIONS / str(port)).unlink(missing_ok=True)


def _bindable(port: int, kinds: tuple[int, ...]) -> bool:
    try:
        for kind in kinds:
            with socket.socket(socket.AF_INET, kind) as sock:
                sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def free_ports(count: int = 1, *, udp: bool = False) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 (TCP, and UDP
    with ``udp``), below the ephemeral range, reserved for this caller."""
    kinds = (socket.SOCK_STREAM, socket.SOCK_DGRAM) if udp else (socket.SOCK_STREAM,)
    highest = _ephemeral_first() - count
    RESERVATIONS.mkdir(exist_ok=True)
    for _ in range(_TRIES):
        base = random.randrange(LOWEST, highest)
        taken: list[int] = []
        for port in range(base, base + count):
            if not _reserve(port):
                break
            taken.append(port)
            if not _bindable(port, kinds):
                break
        else:
            return base
        for port in taken:
            _release(port)
    raise RuntimeError(f"no {count} free consecutive ports in {LOWEST}-{highest + count} "
                       f"(reservations in {RESERVATIONS})")


def free_port(*, udp: bool = False) -> int:
    """One port free on 127.0.0.1, below the ephemeral range."""
    return free_ports(1, udp=udp)
