"""Tests of RPC over a mux channel."""

from __future__ import annotations

import functools
import logging

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.errors import ConnectionBroken
from p2p.rpc import (
    CallContext,
    Method,
    Router,
    RpcChannelClosed,
    RpcClient,
    RpcConfig,
    RpcError,
    RpcProtocolError,
    RpcTimeout,
    serve_rpc,
)
from p2p.rpc._messages import (
    Cancel,
    Error,
    Request,
    Response,
    StreamCredit,
    StreamEnd,
    StreamItem,
    StreamRequest,
    decode_message,
    encode_message,
)
from tests.examples import examples
from tests.p2p.mux_pairs import running_mux_pair

from .support import (
    BAD_RESULT,
    BIG,
    BIG_ITEMS,
    CRASH,
    ECHO,
    ECHO_WRONG_PARAMS,
    FAIL,
    MISSING,
    TICKS,
    TICKS_THEN_FAIL,
    EchoParams,
    EchoResult,
    LooseParams,
    Recorder,
    TickParams,
    make_router,
    rpc_pair,
)


async def test_a_call_returns_the_validated_result(nursery, autojump_clock):
    async with rpc_pair(nursery) as (client, _server, _rec):
        with trio.fail_after(5):
            result = await client.call(ECHO, EchoParams(text="hi"))
            assert result == EchoResult(text="hi")
            # a dict is validated into the params model
            assert await client.call(ECHO, {"text": "dict"}) == EchoResult(text="dict")


async def test_a_result_too_large_for_the_channel_fails_that_call_alone(nursery, autojump_clock):
    # Sending it would fail and end the channel with every call on it (a
    # 1,000-job listing did that to app-node's only channel to wrk-ork).
    async with rpc_pair(nursery) as (client, _server, rec):
        with trio.fail_after(5):
            slow = trio.Event()
            answers: list[EchoResult] = []

            async def slow_call() -> None:
                answers.append(await client.call(ECHO, EchoParams(text="slow", delay_s=1)))
                slow.set()

            nursery.start_soon(slow_call)
            await rec.started.wait()
            with pytest.raises(RpcError) as caught:
                await client.call(BIG, TickParams(count=4 * 1024 * 1024))
            assert caught.value.code == "RESULT_TOO_LARGE"
            assert "ask for less" in caught.value.message
            await slow.wait()  # the call in flight got its answer
            assert answers == [EchoResult(text="slow")]
            items = []
            with pytest.raises(RpcError) as caught:
                async with client.stream(BIG_ITEMS, TickParams(count=4 * 1024 * 1024)) as got:
                    async for item in got:
                        items.append(item)
            assert caught.value.code == "RESULT_TOO_LARGE"
            assert items == [EchoResult(text="small")] and rec.stream_finished == []
            assert await client.call(ECHO, EchoParams(text="after")) == EchoResult(text="after")


async def test_two_hundred_concurrent_calls_all_get_their_own_answers(nursery, autojump_clock):
    async with rpc_pair(nursery) as (client, server, _rec):
        with trio.fail_after(10):
            results = {}

            async def one(i):
                results[i] = await client.call(ECHO, EchoParams(text=str(i), delay_s=0.01))

            async with trio.open_nursery() as inner:
                for i in range(200):
                    inner.start_soon(one, i)
            assert results == {i: EchoResult(text=str(i)) for i in range(200)}
            assert server.statistics().calls_started == 200


async def test_unknown_method_and_invalid_params_get_errors_and_the_link_stays_up(
    nursery, autojump_clock
):
    async with rpc_pair(nursery) as (client, _server, _rec):
        with trio.fail_after(5):
            with pytest.raises(RpcError) as unknown:
                await client.call(MISSING, EchoParams(text="x"))
            assert unknown.value.code == "UNKNOWN_METHOD"
            with pytest.raises(RpcError) as invalid:
                await client.call(ECHO_WRONG_PARAMS, LooseParams(text=5))
            assert invalid.value.code == "INVALID_PARAMS"
            assert "text" in invalid.value.message
            assert invalid.value.data[0]["field"] == "text"
            assert await client.call(ECHO, EchoParams(text="still up")) == EchoResult(
                text="still up"
            )


async def test_a_handler_rpc_error_reaches_the_caller_with_its_code(nursery, autojump_clock):
    async with rpc_pair(nursery) as (client, _server, _rec):
        with trio.fail_after(5):
            with pytest.raises(RpcError) as info:
                await client.call(FAIL, EchoParams(text="thing"))
            assert (info.value.code, info.value.message) == ("NOT_FOUND", "no thing")
            assert info.value.data == {"what": "thing"}


async def test_a_crashing_handler_gives_internal_without_leaking_details(
    nursery, autojump_clock, caplog
):
    caplog.set_level(logging.ERROR, logger="p2p.rpc._server")
    async with rpc_pair(nursery) as (client, _server, _rec):
        with trio.fail_after(5):
            with pytest.raises(RpcError) as info:
                await client.call(CRASH, EchoParams(text="x"))
            assert info.value.code == "INTERNAL"
            assert "secret" not in info.value.message
            records = [r for r in caplog.records if r.name == "p2p.rpc._server"]
            assert records and records[0].exc_info[0] is ValueError
            with pytest.raises(RpcError) as bad:
                await client.call(BAD_RESULT, EchoParams(text="x"))
            assert bad.value.code == "INTERNAL"


async def test_a_timeout_raises_rpc_timeout_and_cancels_the_server_handler(
    nursery, autojump_clock
):
    async with rpc_pair(nursery) as (client, server, rec):
        with trio.fail_after(30):
            with pytest.raises(RpcTimeout) as info:
                await client.call(ECHO, EchoParams(text="slow", delay_s=10), timeout_s=1)
            assert info.value.code == "TIMEOUT"
            await trio.testing.wait_all_tasks_blocked()
            assert rec.cancelled == ["slow"]
            assert server.statistics().calls_running == 0
            assert client.statistics().timeouts == 1


async def test_cancelling_the_caller_cancels_the_server_handler(nursery, autojump_clock):
    async with rpc_pair(nursery) as (client, server, rec):
        with trio.fail_after(30):
            async with trio.open_nursery() as inner:
                inner.start_soon(client.call, ECHO, EchoParams(text="doomed", delay_s=10))
                await rec.started.wait()
                inner.cancel_scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert rec.cancelled == ["doomed"]
            assert server.statistics().calls_running == 0
            assert client.statistics().calls_in_flight == 0


async def test_streamed_items_respect_the_window_and_do_not_block_other_calls(
    nursery, autojump_clock
):
    config = RpcConfig(stream_window_items=4)
    async with rpc_pair(nursery, client_config=config) as (client, _server, rec):
        with trio.fail_after(30):
            got = []
            async with client.stream(TICKS, TickParams(count=50)) as items:
                async for item in items:
                    got.append(item.n)
                    # the consumer is slow; the producer stays within the window
                    await trio.sleep(0.1)
                    await trio.testing.wait_all_tasks_blocked()
                    assert rec.produced <= len(got) + 4 + 1
                    if len(got) == 10:
                        # a unary call on the same channel is not held up
                        with trio.fail_after(0.5):
                            assert await client.call(ECHO, EchoParams(text="meanwhile"))
            assert got == list(range(50))
            assert rec.stream_finished == ["end"]


async def test_leaving_a_stream_early_cancels_the_server_generator(nursery, autojump_clock):
    async with rpc_pair(nursery) as (client, server, rec):
        with trio.fail_after(10):
            async with client.stream(TICKS, TickParams(count=1000)) as items:
                async for item in items:
                    if item.n == 3:
                        break
            await trio.testing.wait_all_tasks_blocked()
            assert rec.cancelled == ["ticks"]
            assert server.statistics().calls_running == 0
            assert client.statistics().calls_in_flight == 0


async def test_cancelling_a_stream_that_never_waits_for_credit_stops_its_generator(
    nursery, autojump_clock
):
    # With a window larger than the stream the producer never parks for credit,
    # and its sends only checkpoint shielded: the CANCEL must still stop it.
    config = RpcConfig(stream_window_items=100_000)
    async with rpc_pair(nursery, client_config=config) as (client, server, rec):
        with trio.fail_after(10):
            async with client.stream(TICKS, TickParams(count=20_000)) as items:
                async for item in items:
                    if item.n == 3:
                        break
            await trio.testing.wait_all_tasks_blocked()
            assert rec.cancelled == ["ticks"]
            assert rec.stream_finished == []
            assert server.statistics().calls_running == 0


async def test_a_stream_that_fails_midway_raises_its_error_after_the_items(
    nursery, autojump_clock
):
    async with rpc_pair(nursery) as (client, _server, _rec):
        with trio.fail_after(10):
            got = []
            with pytest.raises(RpcError) as info:
                async with client.stream(TICKS_THEN_FAIL, TickParams(count=3)) as items:
                    async for item in items:
                        got.append(item.n)
            assert got == [0, 1, 2]
            assert info.value.code == "STREAM_BROKE"


async def test_items_that_arrived_together_are_taken_without_waiting(nursery, autojump_clock):
    async with rpc_pair(nursery) as (client, _server, _rec):
        with trio.fail_after(10):
            for count, then in ((40, trio.EndOfChannel), (5, RpcError)):
                method = TICKS if then is trio.EndOfChannel else TICKS_THEN_FAIL
                got, batches = [], 0
                with pytest.raises(then):
                    async with client.stream(method, TickParams(count=count)) as items:
                        while True:
                            got.append((await items.receive()).n)
                            batches += 1
                            await trio.testing.wait_all_tasks_blocked()  # the rest arrive
                            while True:
                                try:
                                    got.append(items.receive_nowait().n)
                                except trio.WouldBlock:
                                    break
                assert got == list(range(count))  # in order, none lost, credit kept flowing
                assert batches < count


async def test_closing_the_channel_fails_in_flight_calls_with_channel_closed(
    nursery, autojump_clock
):
    async with rpc_pair(nursery) as (client, server, rec):
        with trio.fail_after(10):
            errors = []

            async def call():
                with pytest.raises(RpcChannelClosed) as info:
                    await client.call(ECHO, EchoParams(text="x", delay_s=100))
                errors.append(info.value)

            async with trio.open_nursery() as inner:
                inner.start_soon(call)
                inner.start_soon(call)
                await rec.started.wait()
                await trio.testing.wait_all_tasks_blocked()
                await server._channel.aclose()
            assert [e.code for e in errors] == ["CHANNEL_CLOSED"] * 2
            assert isinstance(errors[0], ConnectionBroken)
            with pytest.raises(RpcChannelClosed):
                await client.call(ECHO, EchoParams(text="after"))


async def test_calls_beyond_the_server_bound_are_answered_busy(nursery, autojump_clock):
    config = RpcConfig(max_concurrent_calls=2)
    async with rpc_pair(nursery, server_config=config) as (client, server, _rec):
        with trio.fail_after(10):
            outcomes = []

            async def call(i):
                try:
                    await client.call(ECHO, EchoParams(text=str(i), delay_s=1))
                    outcomes.append("ok")
                except RpcError as exc:
                    outcomes.append(exc.code)

            async with trio.open_nursery() as inner:
                for i in range(4):
                    inner.start_soon(call, i)
            assert sorted(outcomes) == ["BUSY", "BUSY", "ok", "ok"]
            assert server.statistics().busy_replies == 2


async def test_serve_rpc_ignores_garbage_and_keeps_answering(nursery, autojump_clock):
    async with running_mux_pair(nursery) as (left, right):
        with trio.fail_after(5):
            listener = right.listen("rpc")
            channel = await left.open_channel("rpc")
            server_channel = await listener.accept()
            await nursery.start(serve_rpc, server_channel, make_router(Recorder()))
            await channel.send(b"\xc1 not msgpack")
            await channel.send(msgpack.packb([99, 1]))
            await channel.send(encode_message(Request(7, "echo", {"text": "ok"})))
            assert decode_message(await channel.receive()) == Response(7, {"text": "ok"})


# -- codec -----------------------------------------------------------------------

ids = st.integers(min_value=0, max_value=(1 << 32) - 1)
credits = st.integers(min_value=0, max_value=(1 << 32) - 1)
names = st.text(max_size=20)
leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=10),
                 st.binary(max_size=10))
values = st.recursive(leaf, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
maps = st.dictionaries(st.text(max_size=8), values, max_size=4)

messages = st.one_of(
    st.builds(Request, ids, names, maps),
    st.builds(Response, ids, maps),
    st.builds(Error, ids, names, names, values),
    st.builds(Cancel, ids),
    st.builds(StreamRequest, ids, names, maps, credits),
    st.builds(StreamItem, ids, maps),
    st.builds(StreamEnd, ids),
    st.builds(StreamCredit, ids, credits),
)


@given(messages)
def test_every_rpc_message_round_trips(msg):
    assert decode_message(encode_message(msg)) == msg


@settings(max_examples=examples(300))
@given(st.one_of(st.binary(max_size=64), values.map(lambda v: msgpack.packb(v))))
def test_arbitrary_bytes_decode_to_a_message_or_an_rpc_protocol_error(data):
    try:
        decode_message(data)
    except RpcProtocolError as exc:
        assert exc.code in {"DECODE_ERROR", "BAD_MESSAGE"}


# -- who calls ----------------------------------------------------------------------


class _FakeConnection:
    remote_public_key = b"\x07" * 32


WHO = Method("who", params=EchoParams, result=EchoResult)


def _who_router(seen: list[CallContext]) -> Router:
    router = Router()

    async def who(params: EchoParams, ctx: CallContext) -> EchoResult:
        seen.append(ctx)
        if ctx.remote_public_key != _FakeConnection.remote_public_key:
            raise RpcError("FORBIDDEN", "unknown caller")
        return EchoResult(text=ctx.remote_public_key.hex())

    router.add(WHO, who)
    return router


@pytest.mark.parametrize("how", ["connection", "key", "neither"])
async def test_a_handler_knows_its_callers_key_and_connection(how, nursery, autojump_clock):
    seen: list[CallContext] = []
    connection = _FakeConnection()
    kwargs = {
        "connection": {"connection": connection},
        "key": {"remote_public_key": connection.remote_public_key},
        "neither": {},
    }[how]
    async with running_mux_pair(nursery) as (left, right):
        with trio.fail_after(5):
            listener = right.listen("rpc")
            client_channel = await left.open_channel("rpc")
            server_channel = await listener.accept()
            await nursery.start(
                functools.partial(
                    serve_rpc, server_channel, _who_router(seen), name="who-server", **kwargs
                )
            )
            client = RpcClient(client_channel)
            await nursery.start(client.run)
            if how == "neither":
                with pytest.raises(RpcError) as info:
                    await client.call(WHO, EchoParams(text="x"))
                assert info.value.code == "FORBIDDEN"  # refused by key
            else:
                result = await client.call(WHO, EchoParams(text="x"))
                assert result.text == connection.remote_public_key.hex()
            (ctx,) = seen
            assert ctx.name == "who-server" and ctx.method == "who"
            assert ctx.connection is (connection if how == "connection" else None)
            expected = None if how == "neither" else connection.remote_public_key
            assert ctx.remote_public_key == expected
            await client.aclose()
