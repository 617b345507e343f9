"""LokiPusher and LokiReader against a local Loki-compatible server over real sockets."""

from __future__ import annotations

import gzip
import json
import logging
import random
from collections.abc import Callable

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from nodes.monitor.loki import (
    ENTRY_OVERHEAD_BYTES,
    LokiError,
    LokiPusher,
    LokiReader,
    LokiRecord,
    _entry_bytes,
    encode_push,
    logql_string,
    stream_selector,
)
from tests.nodes.monitor.loki_server import (
    LokiServer,
    parse_go_string,
    parse_query,
    start_loki,
)

TIMEOUT_S = 10


@pytest.fixture
async def loki(nursery: trio.Nursery) -> LokiServer:
    return await start_loki(nursery)


def rec(ts: int, job: str = "job-1", source: str = "System", line: str | None = None,
        service: str = "wrk-ork") -> LokiRecord:
    return LokiRecord(time_ns=ts, service=service, source=source, job_id=job,
                      line=line if line is not None else f"line {ts}")


def fast_pusher(loki: LokiServer, **kw) -> LokiPusher:
    kw.setdefault("flush_interval_s", 0.01)
    return LokiPusher(loki.url, backoff_initial_s=0.01, backoff_max_s=0.05,
                      rng=random.Random(7), **kw)


async def wait_until(condition: Callable[[], bool]) -> None:
    """Poll a condition on real time (these tests use real sockets), bounded."""
    with trio.fail_after(TIMEOUT_S):
        while not condition():  # noqa: ASYNC110 - counters of a real-socket pusher
            await trio.sleep(0.005)


async def push_all(pusher: LokiPusher, records: list[LokiRecord],
                   done: Callable[[], bool] | None = None) -> None:
    """Offer ``records``, run the pusher until ``done`` (all pushed by default), close it."""
    async with pusher, trio.open_nursery() as nursery:
        nursery.start_soon(pusher.run)
        for r in records:
            pusher.offer(r)
        await wait_until(done or (lambda: pusher.statistics().pushed == len(records)))
        nursery.cancel_scope.cancel()


async def test_pushed_records_read_back_oldest_first_with_the_issue_labels(
        loki: LokiServer) -> None:
    records = [rec(100 + i, job="job-1" if i % 2 else "job-2",
                   source="System" if i % 3 else "Application") for i in range(30)]
    records.reverse()  # offered newest first: the pusher sorts each stream
    pusher = fast_pusher(loki)
    await push_all(pusher, records)

    labels = {labels for labels, _, _ in loki.entries()}
    assert {tuple(name for name, _ in label_set) for label_set in labels} == {
        ("job_id", "service", "source")}
    async with LokiReader(loki.url) as reader:
        got = await reader.query_range("job-1", start_ns=0, end_ns=10**6, limit=100)
        system = await reader.query_range("job-1", source="System", start_ns=0, end_ns=10**6,
                                          direction="forward")
        assert await reader.ready()
    assert got == sorted((r for r in records if r.job_id == "job-1"), key=lambda r: r.time_ns)
    assert system == [r for r in got if r.source == "System"]


async def test_pushes_are_gzip_json_with_string_timestamps(loki: LokiServer) -> None:
    pusher = fast_pusher(loki)
    await push_all(pusher, [rec(1), rec(2, source="Application")])
    push = loki.pushes[0]
    assert push.headers["content-encoding"] == "gzip"
    assert push.headers["content-type"] == "application/json"
    assert "x-scope-orgid" not in push.headers
    values = [v for stream in push.body["streams"] for v in stream["values"]]
    assert all(isinstance(ts, str) for ts, _ in values)


async def test_the_server_refuses_what_loki_refuses(loki: LokiServer) -> None:
    """The fake is only worth its tests if it is as strict as Loki's documented API."""
    push_url = loki.url + "/loki/api/v1/push"
    good = {"streams": [{"stream": {"job_id": "j"}, "values": [["5", "x"]]}]}
    bad_ts = {"streams": [{"stream": {"job_id": "j"}, "values": [[5, "x"]]}]}
    async with httpx.AsyncClient(trust_env=False, timeout=TIMEOUT_S) as client:
        gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        ok = await client.post(push_url, content=gzip.compress(json.dumps(good).encode()),
                               headers=gz)
        assert ok.status_code == 204
        bad = await client.post(push_url, content=json.dumps(bad_ts), headers={
            "Content-Type": "application/json"})
        assert bad.status_code == 400 and "timestamp" in bad.text
        malformed = await client.post(push_url, content=b"{", headers={
            "Content-Type": "application/json"})
        assert malformed.status_code == 400
        proto = await client.post(push_url, content=json.dumps(good), headers={
            "Content-Type": "application/x-protobuf"})
        assert proto.status_code == 400
    assert loki.entries() == [((("job_id", "j"),), 5, "x")]


async def test_a_page_boundary_inside_equal_timestamps_loses_and_repeats_nothing(
        loki: LokiServer) -> None:
    stamps = [1, 2, 3, 3, 3, 3, 4, 5, 5, 6, 7, 7, 7, 8]
    records = [rec(ts, line=f"line {i}", source="System" if i % 2 else "Application")
               for i, ts in enumerate(stamps)]
    for r in records:
        loki.streams.setdefault("fake", {}).setdefault(
            tuple(sorted(r.labels())), []).append((r.time_ns, r.line, ()))
    expected = sorted(records, key=lambda r: (r.time_ns, r.line))
    async with LokiReader(loki.url) as reader:
        for direction in ("forward", "backward"):
            got = await reader.query_range("job-1", start_ns=0, end_ns=100, limit=1000,
                                           direction=direction, page_limit=3)
            assert sorted(got, key=lambda r: (r.time_ns, r.line)) == expected, direction
            assert [r.time_ns for r in got] == sorted(stamps), direction
        newest = await reader.query_range("job-1", start_ns=0, end_ns=100, limit=4,
                                          direction="backward", page_limit=3)
        oldest = await reader.query_range("job-1", start_ns=0, end_ns=100, limit=4,
                                          direction="forward", page_limit=3)
    assert [r.time_ns for r in newest] == [7, 7, 7, 8]
    assert [r.time_ns for r in oldest] == [1, 2, 3, 3]


async def test_more_entries_at_one_timestamp_than_a_page_are_all_read(loki: LokiServer) -> None:
    loki.streams["fake"] = {tuple(sorted(rec(0).labels())): [(5, f"l{i}", ()) for i in range(7)]
                            + [(6, "after", ())]}
    async with LokiReader(loki.url) as reader:
        for direction in ("forward", "backward"):
            with trio.fail_after(TIMEOUT_S):
                got = await reader.query_range("job-1", start_ns=0, end_ns=100,
                                               direction=direction, page_limit=2)
            assert sorted(r.line for r in got) == sorted([f"l{i}" for i in range(7)] + ["after"])
            assert [r.time_ns for r in got] == [5] * 7 + [6]


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_failed_push_is_retried_without_loss_or_duplicate(
        loki: LokiServer, status: int) -> None:
    loki.fail_next(3, status)
    records = [rec(i) for i in range(10)]
    pusher = fast_pusher(loki)
    await push_all(pusher, records)
    assert sorted(ts for _, ts, _ in loki.entries()) == list(range(10))
    stats = pusher.statistics()
    assert (stats.retries, stats.failed, stats.rejected) == (3, 0, 0)
    assert [p.status for p in loki.pushes][:3] == [status] * 3


async def test_an_unreachable_loki_is_retried_then_given_up_and_counted() -> None:
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pusher = LokiPusher(f"http://127.0.0.1:{port}", flush_interval_s=0.01, max_retries=2,
                        backoff_initial_s=0.01, backoff_max_s=0.02, rng=random.Random(1))
    await push_all(pusher, [rec(1), rec(2)], done=lambda: pusher.statistics().failed == 2)
    assert pusher.statistics().retries == 2


async def test_a_rejected_batch_is_counted_and_later_batches_still_go(
        loki: LokiServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="nodes.monitor.loki")
    loki.fail_next(2, 400)
    pusher = fast_pusher(loki, batch_max_records=2)
    await push_all(pusher, [rec(i) for i in range(6)],
                   done=lambda: pusher.statistics().pushed + pusher.statistics().rejected == 6)
    stats = pusher.statistics()
    assert (stats.rejected, stats.pushed, stats.retries) == (4, 2, 0)
    assert sorted(ts for _, ts, _ in loki.entries()) == [4, 5]
    assert len([r for r in caplog.records if "loki.push.rejected" in r.message]) == 1


async def test_batches_respect_the_record_and_byte_bounds(loki: LokiServer) -> None:
    pusher = fast_pusher(loki, batch_max_records=4, batch_max_bytes=3 * (100 + 26))
    await push_all(pusher, [rec(i, line="x" * 100) for i in range(5)]
                   + [rec(10 + i) for i in range(8)])
    sizes = [sum(len(s["values"]) for s in p.body["streams"]) for p in loki.pushes]
    assert max(sizes) <= 4 and sum(sizes) == 13
    line_bytes = [sum(len(v[1]) + 26 for s in p.body["streams"] for v in s["values"])
                  for p in loki.pushes]
    assert max(line_bytes) <= 3 * (100 + 26)
    assert sizes[0] == 3  # three 100-byte lines fill the byte bound; the fourth waits


def test_offer_never_blocks_and_drops_the_oldest_beyond_the_bound() -> None:
    pusher = LokiPusher("http://127.0.0.1:9", max_buffered=5)
    for i in range(8):
        pusher.offer(rec(i))  # no trio, no task: offer is plain synchronous code
    stats = pusher.statistics()
    assert (stats.dropped, stats.buffered) == (3, 5)
    assert [r.time_ns for r in pusher._take_batch()] == [3, 4, 5, 6, 7]


def test_offer_many_is_offer_in_order_with_the_same_bounds() -> None:
    one, many = (LokiPusher("http://127.0.0.1:9", max_buffered=5) for _ in range(2))
    records = [rec(i) for i in range(4)] + [rec(4)._replace(line="é" * 10)] + \
        [rec(i) for i in range(5, 9)]
    for record in records:
        one.offer(record)
    many.offer_many(iter(records[:2]))
    many.offer_many(records[2:])
    assert one.statistics() == many.statistics()  # 4 dropped, 5 buffered
    assert one._buffered_bytes == many._buffered_bytes
    assert [r.time_ns for r in many._take_batch()] == [4, 5, 6, 7, 8]
    # A line's bytes are counted, not its characters.
    assert _entry_bytes(records[4]) == 20 + ENTRY_OVERHEAD_BYTES


async def test_the_newest_records_survive_an_outage_and_go_out_after_it(loki: LokiServer) -> None:
    pusher = fast_pusher(loki, max_buffered=3)
    for i in range(10):
        pusher.offer(rec(i))
    await push_all(pusher, [], done=lambda: pusher.statistics().pushed == 3)
    assert sorted(ts for _, ts, _ in loki.entries()) == [7, 8, 9]
    assert pusher.statistics().dropped == 7


async def test_tenants_are_kept_apart_by_x_scope_orgid(loki: LokiServer) -> None:
    pusher = fast_pusher(loki, tenant="team-a")
    await push_all(pusher, [rec(1)])
    assert loki.pushes[0].headers["x-scope-orgid"] == "team-a"
    assert loki.entries() == [] and len(loki.entries("team-a")) == 1
    async with LokiReader(loki.url, tenant="team-b") as other:
        assert await other.query_range("job-1", start_ns=0, end_ns=10) == []
    async with LokiReader(loki.url, tenant="team-a") as own:
        assert await own.query_range("job-1", start_ns=0, end_ns=10) == [rec(1)]


async def test_awkward_job_ids_are_escaped_in_the_query(loki: LokiServer) -> None:
    jobs = ['a"b', "back\\slash", "new\nline", "tab\tand\x01ctl", "ünï😀", "} |= \"x"]
    pusher = fast_pusher(loki)
    await push_all(pusher, [rec(i, job=j) for i, j in enumerate(jobs)])
    async with LokiReader(loki.url) as reader:
        for i, job in enumerate(jobs):
            assert await reader.query_range(job, start_ns=0, end_ns=100) == [rec(i, job=job)]


async def test_loki_errors_carry_the_status_and_lokis_message(loki: LokiServer) -> None:
    async with LokiReader(loki.url) as reader:
        with pytest.raises(LokiError) as err:
            await reader._page("{job_id=~\"x\"}", 0, 10, 10, "forward")
    assert err.value.status == 400 and "only = matchers" in err.value.message
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with LokiReader(f"http://127.0.0.1:{port}") as unreachable:
        with pytest.raises(LokiError) as err:
            await unreachable.query_range("j", start_ns=0, end_ns=1)
    assert err.value.status == 0


@given(st.text())
def test_any_label_value_round_trips_through_the_logql_parser(value: str) -> None:
    literal = logql_string(value)
    assert parse_go_string(literal, 0) == (value, len(literal))


@given(st.lists(st.tuples(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]*", fullmatch=True), st.text()),
                min_size=1, max_size=4))
def test_any_stream_selector_round_trips(matchers: list[tuple[str, str]]) -> None:
    assert parse_query(stream_selector(matchers)) == (matchers, [])


def test_encode_push_groups_by_label_set_and_sorts_each_stream() -> None:
    body = json.loads(encode_push([rec(3), rec(1, source="Application"), rec(2)]))
    streams = {s["stream"]["source"]: s["values"] for s in body["streams"]}
    assert streams == {"System": [["2", "line 2"], ["3", "line 3"]],
                       "Application": [["1", "line 1"]]}


def test_backoff_doubles_with_jitter_up_to_the_cap_and_honours_retry_after() -> None:
    pusher = LokiPusher("http://127.0.0.1:9", backoff_initial_s=0.2, backoff_max_s=30,
                        rng=random.Random(3))
    for attempt in range(12):
        nominal = min(30, 0.2 * 2 ** attempt)
        assert nominal / 2 <= pusher._backoff_s(attempt, None) <= nominal
    assert pusher._backoff_s(0, 5.0) == 5.0
    assert pusher._backoff_s(0, 3600.0) == 30  # a Retry-After beyond the cap is capped
