"""The RPC test service: methods, a recording router and a running client/server
pair over an in-memory mux, shared by the RPC test modules."""

from __future__ import annotations

from contextlib import asynccontextmanager

import trio
from pydantic import BaseModel

from p2p.rpc import CallContext, Method, Router, RpcClient, RpcError, RpcServer, StreamMethod
from tests.p2p.mux_pairs import running_mux_pair


class EchoParams(BaseModel):
    text: str
    delay_s: float = 0.0


class EchoResult(BaseModel):
    text: str


class LooseParams(BaseModel):
    text: int


class TickParams(BaseModel):
    count: int


class Tick(BaseModel):
    n: int


ECHO = Method("echo", params=EchoParams, result=EchoResult)
ECHO_WRONG_PARAMS = Method("echo", params=LooseParams, result=EchoResult)
FAIL = Method("fail", params=EchoParams, result=EchoResult)
CRASH = Method("crash", params=EchoParams, result=EchoResult)
BAD_RESULT = Method("bad_result", params=EchoParams, result=EchoResult)
MISSING = Method("missing", params=EchoParams, result=EchoResult)
TICKS = StreamMethod("ticks", params=TickParams, item=Tick)
TICKS_THEN_FAIL = StreamMethod("ticks_then_fail", params=TickParams, item=Tick)
#: A result (or stream items) of ``count`` bytes of text.
BIG = Method("big", params=TickParams, result=EchoResult)
BIG_ITEMS = StreamMethod("big_items", params=TickParams, item=EchoResult)


class Recorder:
    """What the server's handlers saw."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.started = trio.Event()
        self.produced = 0
        self.stream_finished: list[str] = []


def make_router(rec: Recorder) -> Router:
    router = Router()

    async def echo(params: EchoParams, ctx: CallContext) -> EchoResult:
        assert ctx.method == "echo"
        if params.delay_s:
            rec.started.set()
            try:
                await trio.sleep(params.delay_s)
            except trio.Cancelled:
                rec.cancelled.append(params.text)
                raise
        return EchoResult(text=params.text)

    async def fail(params: EchoParams, ctx: CallContext) -> EchoResult:
        raise RpcError("NOT_FOUND", f"no {params.text}", data={"what": params.text})

    async def crash(params: EchoParams, ctx: CallContext) -> EchoResult:
        raise ValueError("secret internal detail")

    async def bad_result(params: EchoParams, ctx: CallContext) -> EchoResult:
        return {"nope": 1}  # type: ignore[return-value]

    async def ticks(params: TickParams, ctx: CallContext):
        try:
            for n in range(params.count):
                rec.produced = n + 1
                yield Tick(n=n)
            rec.stream_finished.append("end")
        except (trio.Cancelled, GeneratorExit):
            # cancelled inside the generator, or closed while suspended at a yield
            rec.cancelled.append("ticks")
            raise

    async def ticks_then_fail(params: TickParams, ctx: CallContext):
        for n in range(params.count):
            yield Tick(n=n)
        raise RpcError("STREAM_BROKE", "gave up")

    async def big(params: TickParams, ctx: CallContext) -> EchoResult:
        return EchoResult(text="x" * params.count)

    async def big_items(params: TickParams, ctx: CallContext):
        yield EchoResult(text="small")
        yield EchoResult(text="x" * params.count)
        rec.stream_finished.append("big_items")  # never: the stream ended at the big one

    router.add(ECHO, echo)
    router.add(BIG, big)
    router.add(BIG_ITEMS, big_items)
    router.add(FAIL, fail)
    router.add(CRASH, crash)
    router.add(BAD_RESULT, bad_result)
    router.add(TICKS, ticks)
    router.add(TICKS_THEN_FAIL, ticks_then_fail)
    return router


@asynccontextmanager
async def rpc_pair(nursery, *, server_config=None, client_config=None):
    rec = Recorder()
    async with running_mux_pair(nursery) as (left, right):
        listener = right.listen("rpc")
        client_channel = await left.open_channel("rpc")
        server_channel = await listener.accept()
        server = RpcServer(server_channel, make_router(rec), config=server_config)
        await nursery.start(server.run)
        client = RpcClient(client_channel, config=client_config)
        await nursery.start(client.run)
        yield client, server, rec
        await client.aclose()
