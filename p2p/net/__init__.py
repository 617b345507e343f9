"""Placeholder until the network abstraction lands (see branch h-net)."""

from __future__ import annotations

import trio

from ..dht import UdpTransport
from ..host._server import TcpListener

Address = tuple[str, int]


class SocketNetwork:
    async def open_stream(self, address: Address) -> trio.abc.HalfCloseableStream:
        return await trio.open_tcp_stream(*address)

    async def listen_stream(self, host: str, port: int) -> TcpListener:
        listeners = await trio.open_tcp_listeners(port, host=host or None)
        for extra in listeners[1:]:
            await extra.aclose()
        return TcpListener(listeners[0])

    async def bind_datagram(self, host: str, port: int) -> UdpTransport:
        return await UdpTransport.bind(host or "0.0.0.0", port)

    def interface_hosts(self) -> list[str]:
        return []


Network = SocketNetwork
__all__ = ["Address", "Network", "SocketNetwork"]
