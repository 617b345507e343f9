"""Helpers for relay tests: a relay on 127.0.0.1 or on in-memory streams, and its clients."""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing

from p2p.connection import Connection, dial_tcp
from p2p.keys import KeyPair
from p2p.noise import SecretStream
from p2p.relay import Incoming, keep_reservation
from relay import RelayConfig, RelayServer

RELAY = KeyPair.from_seed(b"\x52" * 32)


async def start_relay(
    nursery: trio.Nursery,
    config: RelayConfig | None = None,
    *,
    observer: Callable[[int, bytes], None] | None = None,
) -> tuple[RelayServer, tuple[str, int]]:
    """A relay serving TCP on 127.0.0.1 (a free port); returns (server, address)."""
    server = RelayServer(RELAY, config, observer=observer)
    address = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
    return server, address


async def control(nursery: trio.Nursery, address: tuple[str, int], keypair: KeyPair) -> Connection:
    """A running control connection from ``keypair`` to the relay at ``address``."""
    connection = await dial_tcp(*address, keypair, RELAY.public_key)
    await nursery.start(connection.run)
    return connection


async def reserve(
    nursery: trio.Nursery, connection: Connection
) -> trio.MemoryReceiveChannel[Incoming]:
    """Start a reservation; return the channel its incoming items arrive on."""
    send, receive = trio.open_memory_channel[Incoming](16)
    await nursery.start(keep_reservation, connection, send.send)
    return receive


class MemoryRelay:
    """A relay fed in-memory stream pairs (for tests on the autojump clock)."""

    def __init__(self, nursery: trio.Nursery, config: RelayConfig | None = None) -> None:
        self.server = RelayServer(RELAY, config)
        self._nursery = nursery

    async def start(self) -> None:
        await self._nursery.start(self.server.run)

    def connect(self) -> trio.abc.HalfCloseableStream:
        """A new client stream; the relay serves the other end."""
        client, served = trio.testing.memory_stream_pair()
        self._nursery.start_soon(self.server.handle_stream, served)
        return client

    async def control(self, keypair: KeyPair) -> Connection:
        stream = await SecretStream.initiator(self.connect(), keypair, RELAY.public_key)
        connection = Connection(stream)
        await self._nursery.start(connection.run)
        return connection



async def wait_until(condition, *, limit_s: float = 10.0) -> None:
    """Poll state another task owns until ``condition()``; fail after ``limit_s``."""
    with trio.fail_after(limit_s):
        while not condition():  # noqa: ASYNC110 - no event exists for a server counter
            await trio.sleep(0.005)
