"""Hole punching on relayed connections, keeping the session (the trio driver).

A connection that came through a blind relay is usable at once; this service
then tries, in the background, to move it to a direct TCP connection:

1. signal on channel ``holepunch/1`` (:mod:`._messages`): NAT types, the
   port each side punches from, the hosts each may be reached on; the
   initiator times the exchange and says ``sync`` (or ``skip``, when the NAT
   types leave TCP no chance: a random-mapping NAT cannot be predicted);
2. both sides connect to every host of the other from their punch port at
   about the same moment (:func:`._tcp.simultaneous_open`), LAN addresses and
   the public one raced;
3. the first TCP connection on which both ends prove the session
   (:mod:`._proof`) gets the session: the initiator's stream migrates to it
   (a MIGRATE frame on the relayed path, every later frame on the new one),
   the responder follows when it reads that frame, and the relayed path,
   which both have left, is closed. Channels and calls in flight never notice.

Outcomes are counted by NAT pair (``swarm_punch_total``) with the time to the
direct path; the connection's ``path`` becomes ``punched``, or its
``punch_outcome`` says why it stayed relayed.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram

from ..dht._nat import NatType
from ..errors import P2PError
from ..host import Service
from ..mux import Channel, ChannelRejected, MuxError
from ..noise import SecretStream
from ._proof import (
    HELLO_BYTES,
    NONCE_BYTES,
    PROOF_BYTES,
    PathProofError,
    check_proof,
    make_hello,
    make_proof,
    parse_hello,
    path_id,
)
from ._tcp import PunchSocket, simultaneous_open
from ._udp import birthday_sockets, spray, udp_socket, udp_token

if TYPE_CHECKING:
    from ..connection import Connection
    from ._messages import Connect
    from ._quic import QuicPath

__all__ = ["PROTOCOL", "HolePunchService", "PunchConfig", "PunchMetrics", "prove_path"]

log = logging.getLogger(__name__)

PROTOCOL = "holepunch/1"
Address = tuple[str, int]


@dataclass(frozen=True)
class PunchConfig:
    """Timing of a punch."""

    start_delay_s: float = 0.1
    """A relayed connection's first exchanges go first: the punch's sockets and
    messages would otherwise compete with them (measured: +0.6 ms to a relayed
    connect-by-key of ~14 ms)."""

    signal_timeout_s: float = 10.0
    """The signalling exchange on the relayed connection, each message."""

    punch_s: float = 2.0
    """How long one round of simultaneous opens lasts. A punch that works does so
    within about a second (a SYN retransmitted once); one that did not gets a new
    round from fresh ports sooner this way (measured in bench/punch.py)."""

    proof_timeout_s: float = 3.0
    """A connected path's proof exchange."""

    switch_timeout_s: float = 10.0
    """After the initiator moved: how long it waits for the responder to follow."""

    tcp_attempts: int = 3
    """Rounds of a TCP punch, each from fresh ports (libp2p's measurement: a punch
    that works does so at once, so a few rounds are enough)."""

    udp_punch_s: float = 15.0
    """How long a UDP punch (consistent ↔ random NAT) sprays and waits."""

    udp_sockets: int = 256
    """Sockets the random side opens for the consistent side's probes to find."""

    udp_spray_interval_s: float = 0.005
    """Between two probes of the consistent side: with 256 sockets to find, half
    the punches land within 0.9 s and 99.9 % within 7 s."""


class PunchMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, prefix: str = "swarm") -> None:
        self.outcomes = Counter(
            f"{prefix}_punch", "Hole punches on relayed connections, by NAT pair "
            "(ours/theirs) and outcome", ["pair", "outcome"], registry=registry)
        self.fallbacks = Counter(
            f"{prefix}_punch_fallbacks", "Punched paths that died: their sessions went "
            "back to the relay without losing a byte", registry=registry)
        self.time_to_direct = Histogram(
            f"{prefix}_punch_time_to_direct_seconds",
            "From the relayed connection's start to the session on the punched path",
            ["path"], buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30), registry=registry)


class _Failed(Exception):
    """This punch is over without a direct path; the message is the outcome."""


#: What a punch between two NAT types does: a TCP simultaneous open; a UDP
#: punch where we ``spray`` the random side's ports or open ``birthday``
#: sockets for the consistent side to find; else the reason nothing can work.
_PLANS = ("tcp", "spray", "birthday")
_UDP_PLANS = ("spray", "birthday")
#: The connection's path once a plan worked.
_PATHS = {"tcp": "punched_tcp", "spray": "punched_udp", "birthday": "punched_udp"}


def _plan(ours: NatType, theirs: NatType) -> str:
    if ours == NatType.RANDOM and theirs == NatType.RANDOM:
        return "double_random_nat"  # two random ports: nothing to aim at either way
    if NatType.RANDOM in (ours, theirs) and NatType.OPEN not in (ours, theirs):
        # A random-mapping NAT gives the punch socket a new public port per
        # destination: TCP cannot aim at it; UDP can, by the birthday method.
        # (An open peer needs no aim: its punch port accepts the connect.)
        return "birthday" if ours == NatType.RANDOM else "spray"
    return "tcp"


async def _receive_exactly(stream: trio.abc.Stream, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:  # bounded: each read adds at least one byte or raises
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise PathProofError("the path closed during the proof")
        data += chunk
    return bytes(data)


async def prove_path(raw: trio.abc.Stream, session: SecretStream, *,
                     timeout_s: float) -> bytes:
    """Prove that ``raw`` reaches the other end of ``session``; return the path's id.

    Raises:
        PathProofError: a stranger, a replay, another session, a timeout, a close.
    """
    secret = session.path_secret
    role, peer_role = (b"I", b"R") if session.is_initiator else (b"R", b"I")
    nonce = secrets.token_bytes(NONCE_BYTES)
    try:
        with trio.fail_after(timeout_s):
            await raw.send_all(make_hello(secret, role, nonce))
            peer_nonce = parse_hello(await _receive_exactly(raw, HELLO_BYTES), secret,
                                     peer_role=peer_role)
            await raw.send_all(make_proof(secret, role, nonce, peer_nonce))
            check_proof(await _receive_exactly(raw, PROOF_BYTES), secret, peer_role=peer_role,
                        peer_nonce=peer_nonce, own_nonce=nonce)
    except trio.TooSlowError:
        raise PathProofError(f"no proof within {timeout_s} s") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        raise PathProofError(f"the path broke during the proof: {exc}") from exc
    return path_id(nonce, peer_nonce) if session.is_initiator else path_id(peer_nonce, nonce)


class HolePunchService(Service):
    """Moves relayed connections to punched direct ones (see the module doc).

    Args:
        local_hosts: the IPv4 hosts we may be reached on, for one connection
            (public address as the DHT saw it, interfaces').
        nat_type: our NAT's type as the DHT sees it.
    """

    protocol = PROTOCOL

    def __init__(self, *, local_hosts: Callable[[Connection], list[str]],
                 nat_type: Callable[[], NatType], config: PunchConfig | None = None,
                 metrics: PunchMetrics | None = None) -> None:
        self.config = config or PunchConfig()
        self.metrics = metrics or PunchMetrics()
        self._local_hosts = local_hosts
        self._nat_type = nat_type

    # -- the initiator's side ---------------------------------------------------

    async def on_connection(self, connection: Connection) -> None:
        if not connection.relayed or not connection.is_initiator:
            return
        # The messages (pydantic models) are imported by the first punch: a peer
        # never relayed (``cosmicac shell`` at an address) never loads pydantic.
        from ._messages import Connect, Skip, Sync, decode, encode

        await trio.sleep(self.config.start_delay_s)
        ours, theirs = self._nat_type(), NatType.UNKNOWN
        try:
            channel = await connection.open_channel(PROTOCOL, secrets.token_bytes(8))
        except ChannelRejected:
            self._settle(connection, ours, theirs, "unsupported")
            return
        except (MuxError, trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the connection ended
        holder, udp = PunchSocket(), udp_socket()
        try:
            async with channel, trio.open_nursery() as paths:
                for attempt in range(self.config.tcp_attempts):  # bounded
                    if attempt:
                        # A fresh port: the last one's mappings may clash for a while
                        # on a NAT that answered our SYNs.
                        holder.close()
                        holder = PunchSocket()
                        log.info("punch.retry peer=%s attempt=%d", connection.peer_label,
                                 attempt + 1)
                    port = await holder.bind()
                    assert udp is not None
                    mine = Connect(nat=ours, port=port, hosts=self._hosts(connection),
                                   udp_port=udp.getsockname()[1])
                    started = trio.current_time()
                    with trio.fail_after(self.config.signal_timeout_s):
                        await channel.send(encode(mine))
                        peer = decode(await channel.receive())
                    rtt = trio.current_time() - started
                    if not isinstance(peer, Connect):
                        raise _Failed("protocol_error")
                    theirs = peer.nat
                    plan = _plan(ours, theirs)
                    if plan not in _PLANS:
                        await channel.send(encode(Skip(reason=plan)))
                        raise _Failed(plan)
                    await channel.send(encode(Sync()))
                    await trio.sleep(rtt / 2)
                    if plan == "tcp":
                        won = await self._race(connection, holder, peer, initiator=True)
                        if won is None:
                            continue  # another round, if any is left
                    else:
                        won = await self._udp(connection, plan, udp, peer, paths)
                        udp = None  # the QUIC path (or its failure) owns it now
                    break
                if won is None:
                    raise _Failed("no_path")
                pid, raw, address = won
                stream = connection.stream
                stream.offer_path(pid, raw)
                stream.keep_standby()  # the relayed path, for when this one dies
                await stream.migrate(pid)
                with trio.move_on_after(self.config.switch_timeout_s):
                    while stream.read_path_id != pid:
                        await stream.wait_path_change()
                if stream.read_path_id != pid:
                    raise _Failed("peer_did_not_follow")
                self._moved(connection, ours, theirs, address, _PATHS[plan])
                await self._watch_fallback(connection)
        except* _ENDS_A_PUNCH as group:
            self._settle(connection, ours, theirs, _outcome_of(connection, group))
        finally:
            holder.close()
            if udp is not None:
                udp.close()

    # -- the responder's side ---------------------------------------------------

    async def serve_channel(self, channel: Channel, connection: Connection) -> None:
        if not connection.relayed or connection.is_initiator:
            return  # only the initiator of a relayed session starts a punch
        from ._messages import Connect, Skip, Sync, decode, encode  # (see on_connection)

        ours, theirs = self._nat_type(), NatType.UNKNOWN
        holder, udp = PunchSocket(), udp_socket()
        try:
            async with trio.open_nursery() as paths:
                stream = connection.stream
                before = stream.read_path_id
                with trio.fail_after(self.config.signal_timeout_s):
                    peer = decode(await channel.receive())
                for attempt in range(self.config.tcp_attempts):  # bounded
                    if not isinstance(peer, Connect):
                        raise _Failed("protocol_error")
                    if attempt:
                        holder.close()
                        holder = PunchSocket()
                        await stream.discard_offered()
                    port = await holder.bind()
                    theirs = peer.nat
                    assert udp is not None
                    with trio.fail_after(self.config.signal_timeout_s):
                        await channel.send(encode(Connect(nat=ours, port=port,
                                                          hosts=self._hosts(connection),
                                                          udp_port=udp.getsockname()[1])))
                        verdict = decode(await channel.receive())
                    if isinstance(verdict, Skip):
                        raise _Failed(verdict.reason if verdict.reason in _KNOWN_SKIPS
                                      else "skipped")
                    if not isinstance(verdict, Sync):
                        raise _Failed("protocol_error")
                    plan = _plan(ours, theirs)
                    if plan in _UDP_PLANS:
                        won = await self._udp(connection, plan, udp, peer, paths)
                        udp = None
                        if won is None:
                            raise _Failed("no_path")
                        stream.offer_path(won[0], won[1], address=won[2])
                    retry: list[object] = []
                    async with trio.open_nursery() as racing:
                        # Keep proving paths until the initiator's MIGRATE names one
                        # (any of ours may be the one it chose), or it starts another
                        # round (a new connect), or the time is up.
                        if plan == "tcp":
                            racing.start_soon(self._race, connection, holder, peer, False)

                            racing.start_soon(_next_round, channel, retry, racing.cancel_scope)
                        with trio.move_on_after(self.config.punch_s
                                                + self.config.proof_timeout_s
                                                + self.config.switch_timeout_s):
                            while stream.read_path_id == before:
                                await stream.wait_path_change()
                        racing.cancel_scope.cancel()
                    if stream.read_path_id != before or not retry:
                        break
                    peer = retry[0]
                if stream.read_path_id == before:
                    raise _Failed("no_path")
                # (its reads moved already; its writes are still on the relayed path)
                stream.keep_standby()
                await stream.migrate(stream.read_path_id)
                await stream.discard_offered()
                self._moved(connection, ours, theirs, stream.read_path_address, _PATHS[plan])
                await self._watch_fallback(connection)
        except* _ENDS_A_PUNCH as group:
            self._settle(connection, ours, theirs, _outcome_of(connection, group))
        finally:
            holder.close()
            if udp is not None:
                udp.close()

    # -- UDP: the birthday method, then QUIC --------------------------------------

    async def _udp(self, connection: Connection, plan: str, udp: socket.socket,
                   peer: Connect, paths: trio.Nursery
                   ) -> tuple[bytes, QuicPath, Address] | None:
        """Punch UDP between a consistent NAT (``spray``) and a random one
        (``birthday``), run QUIC on the 5-tuple in ``paths``, prove the session
        on its stream. Takes ``udp`` (closed unless a QUIC path owns it)."""
        # aioquic (and the X.509 stack under it) is imported by the few processes
        # that punch over UDP, not by every process that imports the swarm: ~0.1 s.
        from ._quic import QuicPath

        stream = connection.stream
        deadline = trio.current_time() + self.config.udp_punch_s
        token = udp_token(stream.path_secret)
        public = next((h for h in peer.hosts if ":" not in h), None)
        path: QuicPath | None = None
        try:
            if public is None:
                return None
            if plan == "spray":
                address = await spray(udp, public, token=token, deadline=deadline,
                                      interval_s=self.config.udp_spray_interval_s)
                if address is None:
                    return None
                path, udp = QuicPath(udp, address, is_client=False), None
            else:
                if not peer.udp_port:
                    return None
                won = await birthday_sockets((public, peer.udp_port), token=token,
                                             deadline=deadline, sockets=self.config.udp_sockets)
                if won is None:
                    return None
                sock, address = won
                path = QuicPath(sock, address, is_client=True)
            try:
                await paths.start(path.run)
                pid = await prove_path(path, stream, timeout_s=self.config.proof_timeout_s)
            except (OSError, PathProofError) as exc:
                log.info("punch.udp_path_failed peer=%s to=%s:%d reason=%s",
                         connection.peer_label, *address, exc)
                await path.aclose()
                return None
            except BaseException:
                with trio.CancelScope(shield=True):
                    await path.aclose()
                raise
            return pid, path, address
        finally:
            if udp is not None:
                udp.close()

    # -- both ---------------------------------------------------------------------

    async def _race(self, connection: Connection, holder: PunchSocket, peer: Connect,
                    initiator: bool) -> tuple[bytes, trio.SocketStream, Address] | None:
        """Simultaneous opens to each of the peer's hosts, and what our punch
        port accepts; each connected path is proven. The initiator takes the
        first proven one (the rest are closed); the responder offers every
        proven path to the session, since it cannot know which one the
        initiator took."""
        deadline = trio.current_time() + self.config.punch_s
        won: list[tuple[bytes, trio.SocketStream, Address]] = []
        stream = connection.stream
        port = holder.port

        async def attempt(address: Address, done: trio.CancelScope) -> None:
            try:
                raw = await simultaneous_open(port, address, deadline=deadline)
            except OSError as exc:
                log.debug("punch.open_failed peer=%s to=%s:%d reason=%s",
                          connection.peer_label, *address, exc)
                return
            await prove(raw, address, done)

        async def accept(done: trio.CancelScope) -> None:
            # Bounded: a stranger may connect to the open port; each must prove
            # the session within the proof timeout, and only a few may try.
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as proving:
                    for _ in range(_MAX_ACCEPTED):
                        raw, address = await holder.accept()
                        proving.start_soon(prove, raw, address, done)

        async def prove(raw: trio.SocketStream, address: Address,
                        done: trio.CancelScope) -> None:
            try:
                pid = await prove_path(raw, stream, timeout_s=self.config.proof_timeout_s)
            except PathProofError as exc:
                log.info("punch.proof_failed peer=%s to=%s:%d reason=%s",
                         connection.peer_label, *address, exc)
                await trio.aclose_forcefully(raw)
                return
            except BaseException:  # the round ended (another path won): not leaked
                await trio.aclose_forcefully(raw)
                raise
            if initiator:
                if won:
                    await trio.aclose_forcefully(raw)
                    return
                won.append((pid, raw, address))
                done.cancel()
            else:
                try:
                    stream.offer_path(pid, raw, address=address)
                except (ValueError, trio.ClosedResourceError, trio.BrokenResourceError):
                    await trio.aclose_forcefully(raw)

        from ._messages import MAX_HOSTS

        hosts = list(dict.fromkeys(peer.hosts))[:MAX_HOSTS]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept, nursery.cancel_scope)
            for host in hosts:
                if ":" in host:
                    continue  # IPv4 punch sockets
                nursery.start_soon(attempt, (host, peer.port), nursery.cancel_scope)
        return won[0] if won else None

    async def _watch_fallback(self, connection: Connection) -> None:
        """While the session runs on the punched path (a QUIC path's driver runs
        in this task's nursery meanwhile): when that path dies and the stream
        falls back to the relayed one, say so."""
        await connection.stream.fell_back.wait()
        self.metrics.fallbacks.inc()
        connection.back_on_relay()
        connection.punch_settled("fell_back")
        log.info("punch.fell_back peer=%s: the direct path died; the session goes on "
                 "through the relay", connection.peer_label)
        await trio.sleep_forever()  # (cancelled when the connection ends)

    def _hosts(self, connection: Connection) -> list[str]:
        from ._messages import MAX_HOSTS

        hosts = [h for h in self._local_hosts(connection) if ":" not in h]
        return list(dict.fromkeys(hosts))[:MAX_HOSTS]

    def _moved(self, connection: Connection, ours: NatType, theirs: NatType,
               address: Address | None, path: str) -> None:
        took = trio.current_time() - connection.opened_at
        self.metrics.outcomes.labels(f"{ours}/{theirs}", "direct").inc()
        self.metrics.time_to_direct.labels(path).observe(took)
        connection.moved(address, path)
        connection.punch_settled("direct")
        log.info("punch.direct peer=%s nat=%s/%s path=%s to=%s after=%.2fs",
                 connection.peer_label, ours, theirs, path,
                 f"{address[0]}:{address[1]}" if address else "-", took)

    def _settle(self, connection: Connection, ours: NatType, theirs: NatType,
                outcome: str) -> None:
        self.metrics.outcomes.labels(f"{ours}/{theirs}", outcome).inc()
        connection.punch_settled(outcome)
        log.info("punch.stays_relayed peer=%s nat=%s/%s outcome=%s", connection.peer_label,
                 ours, theirs, outcome)


async def _next_round(channel: Channel, into: list[object], done: trio.CancelScope) -> None:
    """The initiator's next message (a new round's connect), into ``into``; then
    end the round (an initiator that gave up closes the channel: nothing)."""
    from ._messages import decode

    try:
        into.append(decode(await channel.receive()))
    except trio.EndOfChannel:
        pass
    done.cancel()


#: What ends a punch (never the connection): our verdicts, a peer's bad or slow
#: messages, sockets and channels that fail.
_ENDS_A_PUNCH = (_Failed, trio.TooSlowError, P2PError, MuxError, trio.BrokenResourceError,
                 trio.ClosedResourceError, OSError)


def _outcome_of(connection: Connection, group: BaseExceptionGroup) -> str:
    """The outcome a punch that ended with ``group`` is counted under."""
    from ._messages import PunchMessageError

    first = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    if isinstance(first, _Failed):
        return str(first)
    if isinstance(first, trio.TooSlowError):
        return "signal_timeout"
    if isinstance(first, PunchMessageError):
        log.info("punch.bad_message peer=%s reason=%s", connection.peer_label, first)
        return "protocol_error"
    log.info("punch.failed peer=%s reason=%r", connection.peer_label, first)
    return "error"


#: Connections a punch port accepts (and asks to prove the session) at most.
_MAX_ACCEPTED = 16
_KNOWN_SKIPS = frozenset({"double_random_nat"})
