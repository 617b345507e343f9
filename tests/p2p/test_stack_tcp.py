"""The whole stack over real TCP on 127.0.0.1: secret stream, channels and RPC."""

import pydantic
import trio

from p2p.connection import dial_tcp
from p2p.host import serve_tcp
from p2p.rpc import Method, Router, RpcClient, serve_rpc

from .helpers import ALICE, BOB


class Numbers(pydantic.BaseModel):
    a: int
    b: int


class Sum(pydantic.BaseModel):
    total: int


ADD = Method("add", params=Numbers, result=Sum)


def adder_router():
    router = Router()

    async def add(params: Numbers, ctx) -> Sum:
        await trio.sleep(0.001 * (params.a % 5))  # answers come back out of order
        return Sum(total=params.a + params.b)

    router.add(ADD, add)
    return router


async def test_two_hundred_concurrent_rpc_calls_over_tcp_each_get_their_answer():
    router = adder_router()

    async def rpc(channel):
        await serve_rpc(channel, router)

    results = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(serve_tcp, BOB, {"rpc": rpc})
            connection = await dial_tcp("127.0.0.1", port, ALICE, BOB.public_key)
            await nursery.start(connection.run)
            client = RpcClient(await connection.open_channel("rpc"))
            await nursery.start(client.run)

            async def call(index):
                results[index] = await client.call(ADD, Numbers(a=index, b=1000), timeout_s=30)

            async with trio.open_nursery() as calls:
                for index in range(200):
                    calls.start_soon(call, index)
            await connection.aclose()
            nursery.cancel_scope.cancel()
    assert {index: result.total for index, result in results.items()} == {
        index: index + 1000 for index in range(200)
    }


async def test_a_stalled_channel_does_not_block_a_fast_one_over_tcp():
    """The server floods a channel nobody reads; echoes on another still flow."""
    flood_sent = {"bytes": 0}
    stalled = trio.Event()

    async def flood(channel):
        chunk = b"x" * 65536
        while True:
            with trio.move_on_after(0.5) as scope:
                await channel.send(chunk)
            if scope.cancelled_caught:
                stalled.set()  # held at the window: the reader stopped
                await trio.sleep_forever()
            flood_sent["bytes"] += len(chunk)

    async def echo(channel):
        async for message in channel:
            await channel.send(message)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(serve_tcp, BOB, {"flood": flood, "echo": echo})
            connection = await dial_tcp("127.0.0.1", port, ALICE, BOB.public_key)
            await nursery.start(connection.run)
            flooded = await connection.open_channel("flood")
            assert await flooded.receive()  # it flows, then we stop reading it
            fast = await connection.open_channel("echo")
            await stalled.wait()
            for index in range(100):
                message = f"ping {index}".encode()
                await fast.send(message)
                assert await fast.receive() == message
            window = connection.config.mux.initial_window_bytes
            # What the flood got through is bounded by the window it was granted
            # (plus what sat in socket buffers at most once more).
            assert flood_sent["bytes"] <= 2 * window + 65536
            await connection.aclose()
            nursery.cancel_scope.cancel()
