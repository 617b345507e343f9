"""One queue end on its own (entries carried by hand): durability, acks, verification."""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from p2p.keys import KeyPair
from p2p.log import FsyncPolicy, WriterLog
from p2p.queue import (
    BadQueueMessage,
    DurableQueue,
    PayloadTooLarge,
    PublishFailed,
    QueueClosed,
    QueueConfig,
    QueueError,
    QueueInUse,
)
from p2p.queue._messages import encode_entry, head_namespace
from tests.p2p.queue.helpers import FAST, mock_clock

A = KeyPair.from_seed(b"\x0a" * 32)
B = KeyPair.from_seed(b"\x0b" * 32)
C = KeyPair.from_seed(b"\x0c" * 32)


@pytest.fixture
def clock():
    return mock_clock()


async def carry(source: DurableQueue, into: DurableQueue) -> None:
    """What the service does, by hand: the source's log from what ``into`` stores."""
    while into.received < source.published:
        entries, head = await source.segment(into.received, 1 << 20)
        await into.ingest(entries, head)
    source.peer_status(into.received, into.acked)


async def test_publish_is_durable_and_positions_survive_a_reopen(tmp_path):
    async with await DurableQueue.open(tmp_path, A, B.public_key) as queue:
        assert [await queue.publish("j", b"%d" % i) for i in range(3)] == [1, 2, 3]
    async with await DurableQueue.open(tmp_path, A, B.public_key) as queue:
        assert queue.statistics().published == 3
        assert await queue.publish("j", b"3") == 4
    with WriterLog.open(tmp_path / "out.log", A.public_key, namespace=head_namespace(
            B.public_key), read_only=True) as out:
        assert list(out.entries()) == [encode_entry("j", b"%d" % i) for i in range(4)]


async def test_concurrent_publishers_share_appends(tmp_path):
    async with await DurableQueue.open(tmp_path, A, B.public_key,
                                       config=QueueConfig(fsync=FsyncPolicy.ALWAYS)) as queue:
        appends = 0
        real = queue._out.write_prepared

        def counting(batch):
            nonlocal appends
            appends += 1
            return real(batch)

        queue._out.write_prepared = counting
        positions = {}

        async def publisher(n):
            for i in range(20):
                positions[(n, i)] = await queue.publish(f"job-{n}", b"%d" % i)

        async with trio.open_nursery() as nursery:
            for n in range(25):
                nursery.start_soon(publisher, n)
        assert sorted(positions.values()) == list(range(1, 501))
        for n in range(25):  # each publisher's own order is the log's order
            mine = [positions[(n, i)] for i in range(20)]
            assert mine == sorted(mine)
        assert appends < 100  # group commit: 500 publishes in far fewer appends


async def test_a_second_handle_on_the_directory_is_refused(tmp_path):
    async with await DurableQueue.open(tmp_path, A, B.public_key, config=FAST):
        with pytest.raises(QueueInUse):
            await DurableQueue.open(tmp_path, A, B.public_key, config=FAST)


async def test_limits_are_enforced_before_anything_is_written(tmp_path):
    config = QueueConfig(fsync=FsyncPolicy.NEVER, max_payload_bytes=10, max_key_bytes=3)
    async with await DurableQueue.open(tmp_path, A, B.public_key, config=config) as queue:
        with pytest.raises(PayloadTooLarge):
            await queue.publish("k", bytes(11))
        with pytest.raises(PayloadTooLarge):
            await queue.publish("long", b"")
        assert queue.statistics().published == 0
    with pytest.raises(ValueError):
        await DurableQueue.open(tmp_path / "x", A, A.public_key)


async def test_a_failed_append_fails_its_publishes_and_the_next_ones_work(tmp_path):
    async with await DurableQueue.open(tmp_path, A, B.public_key, config=FAST) as queue:
        real = queue._out.write_prepared

        def failing(batch):
            raise OSError(28, "No space left on device")

        queue._out.write_prepared = failing
        with pytest.raises(PublishFailed) as failed:
            await queue.publish("k", b"x")
        assert isinstance(failed.value.__cause__, OSError)
        queue._out.write_prepared = real
        assert await queue.publish("k", b"y") == 1


async def test_backpressure_at_the_queued_bound(tmp_path):
    config = QueueConfig(fsync=FsyncPolicy.NEVER, max_queued_publishes=2, max_batch_entries=1)
    async with await DurableQueue.open(tmp_path, A, B.public_key, config=config) as queue:
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(queue.publish, "k", b"%d" % i)
                await trio.lowlevel.checkpoint()
                assert len(queue._queued) <= 2
        assert queue.statistics().published == 10


async def test_deliveries_acks_and_redelivery_after_a_reopen(tmp_path):
    async with await DurableQueue.open(tmp_path / "a", A, B.public_key, config=FAST) as a:
        b = await DurableQueue.open(tmp_path / "b", B, A.public_key, config=FAST)
        for i in range(5):
            await a.publish(f"job-{i % 2}", b"op%d" % i)
        await carry(a, b)
        async with b.deliveries() as receive:
            got = [await receive.receive() for _ in range(3)]
            assert [d.payload for d in got] == [b"op0", b"op1", b"op2"]
            with pytest.raises(QueueError) as ahead:
                await b.ack(4)
            assert ahead.value.code == "ACK_AHEAD"
            await b.ack(2)
            with pytest.raises(QueueError):  # one consumer at a time
                async with b.deliveries():
                    pass
        await carry(a, b)
        assert a.statistics().peer_acked == 2 and a.statistics().pending == 3
        await b.aclose()  # before acking 3: it comes again
        b = await DurableQueue.open(tmp_path / "b", B, A.public_key, config=FAST)
        async with b.deliveries() as receive:
            again = await receive.receive()
            assert (again.position, again.key, again.payload) == (3, "job-0", b"op2")
        # Leaving and entering again also starts over from the last ack.
        async with b.deliveries() as receive:
            assert (await receive.receive()).position == 3
            assert (await receive.receive()).position == 4
            await b.ack(4)
        await b.aclose()


async def test_deliveries_read_back_from_disk_past_the_cache(tmp_path):
    config = QueueConfig(fsync=FsyncPolicy.NEVER, cache_bytes=64, read_batch_entries=7)
    async with (await DurableQueue.open(tmp_path / "a", A, B.public_key, config=config) as a,
                await DurableQueue.open(tmp_path / "b", B, A.public_key, config=config) as b):
        for i in range(50):
            await a.publish("k", b"payload-%03d" % i)
        await carry(a, b)
        async with b.deliveries() as receive:
            got = [await receive.receive() for _ in range(50)]
        assert [d.payload for d in got] == [b"payload-%03d" % i for i in range(50)]
        assert [d.position for d in got] == list(range(1, 51))


async def test_entries_signed_by_another_key_or_for_another_recipient_are_refused(tmp_path):
    b = await DurableQueue.open(tmp_path / "b", B, A.public_key, config=FAST)
    # C publishes to B, and pretends to be A: B's copy of A's log refuses it.
    async with await DurableQueue.open(tmp_path / "c", C, B.public_key, config=FAST) as c:
        await c.publish("k", b"forged")
        entries, head = await c.segment(0, 1 << 20)
        with pytest.raises(BadQueueMessage) as forged:
            await b.ingest(entries, head)
        assert forged.value.code == "BAD_SIGNATURE"
    # A's log to C, replayed to B: signed by A, but not for B.
    async with await DurableQueue.open(tmp_path / "ac", A, C.public_key, config=FAST) as a_to_c:
        await a_to_c.publish("k", b"for C only")
        entries, head = await a_to_c.segment(0, 1 << 20)
        with pytest.raises(BadQueueMessage) as replayed:
            await b.ingest(entries, head)
        assert replayed.value.code == "BAD_SIGNATURE"
    # A database log of A's (same key, other namespace) is no queue log either.
    with WriterLog.open(tmp_path / "db.log", A.public_key, A, fsync=FsyncPolicy.NEVER) as db:
        db.append_batch([encode_entry("k", b"db")])
        entries, head = db.segment(0, 1 << 20)
    with pytest.raises(BadQueueMessage) as other_use:
        await b.ingest(entries, head)
    assert other_use.value.code == "BAD_SIGNATURE"
    # A garbled entry under A's genuine head breaks the chain.
    async with await DurableQueue.open(tmp_path / "a", A, B.public_key, config=FAST) as a:
        await a.publish("k", b"genuine")
        entries, head = await a.segment(0, 1 << 20)
        garbled = [entries[0][:-1] + bytes([entries[0][-1] ^ 1])]
        with pytest.raises(BadQueueMessage) as broken:
            await b.ingest(garbled, head)
        assert broken.value.code == "BAD_CHAIN"
        assert b.received == 0
        await b.ingest(entries, head)
        assert b.received == 1
    await b.aclose()


async def test_close_fails_waiters_and_refuses_more(tmp_path):
    queue = await DurableQueue.open(tmp_path, A, B.public_key, config=FAST)
    results = []

    async def wait_ack():
        try:
            await queue.wait_peer_acked(1)
        except QueueClosed as exc:
            results.append(exc.code)

    async def consume():
        try:
            async with queue.deliveries() as receive:
                await receive.receive()
        except QueueClosed as exc:
            results.append(exc.code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_ack)
        nursery.start_soon(consume)
        await trio.sleep(0.1)
        await queue.aclose()
    assert results == ["QUEUE_CLOSED", "QUEUE_CLOSED"]
    with pytest.raises(QueueClosed):
        await queue.publish("k", b"late")


async def test_a_peer_claiming_more_than_we_published_is_refused(tmp_path):
    async with await DurableQueue.open(tmp_path, A, B.public_key, config=FAST) as queue:
        await queue.publish("k", b"1")
        with pytest.raises(BadQueueMessage) as ahead:
            queue.peer_status(2, 0)
        assert ahead.value.code == "AHEAD"
        queue.peer_status(1, 1)
        queue.peer_status(1, 0)  # an old status never lowers it
        assert queue.statistics().peer_acked == 1
    async with await DurableQueue.open(tmp_path, A, B.public_key, config=FAST) as queue:
        assert queue.statistics().pending == 0  # remembered across a restart


async def test_close_lets_the_append_under_way_finish_and_fails_the_queued(tmp_path):
    queue = await DurableQueue.open(tmp_path, A, B.public_key, config=FAST)
    real = queue._out.write_prepared

    def slow(batch):  # on the writer thread: the append is under way for a while
        time.sleep(0.2)
        return real(batch)

    queue._out.write_prepared = slow
    results = {}

    async def publish(name):
        try:
            results[name] = await queue.publish("k", name.encode())
        except QueueClosed as exc:
            results[name] = exc.code

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(publish, "second")  # queued behind the append under way
        await trio.testing.wait_all_tasks_blocked()
        await queue.aclose()
    assert results == {"first": 1, "second": "QUEUE_CLOSED"}
    with WriterLog.open(tmp_path / "out.log", A.public_key, namespace=head_namespace(
            B.public_key), read_only=True) as out:
        assert list(out.entries()) == [encode_entry("k", b"first")]


async def test_a_cancelled_publisher_does_not_hold_up_the_others(tmp_path):
    async with await DurableQueue.open(tmp_path, A, B.public_key, config=FAST) as queue:
        real = queue._out.write_prepared

        def slow(batch):
            time.sleep(0.05)
            return real(batch)

        queue._out.write_prepared = slow
        results = {}

        async def publish(name, scope=None):
            with scope or trio.CancelScope():
                results[name] = await queue.publish("k", name.encode())

        cancelled = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish, "a")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(publish, "b", cancelled)
            nursery.start_soon(publish, "c")
            await trio.testing.wait_all_tasks_blocked()
            cancelled.cancel()
        # b was cancelled while waiting; its entry went with c's append anyway
        # (b and c start in either order)
        assert results.keys() == {"a", "c"} and results["a"] == 1 and results["c"] in (2, 3)
        assert queue.statistics().published == 3
