"""cosmicac-monitor/1 over in-memory mux channels: push then follow sees the
snapshot and then live records in order; a slow follower is cut off with LAGGED
while pushes go on; authorisation by the caller's key; bad batches refused."""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from contracts.monitor import (
    APPLICATION,
    FOLLOW,
    PROTOCOL,
    PUSH,
    Follow,
    PushBatch,
    decode_batch,
    encode_batch,
    make_record,
)
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from p2p.rpc import RpcClient, RpcConfig, RpcError, serve_rpc
from tests.p2p.conftest import running_mux_pair

DAEMON = b"\x01" * 32
READER = b"\x03" * 32
STRANGER = b"\x02" * 32


def recs(start: int, n: int, *, job: str = "j-1", source: str = "System"):
    return [make_record(f"line {i}", service="wrk-ork", job_id=job, source=source,
                        time_ns=i) for i in range(start, start + n)]


def push(records) -> PushBatch:
    return PushBatch(records=encode_batch(records))


@asynccontextmanager
async def connect(nursery, service: MonitorService, key: bytes | None,
                  config: RpcConfig | None = None):
    async with running_mux_pair(nursery) as (left, right):
        listener = right.listen(PROTOCOL)
        client_channel = await left.open_channel(PROTOCOL)
        server_channel = await listener.accept()
        await nursery.start(functools.partial(serve_rpc, server_channel, service.router,
                                              remote_public_key=key))
        client = RpcClient(client_channel, config=config)
        await nursery.start(client.run)
        try:
            yield client
        finally:
            await client.aclose()


def make_service(**kw) -> MonitorService:
    return MonitorService(LogBuffer(**kw), pushers=[DAEMON], followers=[READER])


async def test_push_then_follow_sees_snapshot_then_live_in_order(nursery, autojump_clock):
    service = make_service()
    async with (connect(nursery, service, DAEMON) as pusher,
                connect(nursery, service, READER) as reader):
        with trio.fail_after(10):
            assert (await pusher.call(PUSH, push(recs(0, 5)))).accepted == 5
            await pusher.call(PUSH, push(recs(100, 3, job="j-2")))
            seen, seqs = [], []
            async with reader.stream(FOLLOW, Follow(job_id="j-1")) as items:
                async for item in items:
                    seen += [r.time_ns for r in decode_batch(item.records)]
                    seqs.append(item.seq)
                    if len(seen) == 5:
                        await pusher.call(PUSH, push(recs(5, 2) + recs(200, 1, job="j-2")))
                        await pusher.call(PUSH, push(recs(7, 3)))
                    if len(seen) == 10:
                        break
            assert seen == list(range(10))
            assert seqs == [5, 10, 14]  # the last record of each item; j-2 numbered too
            await trio.testing.wait_all_tasks_blocked()  # the CANCEL reaches the server
            assert service.buffer.followers == 0  # the stream's end detached it


async def test_follow_filters_by_source_and_since(nursery, autojump_clock):
    service = make_service()
    async with (connect(nursery, service, DAEMON) as pusher,
                connect(nursery, service, READER) as reader):
        with trio.fail_after(10):
            await pusher.call(PUSH, push(recs(0, 10) + recs(10, 10, source=APPLICATION)))
            async with reader.stream(FOLLOW, Follow(source=APPLICATION, since_ns=15)) as items:
                async for item in items:
                    assert [r.time_ns for r in decode_batch(item.records)] == list(range(15, 20))
                    break


async def test_a_slow_follower_is_cut_off_with_lagged_while_pushes_go_on(nursery,
                                                                         autojump_clock):
    service = make_service(queue_records=50)
    window = RpcConfig(stream_window_items=2)
    async with (connect(nursery, service, DAEMON) as pusher,
                connect(nursery, service, READER, config=window) as reader):
        with trio.fail_after(30):
            async with reader.stream(FOLLOW, Follow(snapshot=False)) as items:
                got = 0
                await pusher.call(PUSH, push(recs(0, 10)))
                with pytest.raises(RpcError) as caught:
                    async for item in items:
                        got += len(decode_batch(item.records))
                        if got == 10:  # stop reading; the pusher goes on
                            for i in range(40):
                                assert (await pusher.call(
                                    PUSH, push(recs(1000 + i * 10, 10)))).accepted == 10
                                await trio.sleep(0.01)
                assert caught.value.code == "LAGGED"
                assert 10 < got < 410  # what it held before the cut, then the end
            await trio.testing.wait_all_tasks_blocked()
            assert service.buffer.stats.followers_lagged == 1
            assert service.buffer.stats.received == 10 + 400
            assert service.buffer.followers == 0


async def test_only_allowed_keys_push_and_follow(nursery, autojump_clock):
    service = make_service()
    async with connect(nursery, service, STRANGER) as stranger:
        with trio.fail_after(10):
            with pytest.raises(RpcError) as caught:
                await stranger.call(PUSH, push(recs(0, 1)))
            assert caught.value.code == "FORBIDDEN"
            with pytest.raises(RpcError) as caught:
                async with stranger.stream(FOLLOW, Follow()) as items:
                    async for _ in items:
                        pass
            assert caught.value.code == "FORBIDDEN"
            service.allow_any_pusher = True  # e.g. while telemetry.open
            assert (await stranger.call(PUSH, push(recs(0, 1)))).accepted == 1


async def test_a_bad_batch_is_refused_whole(nursery, autojump_clock):
    service = make_service()
    async with connect(nursery, service, DAEMON) as pusher:
        with trio.fail_after(10):
            with pytest.raises(RpcError) as caught:
                await pusher.call(PUSH, PushBatch(records=b"\x92\x01\x02"))
            assert caught.value.code == "BAD_BATCH" and "record 0" in str(caught.value)
            assert service.bad_batches == 1 and service.buffer.stats.received == 0
