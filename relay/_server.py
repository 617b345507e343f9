"""The relay server's trio driver: one TCP port for control and attach connections.

Theory of operation
-------------------
Every accepted connection is classified by its first bytes
(:func:`p2p.relay.classify`): the attach magic makes it an *attach*, anything
else is a *control* connection, a secret stream whose first bytes are handed
back to the Noise responder through :class:`_Prefixed`. A connection that
says nothing within ``first_bytes_timeout_s`` is closed, and one that has said
nothing yet is closed at once when a newcomer finds all ``max_connections``
taken (a peer's bytes come with its connect: silent sockets never keep it
out). Control connections of the allow-list's keys keep the host's reserved
slots (:meth:`~p2p.host.PeerHost.add_reserved`).

Control connections are handed to the stack's one accept path, a
:class:`~p2p.host.PeerHost` serving ``blind-relay/1`` as an
:class:`~p2p.host.RpcService`: one router for every connection, whose handlers
read the caller's Noise-authenticated key from their call context.
``reserve`` streams the reservation's incoming items (the handler parks on a
per-reservation lot until the core queues one); ``pair`` asks the core for a
pairing, wakes the target's stream and answers with the initiator token.

Attach connections: the core checks the token and role. The first side of a
pairing parks (its task keeps the socket: trio's ``serve_listeners`` closes a
handler's stream when the handler returns); the second side's task answers
``PAIRED`` to both and splices them, then wakes the first, and both close.
One timer task expires pairings at the core's next deadline and answers a
side still waiting ``PAIR_TIMEOUT``.

All state changes happen in :class:`~._pairing.RelayState` (sans-IO); this
module owns sockets, tasks, the clock and the logs.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable

import trio

from p2p.host import HostConfig, PeerHost, RpcService
from p2p.keys import KeyPair, format_key
from p2p.relay import (
    ATTACH_REQUEST_BYTES,
    PAIR,
    PROTOCOL,
    RESERVE,
    AttachStatus,
    FirstBytes,
    PairParams,
    PairReply,
    RefusalCode,
    RelayProtocolError,
    RelayRefused,
    ReservationItem,
    ReserveParams,
    Role,
    classify,
    decode_attach_request,
    status_for,
)
from p2p.rpc import CallContext, Router, RpcError

from ._config import RelayConfig
from ._pairing import Pairing, RelayState, RelayStatistics, Reservation
from ._splice import splice

__all__ = ["RelayServer"]

log = logging.getLogger(__name__)

Observer = Callable[[int, bytes], None]


class _Prefixed(trio.abc.HalfCloseableStream):
    """A stream that first returns bytes already read from it (by the classifier)."""

    def __init__(self, inner: trio.SocketStream, prefix: bytes) -> None:
        self.inner = inner
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            size = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:size], self._prefix[size:]
            return data
        return await self.inner.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Waiting:
    """The first attached side of a pairing, parked until the other comes."""

    __slots__ = ("done", "expired", "role", "stream")

    def __init__(self, stream: trio.SocketStream, role: Role) -> None:
        self.stream = stream
        self.role = role
        self.expired = False
        #: Set when the splice using this stream ended, or the pairing expired.
        self.done = trio.Event()


class RelayServer:
    """A blind relay: reservations, pairings and blind forwarding on one TCP port.

    Args:
        keypair: the relay's identity (control connections authenticate it).
        config: limits and timeouts.
        observer: optional ``(direction, chunk)`` hook called with every
            forwarded chunk; tests use it to check the relay only sees ciphertext.
        token_source: randomness for tokens (a CSPRNG unless a test seeds it).

    Serve with ``await nursery.start(server.serve_tcp, host, port)`` or
    ``server.serve(listeners)``; counters are in :meth:`statistics` (and
    ``stats``).
    """

    def __init__(
        self,
        keypair: KeyPair,
        config: RelayConfig | None = None,
        *,
        observer: Observer | None = None,
        token_source: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.keypair = keypair
        self.config = config or RelayConfig()
        self.state = RelayState(self.config, token_source=token_source)
        self.observer = observer
        self._connections = 0
        #: Sockets that have sent nothing yet, oldest first: each one's cancel
        #: scope, so a newcomer finding every connection taken evicts one.
        self._silent: dict[object, trio.CancelScope] = {}
        #: Reservation -> the lot its stream handler parks on (one per live
        #: reservation, so bounded by max_reservations plus replaced ones ending).
        self._lots: dict[Reservation, trio.lowlevel.ParkingLot] = {}
        #: Half-attached pairing -> its waiting side (bounded by max_pending_pairs).
        self._waiting: dict[Pairing, _Waiting] = {}
        self._timer_lot = trio.lowlevel.ParkingLot()
        self._chunk_bytes = self.config.chunk_bytes(0)
        router = Router()
        router.add(RESERVE, self._reserve)
        router.add(PAIR, self._pair, inline=True)  # state and wake-ups only: no waiting
        # Attach connections count against max_connections in handle_stream;
        # control connections are also bounded there, so the host's own cap
        # only has to be as large.
        self.host = PeerHost(
            keypair, config=HostConfig(connection=self.config.connection,
                                       max_connections=self.config.max_connections,
                                       one_per_peer=False),
            metrics_prefix="relay_control")
        self.host.add_service(RpcService(PROTOCOL, router))
        if self.config.allow is not None:  # the peers it serves keep room under a flood
            self.host.add_reserved(self.config.allow)

    # -- counters ----------------------------------------------------------------

    def statistics(self) -> RelayStatistics:
        """A snapshot of the counters (what the metrics endpoint serves)."""
        return self.state.statistics(connections=self._connections)

    @property
    def stats(self) -> RelayStatistics:
        return self.statistics()

    # -- serving -------------------------------------------------------------------

    async def serve_tcp(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` and serve until cancelled; report the bound address.

        Raises:
            OSError: the address cannot be bound.
        """
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()
        await self.serve(listeners, task_status=task_status, address=(bound[0], bound[1]))

    async def serve(
        self,
        listeners: list[trio.abc.Listener[trio.SocketStream]],
        *,
        address: tuple[str, int] | None = None,
        task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve already-bound ``listeners`` until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.run)
            await nursery.start(trio.serve_listeners, self.handle_stream, listeners)
            log.info("relay.serving key=%s address=%s", self.keypair.hex, address)
            task_status.started(address)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the pairing timer until cancelled.

        :meth:`serve` runs it; run it yourself when you feed :meth:`handle_stream`
        streams from elsewhere (in-memory streams in tests).
        """
        async with trio.open_nursery() as nursery:
            await nursery.start(self.host.run)
            task_status.started()
            await self._expiry_loop()

    async def handle_stream(self, stream: trio.SocketStream,
                            address: tuple[str, int] | None = None) -> None:
        """Serve one accepted connection (control or attach); closes it when done."""
        if self._connections >= self.config.max_connections and not self._evict_silent():
            self.state.count_refusal(RefusalCode.TOO_MANY_CONNECTIONS)
            log.debug("relay.refused reason=%s", RefusalCode.TOO_MANY_CONNECTIONS.value)
            await trio.aclose_forcefully(stream)
            return
        self._connections += 1
        ticket = object()
        try:
            prefix = b""
            kind = FirstBytes.UNDECIDED
            with trio.CancelScope(deadline=trio.current_time()
                                  + self.config.first_bytes_timeout_s) as scope:
                self._silent[ticket] = scope
                while kind is FirstBytes.UNDECIDED or (
                    kind is FirstBytes.ATTACH and len(prefix) < ATTACH_REQUEST_BYTES
                ):
                    # Never read past an attach request: what follows belongs
                    # to the other side of the pair.
                    chunk = await stream.receive_some(ATTACH_REQUEST_BYTES - len(prefix))
                    if not chunk:
                        return
                    self._silent.pop(ticket, None)  # it spoke: a peer, never evicted as silent
                    prefix += chunk
                    kind = classify(prefix)
            if kind is FirstBytes.CONTROL:
                if address is None:
                    address = _peer_address(stream)
                await self.host.accept(_Prefixed(stream, prefix), address)
            elif kind is FirstBytes.ATTACH and len(prefix) == ATTACH_REQUEST_BYTES:
                await self._serve_attach(stream, prefix)
            else:
                log.debug("relay.first_bytes_timeout read=%d", len(prefix))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.debug("relay.connection_lost reason=%r", exc)
        except Exception:
            # A bug in serving one connection must not take the relay down.
            log.exception("relay.connection_failed")
        finally:
            self._silent.pop(ticket, None)
            self._connections -= 1
            await trio.aclose_forcefully(stream)

    def _evict_silent(self) -> bool:
        """Every connection is taken: close the oldest socket that has sent
        nothing, so a flood of silent sockets never keeps a peer out (its
        bytes come with its connect). False: none is silent."""
        oldest = next(iter(self._silent), None)
        if oldest is None:
            return False
        self._silent.pop(oldest).cancel()
        self.state.count_refusal(RefusalCode.TOO_MANY_CONNECTIONS)
        log.debug("relay.evicted reason=silent")
        return True

    # -- control connections ---------------------------------------------------------

    async def _reserve(self, params: ReserveParams, ctx: CallContext):
        """The ``reserve`` stream: an acceptance, then one item per dialer."""
        key = ctx.remote_public_key
        assert key is not None  # served only over secret streams
        peer = format_key(key)[:12]
        try:
            reservation, replaced = self.state.reserve(key)
        except RelayRefused as exc:
            log.info("relay.reserve_refused peer=%s code=%s", peer, exc.code)
            raise RpcError(exc.code, exc.message) from None
        if replaced is not None:
            lot = self._lots.get(replaced)
            if lot is not None:
                lot.unpark_all()
        lot = trio.lowlevel.ParkingLot()
        self._lots[reservation] = lot
        log.info("relay.reserved peer=%s replaced=%s", peer, replaced is not None)
        try:
            yield ReservationItem()
            while True:
                while not reservation.incoming and not reservation.replaced:
                    await lot.park()
                if reservation.replaced:
                    log.info("relay.reservation_replaced peer=%s", peer)
                    raise RpcError(RefusalCode.REPLACED,
                                   "a newer reservation by the same key replaced this one")
                token, initiator = reservation.incoming.popleft()
                yield ReservationItem(token=token, initiator=initiator)
        finally:
            self.state.end_reservation(reservation)
            del self._lots[reservation]
            if not reservation.replaced:
                log.info("relay.reservation_ended peer=%s", peer)

    def _pair(self, params: PairParams, ctx: CallContext) -> PairReply:
        key = ctx.remote_public_key
        assert key is not None  # served only over secret streams
        peer = format_key(key)[:12]
        try:
            pairing, reservation = self.state.request_pair(key, params.target,
                                                           trio.current_time())
        except RelayRefused as exc:
            log.info("relay.pair_refused peer=%s target=%s code=%s", peer,
                     format_key(params.target)[:12], exc.code)
            raise RpcError(exc.code, exc.message) from None
        self._lots[reservation].unpark_all()
        self._timer_lot.unpark_all()
        log.debug("relay.pair_issued pairing=%d initiator=%s target=%s", pairing.number, peer,
                  format_key(params.target)[:12])
        return PairReply(token=pairing.tokens[Role.INITIATOR],
                         timeout_s=self.config.pair_timeout_s)

    # -- attach connections ------------------------------------------------------------

    async def _serve_attach(self, stream: trio.SocketStream, request_bytes: bytes) -> None:
        try:
            request = decode_attach_request(request_bytes)
            pairing = self.state.attach(request.token, request.role, trio.current_time())
        except RelayProtocolError:
            self.state.count_refusal(RefusalCode.BAD_ATTACH)
            await self._answer(stream, AttachStatus.BAD_ATTACH)
            return
        except RelayRefused as exc:
            log.debug("relay.attach_refused code=%s", exc.code)
            await self._answer(stream, status_for(RefusalCode(exc.code)))
            return
        if len(pairing.attached) == 1:
            waiting = _Waiting(stream, request.role)
            self._waiting[pairing] = waiting
            await waiting.done.wait()
            if waiting.expired:
                log.info("relay.pair_timeout pairing=%d", pairing.number)
                await self._answer(stream, AttachStatus.PAIR_TIMEOUT)
            return
        waiting = self._waiting.pop(pairing)
        if request.role is Role.INITIATOR:
            initiator, responder = stream, waiting.stream
        else:
            initiator, responder = waiting.stream, stream
        self._chunk_bytes = self.config.chunk_bytes(self.state.active_pairs)
        log.info("relay.paired pairing=%d initiator=%s target=%s active=%d", pairing.number,
                 format_key(pairing.initiator)[:12], format_key(pairing.target)[:12],
                 self.state.active_pairs)
        moved = 0

        def count(size: int) -> None:
            nonlocal moved
            moved += size
            self.state.bytes_relayed += size

        try:
            paired = bytes([AttachStatus.PAIRED])
            await initiator.send_all(paired)
            await responder.send_all(paired)
            end = await splice(
                initiator, responder,
                idle_timeout_s=self.config.idle_timeout_s,
                max_read=self._max_read,
                on_bytes=count,
                observer=self.observer,
            )
            log.info("relay.pair_ended pairing=%d end=%s bytes=%d", pairing.number, end.value,
                     moved)
        finally:
            self.state.finish(pairing)
            self._chunk_bytes = self.config.chunk_bytes(self.state.active_pairs)
            waiting.done.set()

    def _max_read(self) -> int:
        return self._chunk_bytes

    async def _answer(self, stream: trio.SocketStream, status: AttachStatus) -> None:
        try:
            with trio.move_on_after(self.config.first_bytes_timeout_s):
                await stream.send_all(bytes([status]))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _expiry_loop(self) -> None:
        while True:
            deadline = self.state.next_deadline()
            if deadline is None:
                await self._timer_lot.park()
                continue
            if trio.current_time() < deadline:
                with trio.move_on_at(deadline):
                    await self._timer_lot.park()
                continue
            for pairing in self.state.expire(trio.current_time()):
                waiting = self._waiting.pop(pairing, None)
                if waiting is not None:
                    waiting.expired = True
                    waiting.done.set()
                else:
                    log.info("relay.pair_timeout pairing=%d attached=none", pairing.number)


def _peer_address(stream: trio.abc.Stream) -> tuple[str, int] | None:
    socket = getattr(stream, "socket", None)
    try:
        return tuple(socket.getpeername()[:2]) if socket is not None else None
    except OSError:
        return None
