"""cosmicac-monitor/1 over in-memory mux channels: push then follow sees the
snapshot and then live records in order; a slow follower is cut off with LAGGED
while pushes go on; authorisation by the caller's key; bad batches refused."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from contracts.monitor import (
    APPLICATION,
    FOLLOW,
    PUSH,
    Follow,
    PushBatch,
    decode_batch,
    encode_batch,
)
from p2p.rpc import RpcConfig, RpcError

from .support import DAEMON, READER, STRANGER, connect, make_service, recs


def push(records) -> PushBatch:
    return PushBatch(records=encode_batch(records))


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
