"""Tests of RPC's fast paths: push delivery, worker reuse, immediate replies."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from p2p.mux import MuxConfig
from p2p.rpc import (
    CallContext,
    Router,
    RpcClient,
    RpcConfig,
    RpcError,
    RpcServer,
    RpcTimeout,
    RpcUsageError,
)
from p2p.rpc._messages import Cancel, Error, Request, Response, decode_message, encode_message
from tests.p2p.mux_pairs import running_mux_pair

from .support import (
    ECHO,
    MISSING,
    TICKS,
    EchoParams,
    EchoResult,
    Recorder,
    TickParams,
    make_router,
    rpc_pair,
)

SMALL = MuxConfig(initial_window_bytes=1024, max_message_bytes=512, max_send_buffer_bytes=4096)


async def test_rpc_over_a_lockstep_stream_pair(nursery, autojump_clock):
    async with running_mux_pair(
        nursery, make_streams=trio.testing.lockstep_stream_pair, config=SMALL
    ) as (left, right):
        with trio.fail_after(60):
            listener = right.listen("rpc")
            client_channel = await left.open_channel("rpc")
            server_channel = await listener.accept()
            await nursery.start(RpcServer(server_channel, make_router(Recorder())).run)
            client = RpcClient(client_channel)
            await nursery.start(client.run)
            results: list[str] = []

            async def caller(i: int) -> None:
                for j in range(10):
                    result = await client.call(ECHO, EchoParams(text=f"{i}-{j}"))
                    results.append(result.text)

            async with trio.open_nursery() as inner:
                for i in range(8):
                    inner.start_soon(caller, i)
                got = []
                async with client.stream(TICKS, TickParams(count=40)) as items:
                    async for item in items:
                        got.append(item.n)
            assert sorted(results) == sorted(f"{i}-{j}" for i in range(8) for j in range(10))
            assert got == list(range(40))
            await client.aclose()


async def test_a_worker_keeps_serving_after_its_call_was_cancelled(nursery, autojump_clock):
    config = RpcConfig(max_concurrent_calls=3)
    async with rpc_pair(nursery, server_config=config) as (client, server, rec):
        with trio.fail_after(60):
            for round_ in range(3):
                try:
                    await client.call(
                        ECHO, EchoParams(text=f"slow{round_}", delay_s=10), timeout_s=1
                    )
                except RpcTimeout:
                    pass
                for i in range(5):
                    result = await client.call(ECHO, EchoParams(text=f"{round_}.{i}"))
                    assert result.text == f"{round_}.{i}"
            await trio.testing.wait_all_tasks_blocked()
            assert rec.cancelled == ["slow0", "slow1", "slow2"]

            async def one(i: int) -> None:
                assert (await client.call(ECHO, EchoParams(text=str(i)))).text == str(i)

            async with trio.open_nursery() as inner:
                for i in range(3):
                    inner.start_soon(one, i)
            await trio.testing.wait_all_tasks_blocked()
            stats = server.statistics()
            assert stats.calls_running == 0 and stats.calls_started == 3 + 15 + 3
            # Workers are reused, never more than the concurrency bound.
            assert 1 <= len(server._idle) <= config.max_concurrent_calls


async def test_a_cancel_that_arrives_before_the_handler_runs_skips_it(nursery, autojump_clock):
    async with running_mux_pair(nursery) as (left, right):
        with trio.fail_after(10):
            listener = right.listen("rpc")
            channel = await left.open_channel("rpc")
            rec = Recorder()
            server = RpcServer(await listener.accept(), make_router(rec))
            await nursery.start(server.run)
            # Both frames go out in one write, so the server's reader handles
            # both before any worker runs.
            params = {"text": "never", "delay_s": 5.0}
            channel.send_nowait(encode_message(Request(1, "echo", params)))
            channel.send_nowait(encode_message(Cancel(1)))
            channel.send_nowait(encode_message(Request(2, "echo", {"text": "yes"})))
            reply = decode_message(await channel.receive())
            assert reply == Response(2, {"text": "yes"})
            await trio.testing.wait_all_tasks_blocked()
            assert not rec.started.is_set()  # the cancelled handler never ran
            assert server.statistics().calls_running == 0
            with pytest.raises(trio.WouldBlock):
                channel.receive_nowait()  # call 1 got no answer


async def test_immediate_errors_to_a_client_that_does_not_read_are_bounded(
    nursery, autojump_clock
):
    async with running_mux_pair(nursery, config=SMALL) as (left, right):
        with trio.fail_after(10):
            listener = right.listen("rpc")
            channel = await left.open_channel("rpc")
            config = RpcConfig(max_concurrent_calls=2)
            server = RpcServer(await listener.accept(), make_router(Recorder()), config=config)
            await nursery.start(server.run)
            count = 60
            for rid in range(count):  # never reading the answers meanwhile
                await channel.send(encode_message(Request(rid, MISSING.name, {"text": "x"})))
            await trio.testing.wait_all_tasks_blocked()
            dropped = server.statistics().replies_dropped
            assert dropped > 0
            answered = 0
            while answered + dropped < count:
                reply = decode_message(await channel.receive())
                assert isinstance(reply, Error) and reply.code == "UNKNOWN_METHOD"
                answered += 1
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.WouldBlock):
                channel.receive_nowait()  # the dropped ones never come
            assert len(server._outbox) == 0
            assert server.statistics().replies_dropped == dropped


class _MemoryChannel(trio.abc.Channel[bytes]):
    """A bidirectional channel from two trio memory channels (no push delivery)."""

    def __init__(self, send: trio.MemorySendChannel, receive: trio.MemoryReceiveChannel):
        self._send = send
        self._receive = receive

    async def send(self, value: bytes) -> None:
        await self._send.send(value)

    async def receive(self) -> bytes:
        return await self._receive.receive()

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


async def test_rpc_over_a_channel_without_push_delivery(nursery, autojump_clock):
    a_send, b_receive = trio.open_memory_channel[bytes](16)
    b_send, a_receive = trio.open_memory_channel[bytes](16)
    client_channel = _MemoryChannel(a_send, a_receive)
    server_channel = _MemoryChannel(b_send, b_receive)
    with trio.fail_after(10):
        await nursery.start(RpcServer(server_channel, make_router(Recorder())).run)
        client = RpcClient(client_channel)
        await nursery.start(client.run)
        assert (await client.call(ECHO, EchoParams(text="pulled"))).text == "pulled"
        with pytest.raises(RpcError) as info:
            await client.call(MISSING, EchoParams(text="x"))
        assert info.value.code == "UNKNOWN_METHOD"
        async with client.stream(TICKS, TickParams(count=20)) as items:
            assert [item.n async for item in items] == list(range(20))
        await client.aclose()


class _InlineRecord:
    def __init__(self) -> None:
        self.tasks: list[trio.lowlevel.Task] = []


def _inline_router(record: _InlineRecord) -> Router:
    router = Router()

    def echo(params: EchoParams, ctx: CallContext) -> EchoResult:
        record.tasks.append(trio.lowlevel.current_task())
        if params.text == "refuse":
            raise RpcError("NOT_FOUND", "no such thing")
        if params.text == "crash":
            raise ValueError("secret internal detail")
        return EchoResult(text=params.text)

    router.add(ECHO, echo, inline=True)
    return router


async def test_inline_handlers_run_in_the_reader_and_answer_like_any_other(
    nursery, autojump_clock
):
    record = _InlineRecord()
    async with running_mux_pair(nursery) as (left, right):
        with trio.fail_after(10):
            listener = right.listen("rpc")
            client_channel = await left.open_channel("rpc")
            server = RpcServer(await listener.accept(), _inline_router(record))
            await nursery.start(server.run)
            client = RpcClient(client_channel)
            await nursery.start(client.run)
            results = []

            async def caller(i: int) -> None:
                for j in range(5):
                    results.append((await client.call(ECHO, EchoParams(text=f"{i}.{j}"))).text)

            async with trio.open_nursery() as callers:
                for i in range(6):
                    callers.start_soon(caller, i)
            assert sorted(results) == sorted(f"{i}.{j}" for i in range(6) for j in range(5))
            # Every call ran in one task (the mux reader's), none in a worker.
            assert len(set(record.tasks)) == 1
            assert record.tasks[0] is not trio.lowlevel.current_task()
            assert not server._idle
            with pytest.raises(RpcError) as refused:
                await client.call(ECHO, EchoParams(text="refuse"))
            assert refused.value.code == "NOT_FOUND"
            with pytest.raises(RpcError) as crashed:
                await client.call(ECHO, EchoParams(text="crash"))
            assert crashed.value.code == "INTERNAL" and "secret" not in crashed.value.message
            assert server.statistics().calls_failed == 2
            assert (await client.call(ECHO, EchoParams(text="after"))).text == "after"
            await client.aclose()


async def test_inline_calls_go_to_workers_while_answers_wait_for_a_client_that_does_not_read(
    nursery, autojump_clock
):
    record = _InlineRecord()
    async with running_mux_pair(nursery, config=SMALL) as (left, right):
        with trio.fail_after(10):
            listener = right.listen("rpc")
            channel = await left.open_channel("rpc")
            server = RpcServer(await listener.accept(), _inline_router(record),
                               config=RpcConfig(max_concurrent_calls=4))
            await nursery.start(server.run)
            count = 60
            sent = 0
            # Never reading the answers: the channel's credit runs out, answers
            # wait in the outbox, and later calls are bounded by the worker
            # limit (BUSY) instead of queueing without end in the reader.
            with trio.move_on_after(5):
                for rid in range(count):
                    await channel.send(encode_message(Request(rid, ECHO.name, {"text": "x"})))
                    sent += 1
            await trio.testing.wait_all_tasks_blocked()
            assert len(server._outbox) <= 4 + 1
            answers = {"ok": 0, "BUSY": 0}
            while sum(answers.values()) < sent:
                with trio.move_on_after(1):
                    reply = decode_message(await channel.receive())
                    if isinstance(reply, Response):
                        answers["ok"] += 1
                    else:
                        assert isinstance(reply, Error) and reply.code == "BUSY"
                        answers["BUSY"] += 1
                    continue
                break  # the rest were dropped BUSY answers (bounded)
            assert answers["ok"] >= 1
            assert sum(answers.values()) + server.statistics().replies_dropped == sent


def test_inline_is_refused_for_coroutines_and_streams():
    router = Router()

    async def echo(params, ctx):
        return params

    with pytest.raises(RpcUsageError) as coroutine:
        router.add(ECHO, echo, inline=True)
    assert coroutine.value.code == "BAD_HANDLER"
    with pytest.raises(RpcUsageError):
        router.add(TICKS, lambda params, ctx: None, inline=True)
    assert not router.names


async def test_answers_the_stream_refuses_to_write_at_once_go_out_through_the_writer():
    """Over a real secret stream whose writes are sliced small, the reader's
    batch of inline answers is more than one write takes: the reader hands the
    frames to the writer task instead of waiting on the write itself."""
    from p2p.connection import ConnectionConfig, dial_tcp
    from p2p.host import RpcService, serve_tcp
    from p2p.keys import KeyPair
    from p2p.mux import _driver
    from p2p.noise import SecretStreamConfig

    config = ConnectionConfig(stream=SecretStreamConfig(send_slice_bytes=1024))
    server_keys = KeyPair.generate()
    handoffs = 0
    real = _driver.Mux._write_from_reader

    def counting(self) -> None:
        nonlocal handoffs
        real(self)
        handoffs += self._handoff is not None

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            _host, port = await nursery.start(lambda task_status: serve_tcp(
                server_keys, services=[RpcService("rpc", _inline_router(_InlineRecord()))],
                config=config, task_status=task_status))
            connection = await dial_tcp("127.0.0.1", port, KeyPair.generate(),
                                        server_keys.public_key, config=config)
            await nursery.start(connection.run)
            client = RpcClient(await connection.open_channel("rpc"))
            await nursery.start(client.run)
            results = []

            async def caller(i: int) -> None:
                for j in range(20):
                    text = f"{i}.{j}." + "x" * 600
                    results.append((await client.call(ECHO, EchoParams(text=text))).text)

            _driver.Mux._write_from_reader = counting
            try:
                async with trio.open_nursery() as callers:
                    for i in range(32):
                        callers.start_soon(caller, i)
            finally:
                _driver.Mux._write_from_reader = real
            assert sorted(results) == sorted(
                f"{i}.{j}." + "x" * 600 for i in range(32) for j in range(20))
            assert handoffs > 0
            await client.aclose()
            await connection.aclose()
            nursery.cancel_scope.cancel()
