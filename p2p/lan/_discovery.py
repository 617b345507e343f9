"""LAN discovery's trio driver: beacons on an IPv4 multicast group.

One UDP socket bound to the group's port, a member of the group on each chosen
interface address (a namespace or host with no route to 224.0.0.0/4 still
works: membership and sending name the interface). At start it sends a query
on each interface (peers already there answer at once, so two peers meet in
one round trip); then an announce every ``interval_s`` (with jitter). Every
datagram is decoded by :func:`~._beacon.decode_beacon`: a bad one is counted
and dropped, never raised. Beacons of our own key (the loop back to us) are
ignored. TTL 1: beacons never leave the LAN.

Off unless asked for (``SwarmConfig.lan``): a multicast packet reaches every
host of the segment, which an operator decides.
"""

from __future__ import annotations

import logging
import random
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from ..keys import KeyPair
from ._beacon import (
    ANNOUNCE,
    MAX_BEACON_BYTES,
    QUERY,
    BeaconError,
    LanBook,
    decode_beacon,
    encode_beacon,
)

__all__ = ["DEFAULT_GROUP", "LanConfig", "LanDiscovery"]

log = logging.getLogger(__name__)

#: An organisation-local group (RFC 2365) and a port of the platform's range.
DEFAULT_GROUP = ("239.255.73.77", 49736)


@dataclass(frozen=True)
class LanConfig:
    """Where and how often beacons go."""

    group: tuple[str, int] = DEFAULT_GROUP
    #: IPv4 addresses of the interfaces to beacon on; None: every non-loopback one.
    interfaces: tuple[str, ...] | None = None
    interval_s: float = 5.0
    #: A peer not heard for this long is forgotten.
    ttl_s: float = 30.0
    #: A beacon's time may differ from ours by this much.
    max_skew_s: float = 60.0


class LanDiscovery:
    """Beacons ``keypair``'s ``addresses()`` on the group and fills ``book``.

    Args:
        keypair: whose beacons these are.
        addresses: the addresses to announce now (called before each beacon).
        config: group, interfaces, timings.
        interfaces: where the interface addresses come from (tests).
    """

    def __init__(self, keypair: KeyPair, addresses: Callable[[], Iterable[tuple[str, int]]],
                 config: LanConfig | None = None, *,
                 interfaces: Callable[[], Iterable[str]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.keypair = keypair
        self.config = config or LanConfig()
        self.book = LanBook(ttl_s=self.config.ttl_s)
        self._addresses = addresses
        self._interfaces = interfaces
        self._wall = clock
        self._socket: trio.socket.SocketType | None = None
        self._joined: list[str] = []
        #: Datagrams refused (not beacons, bad signature, old), and beacons sent.
        self.refused = 0
        self.sent = 0
        #: Set whenever a new peer is heard (replaced each time).
        self.heard = trio.Event()

    def _interface_hosts(self) -> list[str]:
        if self.config.interfaces is not None:
            return list(self.config.interfaces)
        if self._interfaces is not None:
            return [h for h in self._interfaces() if ":" not in h]
        from ..addresses import interface_addresses

        return [h for h in interface_addresses() if ":" not in h]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Beacon and listen until cancelled."""
        group, port = self.config.group
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):  # several peers of one host on one group
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            await sock.bind((group, port))
            for host in self._interface_hosts():
                try:
                    sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                                    struct.pack("4s4s", socket.inet_aton(group),
                                                socket.inet_aton(host)))
                    self._joined.append(host)
                except OSError as exc:
                    log.info("lan.join_failed interface=%s error=%s", host, exc)
            self._socket = sock
            log.info("lan.listening group=%s:%d interfaces=%s", group, port,
                     ",".join(self._joined) or "none")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receive)
                await self._send(QUERY)
                task_status.started()
                nursery.start_soon(self._beacons)

    async def _beacons(self) -> None:
        interval = self.config.interval_s
        while True:
            await trio.sleep(interval * random.uniform(0.8, 1.2))
            await self._send(ANNOUNCE)

    async def _send(self, kind: int) -> None:
        sock = self._socket
        addresses = list(self._addresses())[:8]
        if sock is None or not addresses:
            return
        data = encode_beacon(self.keypair, addresses, kind=kind,
                             time_ms=int(self._wall() * 1000))
        for host in self._joined:
            try:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                                socket.inet_aton(host))
                await sock.sendto(data, self.config.group)
                self.sent += 1
            except OSError as exc:
                log.debug("lan.send_failed interface=%s error=%s", host, exc)

    async def _receive(self) -> None:
        assert self._socket is not None
        while True:
            data, _ = await self._socket.recvfrom(MAX_BEACON_BYTES + 1)
            try:
                beacon = decode_beacon(data, now_ms=int(self._wall() * 1000),
                                       max_skew_ms=int(self.config.max_skew_s * 1000))
            except BeaconError as exc:
                self.refused += 1
                log.debug("lan.refused reason=%s", exc)
                continue
            if beacon.public_key == self.keypair.public_key:
                continue
            now = trio.current_time()
            known = bool(self.book.addresses(beacon.public_key, now))
            if not self.book.learn(beacon, now):
                continue
            if not known:
                log.info("lan.peer key=%s addresses=%s", beacon.public_key.hex()[:12],
                         ",".join(f"{h}:{p}" for h, p in beacon.addresses))
                self.heard.set()
                self.heard = trio.Event()
            if beacon.kind == QUERY and self.book.may_answer(now):
                await self._send(ANNOUNCE)
