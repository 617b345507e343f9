"""``logs.query``: the newest ``limit`` matching records in one answer, oldest first,
``more`` when older ones were left out (by count or by a batch's bytes); the
follow filter (job, source, since); followers only; nothing left attached."""

from __future__ import annotations

import pytest
import trio

from contracts.monitor import APPLICATION, MAX_TEXT_CHARS, QUERY, Query, decode_batch, make_record
from p2p.rpc import RpcError

from .support import DAEMON, READER, connect, make_service, recs


async def test_query_answers_the_newest_matching_records(nursery, autojump_clock):
    service = make_service()
    service.buffer.append(recs(0, 10) + recs(10, 5, job="j-2")
                          + recs(20, 5, source=APPLICATION))
    async with connect(nursery, service, READER) as reader:
        with trio.fail_after(10):
            result = await reader.call(QUERY, Query(job_id="j-1"))
            times = [r.time_ns for r in decode_batch(result.records)]
            assert times == [*range(10), *range(20, 25)] and not result.more
            result = await reader.call(QUERY, Query(job_id="j-1", source="System",
                                                    since_ns=4, limit=3))
            assert [r.time_ns for r in decode_batch(result.records)] == [7, 8, 9]
            assert result.more
            result = await reader.call(QUERY, Query(job_id="nobody"))
            assert decode_batch(result.records) == [] and not result.more
    assert service.buffer.followers == 0


async def test_query_keeps_within_a_batch_s_bytes(nursery, autojump_clock):
    service = make_service()
    big = [make_record("x" * MAX_TEXT_CHARS, service="s", job_id="j-1", time_ns=i)
           for i in range(40)]
    service.buffer.append(big)
    async with connect(nursery, service, READER) as reader:
        with trio.fail_after(10):
            result = await reader.call(QUERY, Query(job_id="j-1"))
    got = [r.time_ns for r in decode_batch(result.records)]
    assert result.more and got and got[-1] == 39 and got == list(range(40 - len(got), 40))


async def test_query_is_for_followers_only(nursery, autojump_clock):
    service = make_service()
    async with connect(nursery, service, DAEMON) as pusher:
        with trio.fail_after(10), pytest.raises(RpcError) as caught:
            await pusher.call(QUERY, Query())
    assert caught.value.code == "FORBIDDEN"
