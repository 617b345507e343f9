"""Packet capture without tcpdump: an AF_PACKET socket in one namespace, written to a file.

As a script (stdlib only), run inside the namespace to watch::

    python capture.py --out FILE [--iface any] [--max-bytes N] [--max-seconds S]

It opens the socket, prints ``READY <iface>`` on stdout, then records every packet the
namespace sends or receives on ``--iface`` ("any": all its interfaces, ``lo`` included)
until SIGTERM/SIGINT or ``--max-seconds``. After ``--max-bytes`` of file it stops writing
but keeps counting. On exit it drains what the kernel still holds and prints one JSON line
of counts (packets, bytes, written, truncated, kernel_drops).

The socket is SOCK_DGRAM ("cooked"): each record holds the layer-3 packet (IPv4/IPv6 …)
without the link header, the interface name and the packet type (incoming, outgoing, …).
File: ``MAGIC`` then records of ``RECORD`` (time, pkttype, len(ifname), ethertype,
original length, stored length) + ifname + stored bytes.

From a test, :class:`Capture` starts it with a topology, waits for READY, and on
:meth:`Capture.stop` parses the file into :class:`Packet` objects (TCP/UDP payloads split
out) in a :class:`CaptureResult`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.netns.topology import Topology

SCRIPT = Path(__file__).resolve()
MAGIC = b"CACCAP1\n"
RECORD = struct.Struct("<dBBHII")  # time, pkttype, ifname length, ethertype, orig, stored
ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
SOL_PACKET = 263
PACKET_STATISTICS = 6
PACKET_OUTGOING = 4
TCP = 6
UDP = 17
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_SECONDS = 300.0
BUFFER = 256 * 1024  # above the largest GSO packet a veth hands the socket
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RCVBUF = 64 * 1024 * 1024  # the kernel's queue for the capture socket (see _capture)


# -- the capture process ---------------------------------------------------------------


def _capture(args: argparse.Namespace) -> int:
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)  # a signal wakes the select below at once
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
    # SO_RCVBUF is capped by net.core.rmem_max (a few hundred KiB by default), which a
    # relayed transfer on a busy machine overruns while this process waits for a core;
    # as root, SO_RCVBUFFORCE gets past the cap. Either may be refused: keep the default.
    for option in (SO_RCVBUFFORCE, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, RCVBUF)
            break
        except OSError:
            continue
    if args.iface != "any":
        sock.bind((args.iface, ETH_P_ALL))
    sock.setblocking(False)

    buf = bytearray(BUFFER)
    view = memoryview(buf)
    packets = total = written = 0
    truncated = False
    deadline = time.monotonic() + args.max_seconds
    with open(args.out, "wb") as out:
        out.write(MAGIC)
        out.flush()
        print(f"READY {args.iface}", flush=True)

        def drain(limit: int) -> None:
            nonlocal packets, total, written, truncated
            for _ in range(limit):
                try:
                    n, addr = sock.recvfrom_into(buf)
                except BlockingIOError:
                    return
                now = time.time()
                packets += 1
                total += n
                stored = min(n, args.snaplen)
                ifname = addr[0].encode()[:255]
                size = RECORD.size + len(ifname) + stored
                if written + size > args.max_bytes:
                    truncated = True
                    continue
                out.write(RECORD.pack(now, addr[2], len(ifname), addr[1], n, stored))
                out.write(ifname)
                out.write(view[:stored])
                written += size

        while not stop and time.monotonic() < deadline:
            remaining = max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([sock, wake_r], [], [], min(remaining, 1.0))
            if sock in readable:
                drain(1000)
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
        drain(1_000_000)  # what the kernel queued before the stop (bounded)
        out.flush()

    drops = -1
    with contextlib.suppress(OSError):
        _, drops = struct.unpack("II", sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8))
    sock.close()
    summary = {
        "packets": packets,
        "bytes": total,
        "written": written,
        "truncated": truncated,
        "kernel_drops": drops,
    }
    print(json.dumps(summary), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="file to write")
    parser.add_argument("--iface", default="any", help='interface name, or "any"')
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    parser.add_argument("--max-seconds", type=float, default=DEFAULT_MAX_SECONDS)
    parser.add_argument("--snaplen", type=int, default=BUFFER, help="bytes kept per packet")
    return _capture(parser.parse_args(argv))


# -- reading a capture -----------------------------------------------------------------


@dataclass(frozen=True)
class Packet:
    """One captured packet; ``data`` is the layer-3 packet, ``payload`` its TCP/UDP data."""

    time: float
    ifname: str
    pkttype: int
    ethertype: int
    length: int
    data: bytes
    src: str | None = None
    dst: str | None = None
    proto: int | None = None
    sport: int | None = None
    dport: int | None = None
    payload: bytes = b""

    @property
    def outgoing(self) -> bool:
        return self.pkttype == PACKET_OUTGOING


def _parse(time_: float, ifname: str, pkttype: int, ethertype: int, length: int, data: bytes
           ) -> Packet:
    src = dst = None
    proto = None
    l4 = b""
    if ethertype == ETH_P_IP and len(data) >= 20 and data[0] >> 4 == 4:
        ihl = (data[0] & 0x0F) * 4
        total = int.from_bytes(data[2:4], "big") or len(data)  # 0 for some GSO packets
        fragment_offset = int.from_bytes(data[6:8], "big") & 0x1FFF
        proto = data[9]
        src = socket.inet_ntop(socket.AF_INET, data[12:16])
        dst = socket.inet_ntop(socket.AF_INET, data[16:20])
        if fragment_offset == 0:
            l4 = data[ihl:max(total, ihl)]
    elif ethertype == ETH_P_IPV6 and len(data) >= 40 and data[0] >> 4 == 6:
        proto = data[6]  # extension headers are not followed
        src = socket.inet_ntop(socket.AF_INET6, data[8:24])
        dst = socket.inet_ntop(socket.AF_INET6, data[24:40])
        l4 = data[40:]
    sport = dport = None
    payload = b""
    if proto in (TCP, UDP) and len(l4) >= 8:
        sport = int.from_bytes(l4[0:2], "big")
        dport = int.from_bytes(l4[2:4], "big")
        if proto == UDP:
            payload = l4[8:]
        elif len(l4) >= 20:
            payload = l4[(l4[12] >> 4) * 4:]
    return Packet(time_, ifname, pkttype, ethertype, length, data, src, dst, proto, sport,
                  dport, payload)


def iter_capture(path: str | os.PathLike[str]) -> Iterator[Packet]:
    """The packets of a capture file (a torn last record is ignored)."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{path}: not a capture file")
        while header := f.read(RECORD.size):
            if len(header) < RECORD.size:
                return
            time_, pkttype, name_len, ethertype, length, stored = RECORD.unpack(header)
            ifname = f.read(name_len)
            data = f.read(stored)
            if len(ifname) < name_len or len(data) < stored:
                return
            yield _parse(time_, ifname.decode(errors="replace"), pkttype, ethertype, length,
                         data)


def read_capture(path: str | os.PathLike[str]) -> list[Packet]:
    return list(iter_capture(path))


@dataclass
class CaptureResult:
    """What a capture saw: its packets and the capture process's own counts."""

    packets: list[Packet]
    summary: dict[str, Any] = field(default_factory=dict)

    def with_payload(self, marker: bytes) -> list[Packet]:
        """Packets whose TCP/UDP payload contains ``marker``."""
        return [p for p in self.packets if marker in p.payload]

    def contains(self, marker: bytes) -> bool:
        """Whether ``marker`` occurs anywhere in any captured packet (headers included)."""
        return any(marker in p.data for p in self.packets)


class Capture:
    """The capture script run inside one host of a topology.

    ``with Capture(topo, "relay", tmp_path / "relay.cap") as cap: ...; result = cap.stop()``
    — ``start`` returns once the socket is open; ``stop`` (SIGTERM) returns the result.
    Leaving the ``with`` block stops it if the test did not.
    """

    def __init__(
        self,
        topo: Topology,
        host: str,
        out: str | os.PathLike[str],
        *,
        iface: str = "any",
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_seconds: float = DEFAULT_MAX_SECONDS,
    ) -> None:
        self.topo = topo
        self.host = host
        self.out = Path(out)
        self.argv = [
            str(SCRIPT), "--out", str(self.out), "--iface", iface,
            "--max-bytes", str(max_bytes), "--max-seconds", str(max_seconds),
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.result: CaptureResult | None = None

    def start(self, timeout: float = 10.0) -> Capture:
        from tests.netns.topology import read_line

        self.proc = self.topo.python(self.host, *self.argv, stdout=subprocess.PIPE)
        read_line(self.proc, timeout=timeout, startswith="READY")
        return self

    def stop(self, timeout: float = 10.0) -> CaptureResult:
        if self.result is not None:
            return self.result
        assert self.proc is not None, "the capture was not started"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=timeout)
        lines = out.decode(errors="replace").strip().splitlines()
        summary = json.loads(lines[-1]) if lines else {}
        if self.proc.returncode != 0 or not summary:
            raise RuntimeError(f"capture exited {self.proc.returncode}: {out!r}")
        self.result = CaptureResult(read_capture(self.out), summary)
        return self.result

    def __enter__(self) -> Capture:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc_info: object) -> None:
        if self.proc is not None and self.result is None:
            if exc_info[0] is None:
                self.stop()
            elif self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=5)


if __name__ == "__main__":
    sys.exit(main())
