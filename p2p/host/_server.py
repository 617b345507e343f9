"""A plain server: one host on one stream listener, no DHT, no topics."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import trio

from ..connection import ConnectionConfig
from ..keys import KeyPair
from ..net import Network, SocketNetwork
from ._host import HostConfig, PeerHost
from ._service import ChannelHandler, ChannelService, Service

__all__ = ["serve_tcp"]


async def serve_tcp(
    keypair: KeyPair,
    handlers: Mapping[str, ChannelHandler] | None = None,
    *,
    services: Iterable[Service] = (),
    host: str = "127.0.0.1",
    port: int = 0,
    config: HostConfig | ConnectionConfig | None = None,
    peer_host: PeerHost | None = None,
    network: Network | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept TCP connections and serve channels by protocol, until cancelled.

    ``handlers`` maps protocols to ``handler(channel)``; ``services`` adds
    :class:`Service` objects (which see the peer's connection). Or pass a
    ``peer_host`` of your own (not yet running) to add services to it later.
    Reports ``(host, port)`` actually bound through ``task_status``.

    Raises:
        OSError: the port cannot be bound.
    """
    if isinstance(config, ConnectionConfig):
        config = HostConfig(connection=config)
    if peer_host is None:
        peer_host = PeerHost(keypair, config=config)
    for protocol, handler in (handlers or {}).items():
        peer_host.add_service(ChannelService.of_handler(protocol, handler))
    for service in services:
        peer_host.add_service(service)
    listener = await (network or SocketNetwork()).listen_stream(host, port)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(peer_host.run)
            await nursery.start(peer_host.serve_listener, listener)
            task_status.started(listener.local_address)
    finally:
        with trio.CancelScope(shield=True):
            await listener.aclose()
