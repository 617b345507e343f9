"""Services: protocols that a host serves on every connection.

A daemon is one peer (one identity, one swarm) hosting several services: the
database's replication, its own RPC service, a log sender... Each service
names its protocol (channel name and version, e.g. ``cosmicac-db/1``) and
serves the channels that peers open to it, with the peer's proven identity at
hand. A service may also:

* refuse peers: :meth:`Service.allows` is one of the firewalls every
  connection must pass (``how`` says how the peer came: ``incoming``,
  ``relayed``, ``connect``, ``reconnect`` or ``topic:<hex>``);
* run a task per connection: :meth:`Service.on_connection` (cancelled when
  the connection ends or the service is removed), e.g. to pull from the peer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..mux import Channel

if TYPE_CHECKING:
    from ..connection import Connection
    from ..rpc import Router, RpcConfig

__all__ = ["ChannelHandler", "ChannelService", "PeerChannelHandler", "RpcService", "Service"]

#: ``handler(channel)``: serves one channel; the channel is closed when it returns.
ChannelHandler = Callable[[Channel], Awaitable[object]]
#: ``handler(channel, connection)``: the same, with the peer's connection at hand.
PeerChannelHandler = Callable[[Channel, "Connection"], Awaitable[object]]


class Service:
    """A protocol served on a host's connections; subclass and override.

    Attributes:
        protocol: the channel protocol name, with its version (``name/1``).
    """

    protocol: str = ""

    def allows(self, remote_public_key: bytes, how: str) -> bool:
        """May this peer connect at all? Every service and owner firewall must agree."""
        return True

    async def serve_channel(self, channel: Channel, connection: Connection) -> None:
        """Serve one channel a peer opened; it is closed when this returns."""
        raise NotImplementedError

    async def on_connection(self, connection: Connection) -> None:
        """Runs once per connection, in a task of its own; cancelled when the
        connection ends or the service is removed. The default does nothing."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.protocol}>"


class ChannelService(Service):
    """A service made of one channel handler (and optional hooks).

    Args:
        protocol: the channel protocol.
        handler: ``handler(channel, connection)`` for each channel opened to us.
        on_connection: an optional ``hook(connection)`` run once per connection.
        firewall: an optional ``firewall(remote_key, how) -> bool``.
    """

    def __init__(
        self,
        protocol: str,
        handler: PeerChannelHandler,
        *,
        on_connection: Callable[[Connection], Awaitable[object]] | None = None,
        firewall: Callable[[bytes, str], bool] | None = None,
    ) -> None:
        self.protocol = protocol
        self._handler = handler
        self._on_connection = on_connection
        self._firewall = firewall

    def allows(self, remote_public_key: bytes, how: str) -> bool:
        return self._firewall is None or bool(self._firewall(remote_public_key, how))

    async def serve_channel(self, channel: Channel, connection: Connection) -> None:
        await self._handler(channel, connection)

    async def on_connection(self, connection: Connection) -> None:
        if self._on_connection is not None:
            await self._on_connection(connection)

    @classmethod
    def of_handler(cls, protocol: str, handler: ChannelHandler) -> ChannelService:
        """A service from a handler that does not need the connection."""

        async def serve(channel: Channel, connection: Connection) -> None:
            await handler(channel)

        return cls(protocol, serve)


class RpcService(Service):
    """An RPC router served on a protocol; handlers see the caller's key and
    connection in their :class:`~p2p.rpc.CallContext` and authorise by them.

    Args:
        protocol: the channel protocol.
        router: the methods (one router for every connection).
        config: the RPC server's limits.
        firewall: an optional ``firewall(remote_key, how) -> bool``.
    """

    def __init__(
        self,
        protocol: str,
        router: Router,
        *,
        config: RpcConfig | None = None,
        firewall: Callable[[bytes, str], bool] | None = None,
    ) -> None:
        self.protocol = protocol
        self.router = router
        self.config = config
        self._firewall = firewall

    def allows(self, remote_public_key: bytes, how: str) -> bool:
        return self._firewall is None or bool(self._firewall(remote_public_key, how))

    async def serve_channel(self, channel: Channel, connection: Connection) -> None:
        # Imported here: a peer that serves no RPC (``cosmicac shell``) never loads
        # the RPC layer and pydantic with it (~0.1 s of start-up).
        from ..rpc import serve_rpc

        await serve_rpc(channel, self.router, config=self.config, connection=connection,
                        name=f"{self.protocol} {connection.peer_label}")
