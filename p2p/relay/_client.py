"""The client side of the blind relay: reservations, pairings, attaching, relayed connections.

Theory of operation
-------------------
A firewalled peer keeps a reservation (:func:`keep_reservation`): one
``reserve`` stream over its secret-stream connection to the relay, which
stays open as long as the reservation lives. Each item on it is a dialer
that wants this peer, with the one-time token to attach with.

A dialer that cannot reach the peer directly asks the relay to pair them
(:func:`request_pair`), then both attach (:func:`attach`): a plain TCP
connection to the relay that sends magic, role and token and waits for the
relay's status byte. From then on the relay forwards bytes blindly, and the two
peers run the ordinary Noise XX handshake through it
(:func:`dial_via_relay`, :func:`accept_via_relay`): the dialer pins the
target's key, the target checks the dialer's key against the one the relay
announced. The relay holds neither side's static key, so it can neither read
the traffic nor complete a handshake as either side; the worst it can do is
drop or cut the connection.

Each control call opens its own mux channel (``blind-relay/1`` with a random
id), so calls on one connection never share RPC state and a reservation's
stream is not held up by pair calls.
"""

from __future__ import annotations

import inspect
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import trio

from ..connection import Connection, ConnectionConfig
from ..errors import KeyFormatError
from ..keys import KEY_BYTES, KeyPair, format_key
from ..mux import ChannelRejected
from ..net import Network, SocketNetwork
from ..noise import SecretStream
from ..rpc import RpcChannelClosed, RpcClient, RpcError, RpcTimeout
from ._attach import AttachStatus, Role, encode_attach_request
from ._errors import (
    RelayError,
    RelayKeyMismatch,
    RelayProtocolError,
    RelayRefused,
    RelayTimeout,
    RelayUnavailable,
)
from ._messages import PAIR, PROTOCOL, RESERVE, PairParams, PairReply, ReserveParams

__all__ = [
    "DEFAULT_ATTACH_TIMEOUT_S",
    "Incoming",
    "PairTicket",
    "accept_via_relay",
    "attach",
    "attach_stream",
    "dial_via_relay",
    "keep_reservation",
    "request_pair",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A responder's attach waits this long for its dialer. Above the relay's
#: default pairing timeout (15 s), so the relay's PAIR_TIMEOUT answer comes first.
DEFAULT_ATTACH_TIMEOUT_S = 20.0
#: How long a ``pair`` call may take.
DEFAULT_PAIR_CALL_TIMEOUT_S = 10.0
#: The dialer's attach waits the ticket's timeout plus this (the relay answers
#: PAIR_TIMEOUT at the ticket's timeout; this covers the trip).
ATTACH_MARGIN_S = 2.0


@dataclass(frozen=True, slots=True)
class Incoming:
    """A dialer wants to reach us through the relay.

    Attach with ``token`` as responder; the dialer must prove ``initiator``.
    """

    token: bytes
    initiator: bytes


@dataclass(frozen=True, slots=True)
class PairTicket:
    """The relay's answer to ``pair``: attach with ``token`` within ``timeout_s``."""

    token: bytes
    timeout_s: float


IncomingHandler = Callable[[Incoming], Awaitable[object] | object]


def _translate(exc: RpcError, what: str) -> RelayError:
    """Map an RPC failure of a relay call to our own error (once, here)."""
    if isinstance(exc, RpcChannelClosed):
        return RelayUnavailable(f"the connection to the relay ended during {what}",
                                code="RELAY_CLOSED")
    if isinstance(exc, RpcTimeout):
        return RelayTimeout(f"the relay did not answer {what} in time", code="TIMEOUT")
    return RelayRefused(exc.message, code=exc.code)


async def _with_control_client(
    connection: Connection, work: Callable[[RpcClient], Awaitable[T]]
) -> T:
    """Run ``work(client)`` with an RPC client on a fresh ``blind-relay/1`` channel.

    The client's reader runs in a nursery of its own; ``work``'s outcome is
    captured inside it and delivered outside, so its errors reach the caller
    as themselves, not wrapped in an exception group.
    """
    try:
        channel = await connection.open_channel(PROTOCOL, secrets.token_bytes(8))
    except ChannelRejected as exc:
        raise RelayRefused(f"the peer does not serve {PROTOCOL}: {exc}", code=exc.code) from exc
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise RelayUnavailable(f"the connection to the relay ended: {exc}",
                               code="RELAY_CLOSED") from exc
    client = RpcClient(channel, name=f"relay-{format_key(connection.remote_public_key)[:8]}")
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        try:
            result = await work(client)
        except BaseException as exc:  # re-raised below, outside the nursery
            failure = exc
        finally:
            with trio.CancelScope(shield=True):
                await client.aclose()
            nursery.cancel_scope.cancel()
    if failure is not None:
        try:
            raise failure
        finally:
            del failure
    return result


async def keep_reservation(
    connection: Connection,
    on_incoming: IncomingHandler,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Hold a reservation on the relay at the other end of ``connection``.

    Reports ``started`` once the relay accepted the reservation, then calls
    ``on_incoming(Incoming(...))`` for each dialer the relay pairs with us
    (awaited if it returns an awaitable: keep it short, and start the
    :func:`accept_via_relay` in a nursery you own, or the next items wait).
    Runs until the reservation ends; cancel it to give the reservation up.

    Args:
        connection: a running connection to the relay (``dial_tcp`` to its key).
        on_incoming: sync or async callable.

    Raises:
        RelayRefused: before ``started``: ``NOT_ALLOWED``,
            ``TOO_MANY_RESERVATIONS``; later: ``REPLACED`` (a newer reservation
            by our key took over).
        RelayUnavailable: ``RELAY_CLOSED`` (the connection ended) or
            ``RESERVATION_ENDED`` (the relay ended the stream).
        RelayProtocolError: ``BAD_ITEM``; the relay broke the protocol.
    """
    relay = format_key(connection.remote_public_key)[:12]

    async def work(client: RpcClient) -> None:
        try:
            async with client.stream(RESERVE, ReserveParams()) as items:
                try:
                    first = await items.receive()
                except trio.EndOfChannel:
                    raise RelayUnavailable("the relay ended the reservation before accepting it",
                                           code="RESERVATION_ENDED") from None
                if first.token is not None:
                    raise RelayProtocolError("the relay's first item was not an acceptance",
                                             code="BAD_ITEM")
                log.info("relay.reserved relay=%s", relay)
                task_status.started()
                async for item in items:
                    if item.token is None or item.initiator is None:
                        raise RelayProtocolError("a reservation item without a token",
                                                 code="BAD_ITEM")
                    log.debug("relay.incoming relay=%s initiator=%s", relay,
                              format_key(item.initiator)[:12])
                    result = on_incoming(Incoming(item.token, item.initiator))
                    if inspect.isawaitable(result):
                        await result
        except RpcError as exc:
            if exc.code == "INVALID_RESULT":
                raise RelayProtocolError(str(exc), code="BAD_ITEM") from exc
            raise _translate(exc, "the reservation") from exc

    await _with_control_client(connection, work)
    log.info("relay.reservation_ended relay=%s", relay)
    raise RelayUnavailable("the relay ended the reservation", code="RESERVATION_ENDED")


async def request_pair(
    connection: Connection,
    target_key: bytes,
    *,
    timeout_s: float = DEFAULT_PAIR_CALL_TIMEOUT_S,
) -> PairTicket:
    """Ask the relay to pair us with ``target_key``; return our attach ticket.

    Next: :func:`attach` with ``ticket.token`` as :attr:`Role.INITIATOR`
    within ``ticket.timeout_s`` (or use :func:`dial_via_relay` for all of it).

    Raises:
        KeyFormatError: ``target_key`` is not 32 bytes.
        RelayRefused: ``NOT_RESERVED``, ``TOO_MANY_PAIRS``,
            ``TOO_MANY_PAIRS_TO_TARGET``, ``SELF_PAIR`` ...
        RelayUnavailable: ``RELAY_CLOSED``.
        RelayTimeout: no answer within ``timeout_s``.
    """
    if len(target_key) != KEY_BYTES:
        raise KeyFormatError(f"target key must be {KEY_BYTES} bytes, got {len(target_key)}")

    async def work(client: RpcClient) -> PairReply:
        try:
            return await client.call(PAIR, PairParams(target=target_key), timeout_s=timeout_s)
        except RpcError as exc:
            raise _translate(exc, "pair") from exc

    reply = await _with_control_client(connection, work)
    return PairTicket(reply.token, reply.timeout_s)


async def attach_stream(stream: trio.abc.Stream, token: bytes, *, role: Role) -> None:
    """Send the attach request on ``stream`` and wait for the relay's status.

    Returns once the relay answered ``PAIRED``: the next bytes on ``stream``
    come from the other side. The caller owns ``stream`` (closes it on error).

    Raises:
        RelayRefused: the status names why (``UNKNOWN_TOKEN``, ``WRONG_ROLE``,
            ``ALREADY_ATTACHED``, ``PAIR_TIMEOUT``, ``BAD_ATTACH``).
        RelayUnavailable: ``RELAY_CLOSED``; the relay closed the connection.
        RelayProtocolError: ``BAD_STATUS``; an unknown status byte.
    """
    try:
        await stream.send_all(encode_attach_request(role, token))
        status = await stream.receive_some(1)
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise RelayUnavailable(f"the attach connection broke: {exc}",
                               code="RELAY_CLOSED") from exc
    if not status:
        raise RelayUnavailable("the relay closed the attach connection without an answer",
                               code="RELAY_CLOSED")
    if status[0] == AttachStatus.PAIRED:
        return
    try:
        name = AttachStatus(status[0]).name
    except ValueError:
        raise RelayProtocolError(f"unknown attach status {status[0]}",
                                 code="BAD_STATUS") from None
    raise RelayRefused(f"the relay refused the attach: {name}", code=name)


async def attach(
    relay_address: tuple[str, int],
    token: bytes,
    *,
    role: Role,
    timeout_s: float = DEFAULT_ATTACH_TIMEOUT_S,
    network: Network | None = None,
) -> trio.abc.HalfCloseableStream:
    """Open a raw TCP connection to the relay and attach it to a pairing.

    Args:
        relay_address: the relay's ``(host, port)`` (its DHT record's address).
        token: from :class:`PairTicket` (initiator) or :class:`Incoming` (responder).
        role: :attr:`Role.INITIATOR` for the dialer, :attr:`Role.RESPONDER` for
            the reserved peer.
        timeout_s: for the TCP connect and the wait for the other side.
        network: opens the stream (default: :class:`p2p.net.SocketNetwork`,
            real TCP); a :class:`p2p.net.MemoryHost` in tests.

    Returns:
        A stream on which the end-to-end handshake runs next.

    Raises:
        RelayUnavailable: ``RELAY_UNREACHABLE`` (connect failed) or ``RELAY_CLOSED``.
        RelayRefused: see :func:`attach_stream`.
        RelayTimeout: nothing within ``timeout_s``.
    """
    host, port = relay_address
    try:
        with trio.fail_after(timeout_s):
            try:
                stream = await (network or SocketNetwork()).open_stream((host, port))
            except OSError as exc:
                raise RelayUnavailable(
                    f"cannot reach the relay at {host}:{port}: {exc.strerror or exc}",
                    code="RELAY_UNREACHABLE",
                ) from exc
            try:
                await attach_stream(stream, token, role=role)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
    except trio.TooSlowError as exc:
        raise RelayTimeout(f"no pairing through {host}:{port} within {timeout_s} s",
                           code="TIMEOUT") from exc
    return stream


async def dial_via_relay(
    relay_connection: Connection,
    relay_address: tuple[str, int],
    keypair: KeyPair,
    target_key: bytes,
    *,
    config: ConnectionConfig | None = None,
    network: Network | None = None,
) -> Connection:
    """Reach ``target_key`` through the relay: pair, attach, handshake as initiator.

    The caller starts the result: ``await nursery.start(connection.run)``.

    Args:
        relay_connection: a running connection to the relay.
        relay_address: the relay's TCP ``(host, port)``.
        keypair: our identity.
        target_key: the reserved peer's key; the handshake fails unless it proves it.
        network: opens the attach stream (see :func:`attach`).

    Raises:
        RelayError: see :func:`request_pair` and :func:`attach`.
        HandshakeError: ``KEY_MISMATCH`` (not the target), ``TIMEOUT`` ...
    """
    config = config or ConnectionConfig()
    ticket = await request_pair(relay_connection, target_key)
    raw = await attach(relay_address, ticket.token, role=Role.INITIATOR,
                       timeout_s=ticket.timeout_s + ATTACH_MARGIN_S, network=network)
    stream = await SecretStream.initiator(raw, keypair, target_key, config=config.stream)
    log.debug("relay.dialed target=%s via=%s:%d", format_key(target_key)[:12], *relay_address)
    return Connection(stream, config=config)


async def accept_via_relay(
    relay_address: tuple[str, int],
    incoming: Incoming,
    keypair: KeyPair,
    *,
    config: ConnectionConfig | None = None,
    timeout_s: float = DEFAULT_ATTACH_TIMEOUT_S,
    network: Network | None = None,
) -> Connection:
    """Take an incoming relayed connection: attach as responder, handshake, check the dialer.

    The caller starts the result: ``await nursery.start(connection.run)``.
    ``network`` opens the attach stream (see :func:`attach`).

    Raises:
        RelayKeyMismatch: ``KEY_MISMATCH``; the dialer proved another key than
            ``incoming.initiator`` (the connection is closed).
        RelayError: see :func:`attach`.
        HandshakeError: the handshake failed.
    """
    config = config or ConnectionConfig()
    raw = await attach(relay_address, incoming.token, role=Role.RESPONDER, timeout_s=timeout_s,
                       network=network)
    stream = await SecretStream.responder(raw, keypair, config=config.stream)
    if stream.remote_public_key != incoming.initiator:
        await trio.aclose_forcefully(stream)
        raise RelayKeyMismatch(
            f"the relayed dialer proved key {format_key(stream.remote_public_key)[:12]}, "
            f"not {format_key(incoming.initiator)[:12]} as the relay announced",
            code="KEY_MISMATCH",
            expected=incoming.initiator,
            actual=stream.remote_public_key,
        )
    log.debug("relay.accepted initiator=%s via=%s:%d", format_key(incoming.initiator)[:12],
              *relay_address)
    return Connection(stream, config=config)
