"""What the swarm hands out for each peer: a connection and how it came about."""

from __future__ import annotations

import ipaddress

import trio

from ..connection import Connection
from ..keys import format_key
from ..mux import Channel, ChannelListener

__all__ = ["SwarmConnection", "is_local_address"]

Address = tuple[str, int]


def is_local_address(host: str) -> bool:
    """True for loopback, private (RFC 1918, ULA) and link-local addresses."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    return ip.is_loopback or ip.is_private or ip.is_link_local


class SwarmConnection:
    """One live connection to a peer, with what the swarm knows about it.

    Attributes:
        remote_public_key: the peer's key, proven by the handshake.
        remote_address: the TCP address at the other end of our socket: the
            peer's for a direct connection, the relay's for a relayed one.
        is_local: ``remote_address`` is loopback, private or link-local.
        relayed: the bytes go through a blind relay (``relay_key``).
        topics: the topics whose lookups led to this peer (empty for a peer
            that dialled us and that we never looked up).
        is_initiator: we dialled.
    """

    def __init__(
        self,
        connection: Connection,
        remote_address: Address,
        *,
        relay_key: bytes | None = None,
        topics: set[bytes] | None = None,
    ) -> None:
        self.connection = connection
        self.remote_address = remote_address
        self.relay_key = relay_key
        self.topics: set[bytes] = set(topics or ())
        self.opened_at = trio.current_time()
        self.closed = trio.Event()

    @property
    def remote_public_key(self) -> bytes:
        return self.connection.remote_public_key

    @property
    def is_initiator(self) -> bool:
        return self.connection.is_initiator

    @property
    def relayed(self) -> bool:
        return self.relay_key is not None

    @property
    def is_local(self) -> bool:
        return is_local_address(self.remote_address[0])

    async def open_channel(self, protocol: str, id: bytes = b"") -> Channel:
        return await self.connection.open_channel(protocol, id)

    def listen(self, protocol: str) -> ChannelListener:
        return self.connection.listen(protocol)

    async def aclose(self) -> None:
        await self.connection.aclose()

    async def wait_closed(self) -> None:
        await self.closed.wait()

    def __repr__(self) -> str:
        path = f"relay {format_key(self.relay_key)[:8]}" if self.relay_key else "direct"
        host, port = self.remote_address
        return (f"<SwarmConnection peer={format_key(self.remote_public_key)[:12]} "
                f"{path} {host}:{port}>")
