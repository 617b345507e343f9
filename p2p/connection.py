"""A connection to a peer: one secret stream, its channel multiplexer and keep-alives.

This is the unit the swarm will hand out: it knows the remote key, runs the
mux's reader and writer and the stream's keep-alives in one nursery, and lets
protocols open or accept channels by name. :func:`dial_tcp` and
:func:`serve_tcp` make connections over plain TCP (the swarm adds discovery
and relays on top).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import trio

from .errors import HandshakeError
from .keys import KeyPair, format_key
from .mux import Channel, ChannelListener, Mux, MuxConfig
from .noise import SecretStream, SecretStreamConfig

__all__ = [
    "ChannelHandler",
    "Connection",
    "ConnectionConfig",
    "dial_tcp",
    "serve_channels",
    "serve_tcp",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionConfig:
    """Configuration of one connection's layers."""

    stream: SecretStreamConfig = field(default_factory=SecretStreamConfig)
    """Handshake, keep-alive and idle timeouts, read sizes."""

    mux: MuxConfig = field(default_factory=MuxConfig)
    """Channel windows and limits."""

    connect_timeout_s: float = 10.0
    """TCP connect, per attempt."""


class Connection:
    """A secret stream to one peer with channels over it.

    Start it with ``await nursery.start(connection.run)``; it runs until the
    stream ends or :meth:`aclose` is called.
    """

    def __init__(self, stream: SecretStream, *, config: ConnectionConfig | None = None) -> None:
        self.config = config or ConnectionConfig()
        self.stream = stream
        peer = format_key(stream.remote_public_key)[:12]
        self.mux = Mux(stream, config=self.config.mux, name=peer)

    @property
    def remote_public_key(self) -> bytes:
        return self.stream.remote_public_key

    @property
    def public_key(self) -> bytes:
        return self.stream.public_key

    @property
    def is_initiator(self) -> bool:
        return self.stream.is_initiator

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Drive the mux and the keep-alives until the connection ends."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.stream.keep_alive)
            await nursery.start(self.mux.run)
            task_status.started()
            await self.mux.wait_closed()
            nursery.cancel_scope.cancel()

    async def open_channel(self, protocol: str, id: bytes = b"") -> Channel:
        return await self.mux.open_channel(protocol, id)

    def listen(self, protocol: str) -> ChannelListener:
        return self.mux.listen(protocol)

    async def aclose(self) -> None:
        await self.mux.aclose()

    def __repr__(self) -> str:
        return f"<Connection peer={format_key(self.remote_public_key)[:12]}>"


async def dial_tcp(
    host: str,
    port: int,
    keypair: KeyPair,
    remote_public_key: bytes | None,
    *,
    config: ConnectionConfig | None = None,
) -> Connection:
    """Connect over TCP, run the handshake as initiator, return the connection.

    The caller starts it: ``await nursery.start(connection.run)``.

    Raises:
        OSError: the TCP connection could not be made.
        HandshakeError: the peer is not ``remote_public_key`` or the handshake failed.
    """
    config = config or ConnectionConfig()
    with trio.fail_after(config.connect_timeout_s):
        raw = await trio.open_tcp_stream(host, port)
    stream = await SecretStream.initiator(raw, keypair, remote_public_key, config=config.stream)
    return Connection(stream, config=config)


ChannelHandler = Callable[[Channel], Awaitable[object]]

#: After a connection ends, how long channel handlers may go on reading what
#: had already arrived before they are cancelled.
DRAIN_TIMEOUT_S = 10.0


async def serve_tcp(
    keypair: KeyPair,
    channel_handlers: Mapping[str, ChannelHandler],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    config: ConnectionConfig | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept TCP connections, handshake as responder, serve channels by protocol.

    For every connection, each protocol in ``channel_handlers`` is listened
    for *before* the connection starts, so a peer's first open is never
    refused for arriving early; each accepted channel runs
    ``channel_handlers[protocol](channel)`` in its own task. A failed
    handshake or a handler that raises is logged and dropped; neither stops
    the server.

    Reports ``(host, port)`` actually bound through ``task_status``.
    """
    config = config or ConnectionConfig()
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()

    async def handle(raw: trio.SocketStream) -> None:
        try:
            stream = await SecretStream.responder(raw, keypair, config=config.stream)
        except HandshakeError as exc:
            log.info("connection.refused code=%s reason=%s", exc.code, exc)
            return
        connection = Connection(stream, config=config)
        peer = format_key(connection.remote_public_key)[:12]
        log.debug("connection.accepted peer=%s", peer)
        channel_listeners = {
            protocol: connection.listen(protocol) for protocol in channel_handlers
        }
        handler_scope = trio.CancelScope()

        async def run_handlers() -> None:
            with handler_scope:
                async with trio.open_nursery() as handlers:
                    for protocol, listener in channel_listeners.items():
                        handlers.start_soon(serve_channels, listener,
                                            channel_handlers[protocol], peer)

        async with trio.open_nursery() as nursery:
            await nursery.start(connection.run)
            nursery.start_soon(run_handlers)
            await connection.mux.wait_closed()
            # What arrived before the end is still readable: give handlers
            # time to read it rather than cancelling them mid-message.
            handler_scope.deadline = trio.current_time() + DRAIN_TIMEOUT_S

    task_status.started((bound[0], bound[1]))
    await trio.serve_listeners(handle, listeners)


async def serve_channels(
    listener: ChannelListener, handler: ChannelHandler, peer: str
) -> None:
    """Run ``handler(channel)`` in a task of its own for every channel accepted,
    until the listener closes; a handler that raises is logged, the rest go on."""

    async def run_one(channel: Channel) -> None:
        try:
            await handler(channel)
        except Exception:
            # One bad channel (or handler bug) must not take the connection down.
            log.exception("channel.handler_failed peer=%s protocol=%s", peer, channel.protocol)
        finally:
            await channel.aclose()

    async with trio.open_nursery() as nursery:
        while True:
            try:
                channel = await listener.accept()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return
            nursery.start_soon(run_one, channel)
