"""The trio face: group commit, one caller's bad ops, cancellation, change events."""

import threading

import pytest
import trio

from crdt import AddTokenUsage, Database, FsyncPolicy, PutModelMaster, WriteRefused
from p2p.keys import KeyPair


def one(n: int) -> list:
    return [AddTokenUsage("k1", "m", "2026-11-29", prompt=n, total=n)]


async def test_concurrent_appends_share_fsyncs_and_each_gets_its_own_entry(tmp_path):
    async with await Database.open(tmp_path, KeyPair.generate(),
                                   fsync=FsyncPolicy.ALWAYS) as db:
        results = {}

        async def writer(w: int) -> None:
            for n in range(10):
                results[(w, n)] = await db.append(one(1))

        async with trio.open_nursery() as nursery:
            for w in range(20):
                nursery.start_soon(writer, w)
        indices = sorted(where.index for where in results.values())
        assert indices == list(range(200))  # every append got a distinct entry
        fsyncs = db.metrics.registry.get_sample_value("crdt_append_batches_total")
        assert fsyncs < 100  # appends that queued during a write shared its fsync
        usage = await db.read(lambda v: v.usage("k1"))
        assert usage[0].prompt == 200


async def test_a_bad_op_fails_its_own_caller_only(tmp_path):
    async with await Database.open(tmp_path, KeyPair.generate()) as db:
        outcomes = []

        async def good() -> None:
            outcomes.append(await db.append(one(1)))

        async def bad() -> None:
            with pytest.raises(WriteRefused) as refused:
                await db.append([("usage_add", "k1", "m", "yesterday", 1, 0, 1, 0, 1)])
            outcomes.append(refused.value.code)

        async with trio.open_nursery() as nursery:
            for task in (good, bad, good):
                nursery.start_soon(task)
        assert outcomes.count("BAD_OP") == 1 and len(outcomes) == 3
        assert db.lengths[db.key] == 2


async def test_an_append_cancelled_before_its_write_is_not_written(tmp_path):
    async with await Database.open(tmp_path, KeyPair.generate()) as db:
        async with db._write_lock:  # a write in progress
            with trio.move_on_after(0.05):
                await db.append(one(5))
        await db.append(one(1))
        assert db.lengths[db.key] == 1
        assert (await db.read(lambda v: v.usage("k1")))[0].prompt == 1


async def test_wait_changed_wakes_on_a_write_and_times_out_otherwise(tmp_path):
    async with await Database.open(tmp_path, KeyPair.generate()) as db:
        known = dict(db.lengths)
        with trio.fail_after(5):
            assert await db.wait_changed(known, 0.05) == known
        async with trio.open_nursery() as nursery:
            nursery.start_soon(db.append, one(1))
            with trio.fail_after(5):
                changed = await db.wait_changed(known, 30)
        assert changed[db.key] == 1


async def test_a_model_master_changed_after_it_was_built_is_checked_again(tmp_path):
    """Typed ops are checked when built and not again, except the one whose map
    a caller can still change afterwards."""
    async with await Database.open(tmp_path, KeyPair.generate()) as db:
        master = PutModelMaster("llama", "vllm", {"max_tokens": 16})
        master.defaults["nested"] = {"too": {"deep": [float("nan")]}}  # not JSON any more
        for append in (db.append, lambda ops: db.append_many([ops])):
            with pytest.raises(WriteRefused) as refused:
                await append([master])
            assert refused.value.code == "BAD_OP"
        await db.append([PutModelMaster("llama", "vllm", {"max_tokens": 16})])
        await db.append_many([[AddTokenUsage("k1", "llama", "2026-12-01", prompt=1)]])
        assert db.lengths[db.key] == 2


async def test_an_append_queued_behind_a_checkpoint_is_written_without_another_write(tmp_path):
    """The write lock's other holders (a checkpoint) wake the appends that wait
    for it, as a commit does: an append with no write after it once waited forever."""
    async with await Database.open(tmp_path, KeyPair.generate()) as db:
        await db.append(one(1))
        release = threading.Event()
        holding = trio.Event()
        real = db.base.checkpoint_state
        token = trio.lowlevel.current_trio_token()

        def slow_state(made_ms: int):
            token.run_sync_soon(holding.set)
            release.wait(10)  # holds the write lock until the append waits behind it
            return real(made_ms)

        db.base.checkpoint_state = slow_state
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(db.make_checkpoint, 1)
                await holding.wait()
                assert db._write_lock.locked()
                nursery.start_soon(db.append, one(2))
                await trio.sleep(0.05)  # the append now waits for the lock's holder
                release.set()
        usage = await db.read(lambda v: v.usage("k1"))
        assert usage[0].prompt == 3
