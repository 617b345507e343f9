"""Muxes joined in memory for the mux and RPC tests (and the daemons' RPC tests):
a running pair, an RPC client of a router as a given caller, a pass-through
stream to wrap, and send-then-collect."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio
import trio.testing

from p2p.mux import Mux, MuxConfig
from p2p.rpc import Router, RpcClient, serve_rpc


@asynccontextmanager
async def running_mux_pair(
    nursery: trio.Nursery,
    *,
    make_streams: Callable[[], tuple[trio.abc.Stream, trio.abc.Stream]] = (
        trio.testing.memory_stream_pair
    ),
    config: MuxConfig | None = None,
) -> AsyncIterator[tuple[Mux, Mux]]:
    """Two muxes joined by a stream pair, running in ``nursery``; closed on exit."""
    left_stream, right_stream = make_streams()
    left = Mux(left_stream, config=config, name="left")
    right = Mux(right_stream, config=config, name="right")
    await nursery.start(left.run)
    await nursery.start(right.run)
    try:
        yield left, right
    finally:
        with trio.CancelScope(shield=True):
            await left.aclose()
            await right.aclose()


@asynccontextmanager
async def rpc_client_of(nursery: trio.Nursery, router: Router, key: bytes | None, *,
                        protocol: str = "test/1") -> AsyncIterator[RpcClient]:
    """A client of ``router`` served over an in-memory mux pair as the caller
    ``key`` (what ``ctx.remote_public_key`` and a router's guard see)."""
    async with running_mux_pair(nursery) as (left, right):
        listener = right.listen(protocol)
        client_channel = await left.open_channel(protocol)
        server_channel = await listener.accept()
        await nursery.start(functools.partial(serve_rpc, server_channel, router,
                                              remote_public_key=key))
        client = RpcClient(client_channel)
        await nursery.start(client.run)
        try:
            yield client
        finally:
            await client.aclose()


class WrappedStream(trio.abc.Stream):
    """A pass-through wrapper around ``inner``; tests override what they change."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner

    async def send_all(self, data) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None):
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def send_and_collect(tx, rx, msgs) -> list[bytes]:
    """Send ``msgs`` then end on ``tx`` while reading ``rx`` to its end; return what came."""

    async def send() -> None:
        for message in msgs:
            await tx.send(message)
        await tx.send_eof()

    got: list[bytes] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        while True:
            try:
                got.append(await rx.receive())
            except trio.EndOfChannel:
                return got
