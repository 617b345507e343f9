"""Usage accounting: the book sums exactly in any interleaving; the recorder writes it
to a real replica in batches, holds it while not admitted, and keeps it across a stop."""

from __future__ import annotations

import functools
import json
import logging

import pytest
import trio
import trio.lowlevel
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.inference import Usage
from crdt import Database, FsyncPolicy
from crdt import Usage as UsageRow
from nodes.proxy_inference.usage import PENDING_FILE, UsageBook, UsageRecorder, utc_day
from p2p.keys import KeyPair
from tests.examples import examples
from tests.p2p.helpers import wait_until

ADMIN = KeyPair.from_seed(b"\x11" * 32)
PROXY = KeyPair.from_seed(b"\x22" * 32)
NOW = 1_764_547_200.0  # 2025-12-01 00:00:00 UTC
DAY = "2025-12-01"

usages = st.builds(Usage, prompt_tokens=st.integers(0, 10_000),
                   completion_tokens=st.integers(0, 10_000), total_tokens=st.integers(0, 20_000),
                   audio_ms=st.integers(0, 100_000))
requests = st.tuples(st.sampled_from(["k1", "k2", "k3"]), st.sampled_from(["m1", "m2"]),
                     st.sampled_from(["2026-01-01", "2026-01-02"]), usages,
                     st.integers(0, 10**12))


def expected(reqs) -> dict:
    sums: dict = {}
    for key_id, model, day, usage, _ in reqs:
        row = sums.setdefault((key_id, model, day), [0, 0, 0, 0, 0])
        for i, value in enumerate((usage.prompt_tokens, usage.completion_tokens,
                                   usage.total_tokens, usage.audio_ms, 1)):
            row[i] += value
    return sums


def flatten(entries) -> dict:
    """What the ops of some entries add up to, per bucket."""
    sums: dict = {}
    for entry in entries:
        for op in entry:
            wire = op.to_wire()
            if wire[0] != "usage_add":
                continue
            row = sums.setdefault(tuple(wire[1:4]), [0, 0, 0, 0, 0])
            for i, value in enumerate(wire[4:9]):
                row[i] += value
    return sums


@given(st.lists(requests, max_size=80), st.lists(st.integers(0, 80), max_size=6),
       st.lists(st.booleans(), max_size=6))
def test_any_interleaving_of_requests_and_flushes_sums_exactly(reqs, cuts, failures):
    """Requests counted between flushes, some flushes failing and put back: what the
    successful flushes wrote plus what is left equals the sum of every request."""
    book = UsageBook()
    written: list = []
    cuts = sorted(set(cuts))
    position = 0
    for index, cut in enumerate([*cuts, len(reqs)]):
        for key_id, model, day, usage, at in reqs[position:cut]:
            assert book.add(key_id, model, day, usage, at)
        position = max(position, cut)
        taken = book.take()
        if index < len(failures) and failures[index]:
            book.put_back(taken)  # the append failed: nothing was written
        else:
            written.extend(taken.entries(7))
    written.extend(book.take().entries(7))
    assert flatten(written) == expected(reqs)
    last_used = {}
    for entry in written:
        for op in entry:
            wire = op.to_wire()
            if wire[0] == "key_used":
                last_used[wire[1]] = max(last_used.get(wire[1], -1), wire[2])
    assert last_used == {k: max(r[4] for r in reqs if r[0] == k) for k in {r[0] for r in reqs}}


def test_audio_only_usage_becomes_an_audio_op_and_mixed_usage_a_token_op():
    book = UsageBook()
    book.add("k", "whisper", DAY, Usage(audio_ms=1500), 1)
    book.add("k", "chat", DAY, Usage(prompt_tokens=3, total_tokens=3, audio_ms=10), 1)
    book.add("k", "empty", DAY, None, 1)
    ops = {op.to_wire()[2]: type(op).__name__ for op in book.entries(100)[0]
           if op.to_wire()[0] == "usage_add"}
    assert ops == {"whisper": "AddAudioUsage", "chat": "AddTokenUsage",
                   "empty": "AddTokenUsage"}


def test_a_full_book_drops_new_buckets_but_keeps_counting_old_ones():
    book = UsageBook(max_buckets=1)
    assert book.add("k", "m", DAY, Usage(total_tokens=1), 1)
    assert not book.add("k", "other", DAY, Usage(total_tokens=1), 1)
    assert book.add("k", "m", DAY, Usage(total_tokens=1), 2)
    assert book.dropped == 1 and book.buckets[("k", "m", DAY)].requests == 2


@given(st.lists(requests, max_size=30))
@settings(max_examples=examples(30))
def test_a_saved_book_reads_back_the_same(reqs):
    book = UsageBook()
    for key_id, model, day, usage, at in reqs:
        book.add(key_id, model, day, usage, at)
    again = UsageBook.from_json(json.loads(json.dumps(book.to_json())))
    assert again.buckets == book.buckets and again.last_used == book.last_used


@pytest.mark.parametrize("document", [{}, {"buckets": [[1]], "last_used": {}},
                                      {"buckets": [["k", "m", "d", -1, 0, 0, 0, 1]],
                                       "last_used": {}}, {"buckets": 3, "last_used": {}}])
def test_a_damaged_saved_book_is_refused(document):
    with pytest.raises(ValueError):
        UsageBook.from_json(document)


def test_utc_day_is_the_utc_date():
    assert utc_day(NOW) == DAY and utc_day(NOW - 1) == "2025-11-30"


async def open_pair(tmp_path, *, admit: bool):
    admin = await Database.open(tmp_path / "admin", ADMIN, fsync=FsyncPolicy.NEVER)
    proxy = await Database.open(tmp_path / "proxy", PROXY, bootstrap=admin.bootstrap,
                                fsync=FsyncPolicy.NEVER)
    if admit:
        await admin_admits(admin, proxy)
    return admin, proxy


async def admin_admits(admin: Database, proxy: Database) -> None:
    """The admin's add_writer entry, carried to the proxy's replica by hand."""
    await admin.change_writer("add_writer", PROXY.public_key)
    payloads, head = await admin.segment(ADMIN.public_key, 0, 1 << 20)
    await proxy.ingest(ADMIN.public_key, 0, payloads, head)
    assert proxy.is_writer


async def test_the_recorder_appends_batches_whose_rows_equal_the_sums(tmp_path, ticking):
    admin, db = await open_pair(tmp_path, admit=True)
    recorder = UsageRecorder(db, flush_interval_s=0.05, flush_ops=4, ops_per_entry=3,
                             clock=lambda: NOW)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            for i in range(200):
                recorder.record(f"k{i % 5}", "chat" if i % 2 else "embed",
                                Usage(prompt_tokens=i, completion_tokens=1, total_tokens=i + 1))
                if i % 17 == 0:
                    await trio.lowlevel.checkpoint()
            await wait_until(lambda: recorder.settled, limit_s=10)
            nursery.cancel_scope.cancel()
    rows = [row for k in range(5) for row in await db.usage(f"k{k}")]
    assert sum(r.requests for r in rows) == 200
    assert sum(r.prompt for r in rows) == sum(range(200))
    assert sum(r.total for r in rows) == sum(range(1, 201))
    assert await db.usage("k1", model="chat") == [UsageRow(
        "k1", "chat", DAY, sum(range(1, 200, 10)), 20, sum(range(2, 201, 10)), 0, 20)]
    assert await db.last_used("k3") == int(NOW * 1000)
    assert recorder.flushes >= 2  # batched, not one append per request
    await db.aclose()
    await admin.aclose()


async def test_usage_is_held_until_admitted_then_flushed(tmp_path, ticking, caplog):
    admin, db = await open_pair(tmp_path, admit=False)
    recorder = UsageRecorder(db, flush_interval_s=0.02, clock=lambda: NOW)
    caplog.set_level(logging.WARNING, "nodes.proxy_inference.usage")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(recorder.run)
            recorder.record("k", "chat", Usage(prompt_tokens=2, total_tokens=2))
            await recorder.flush()  # refused: not a writer; put back
            assert len(recorder.book) == 2
            assert [r for r in caplog.records if "usage_held" in r.getMessage()]
            await admin_admits(admin, db)
            await wait_until(lambda: recorder.settled, limit_s=10)
            nursery.cancel_scope.cancel()
    assert [(r.prompt, r.requests) for r in await db.usage("k")] == [(2, 1)]
    await db.aclose()
    await admin.aclose()


async def test_usage_not_written_at_stop_is_saved_and_written_after_the_restart(
        tmp_path, ticking):
    admin, db = await open_pair(tmp_path, admit=False)
    storage = tmp_path / "proxy"
    make = functools.partial(UsageRecorder, storage=storage, flush_interval_s=0.02,
                             clock=lambda: NOW)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            recorder = make(db)
            await nursery.start(recorder.run)
            recorder.record("k", "chat", Usage(prompt_tokens=5, total_tokens=5))
            nursery.cancel_scope.cancel()
        assert (storage / PENDING_FILE).exists()
        await admin_admits(admin, db)
        async with trio.open_nursery() as nursery:
            recorder = make(db)
            await nursery.start(recorder.run)
            recorder.record("k", "chat", Usage(prompt_tokens=1, total_tokens=1))
            await wait_until(lambda: recorder.settled, limit_s=10)
            nursery.cancel_scope.cancel()
    assert [(r.prompt, r.requests) for r in await db.usage("k")] == [(6, 2)]
    assert not (storage / PENDING_FILE).exists()
    await db.aclose()
    await admin.aclose()


async def test_a_clean_stop_flushes_what_was_counted(tmp_path, ticking):
    admin, db = await open_pair(tmp_path, admit=True)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            recorder = UsageRecorder(db, flush_interval_s=3600, clock=lambda: NOW)
            await nursery.start(recorder.run)
            recorder.record("k", "chat", Usage(completion_tokens=9, total_tokens=9))
            nursery.cancel_scope.cancel()
    assert [(r.completion, r.requests) for r in await db.usage("k")] == [(9, 1)]
    await db.aclose()
    await admin.aclose()
