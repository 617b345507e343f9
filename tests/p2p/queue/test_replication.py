"""Two queue ends on two swarms of a MemoryInternet, under the virtual clock."""

from __future__ import annotations

import logging

import pytest
import trio

from p2p.keys import KeyPair
from p2p.queue import PROTOCOL
from p2p.queue._messages import decode_message, encode_entries, encode_entry
from tests.p2p.helpers import wait_until
from tests.p2p.queue.helpers import drain, mock_clock, two_ends
from tests.p2p.swarm.helpers import memory_swarm_net


@pytest.fixture
def clock():
    return mock_clock()


async def test_both_ways_in_order_with_acks_back(tmp_path):
    """wrk-ork publishes operations of several jobs from many tasks while the
    worker publishes reports back: each side gets the other's in log order
    (so every job's in its order) and learns the other's acks."""
    with trio.fail_after(60):
        async with memory_swarm_net() as net, two_ends(net, tmp_path) as (a, b):
            published: dict[int, tuple[str, bytes]] = {}

            async def publisher(end, job):
                for i in range(30):
                    key, payload = f"job-{job}", b"%d" % i
                    published[id(end), await end.queue.publish(key, payload)] = (key, payload)

            async with trio.open_nursery() as nursery:
                for job in range(6):
                    nursery.start_soon(publisher, a, job)
                nursery.start_soon(publisher, b, 99)
                got_b = await drain(b.queue, 180)
                got_a = await drain(a.queue, 30)
            assert [d.position for d in got_b] == list(range(1, 181))
            for d in got_b:
                assert published[id(a), d.position] == (d.key, d.payload)
            for job in range(6):
                ops = [int(d.payload) for d in got_b if d.key == f"job-{job}"]
                assert ops == list(range(30))
            assert [int(d.payload) for d in got_a] == list(range(30))
            await a.queue.wait_peer_acked(180)
            await b.queue.wait_peer_acked(30)
            stats = a.queue.statistics()
            assert (stats.published, stats.peer_acked, stats.pending) == (180, 180, 0)
            assert (stats.received, stats.acked, stats.connected) == (30, 30, True)
            assert stats.last_heard is not None


async def test_a_consumer_restarted_before_acking_gets_the_same_operations_again(tmp_path):
    with trio.fail_after(60):
        async with memory_swarm_net() as net, two_ends(net, tmp_path) as (a, b):
            for i in range(4):
                await a.queue.publish("job", b"op%d" % i)
            first = await drain(b.queue, 3, ack=False)
            await b.queue.ack(1)
            await b.reopen(a.keypair.public_key)  # "crash" with 2 and 3 delivered, unacked
            again = await drain(b.queue, 3)
            assert [(d.position, d.payload) for d in again] == [
                (2, b"op1"), (3, b"op2"), (4, b"op3")]
            assert again[:2] == first[1:]
            await a.queue.wait_peer_acked(4)


async def test_a_publisher_restarted_mid_stream_loses_nothing(tmp_path):
    with trio.fail_after(60):
        async with memory_swarm_net() as net, two_ends(net, tmp_path) as (a, b):
            async with trio.open_nursery() as nursery:
                got = []

                async def consume():
                    got.extend(await drain(b.queue, 100))

                nursery.start_soon(consume)
                for i in range(50):
                    await a.queue.publish("job", b"%d" % i)
                await a.reopen(b.keypair.public_key)
                assert a.queue.statistics().published == 50
                for i in range(50, 100):
                    await a.queue.publish("job", b"%d" % i)
            assert [int(d.payload) for d in got] == list(range(100))
            await a.queue.wait_peer_acked(100)


async def test_a_lost_connection_resumes_where_it_stopped(tmp_path):
    with trio.fail_after(60):
        async with memory_swarm_net() as net, two_ends(net, tmp_path) as (a, b):
            for i in range(10):
                await a.queue.publish("job", b"%d" % i)
            await drain(b.queue, 10)
            await a.queue.wait_peer_acked(10)
            await a.swarm.connections[b.keypair.public_key].aclose()
            await wait_until(lambda: not a.queue.statistics().connected
                             and not b.queue.statistics().connected)
            for i in range(10, 20):
                await a.queue.publish("job", b"%d" % i)
            assert a.queue.statistics().pending == 10
            await b.swarm.connect(a.keypair.public_key, addresses=[a.swarm.address])
            got = await drain(b.queue, 10)
            assert [int(d.payload) for d in got] == list(range(10, 20))
            await a.queue.wait_peer_acked(20)


async def test_a_queue_attached_after_the_connection_starts_replicating(tmp_path):
    with trio.fail_after(60):
        async with memory_swarm_net() as net, two_ends(net, tmp_path) as (a, b):
            peer = a.keypair.public_key
            b.service.detach(peer)
            await b.queue.aclose()
            b.queue = None
            await a.queue.publish("job", b"while the worker had no queue")
            await trio.sleep(1.0)
            await b.reopen(peer)
            got = await drain(b.queue, 1)
            assert got[0].payload == b"while the worker had no queue"


async def test_forged_or_garbled_entries_end_the_channel_and_store_nothing(tmp_path, caplog):
    """Mallory has a queue attached at b (b expects operations from her), and
    sends entries signed by another key, then bytes that are no message: b
    ends each channel, stores nothing, and goes on serving a."""
    caplog.set_level(logging.WARNING, logger="p2p.queue")
    with trio.fail_after(60):
        async with memory_swarm_net() as net, two_ends(net, tmp_path) as (a, b):
            mallory = KeyPair.generate()
            evil = await net.start(mallory)
            from p2p.queue import DurableQueue
            from tests.p2p.queue.helpers import FAST
            from_mallory = await DurableQueue.open(tmp_path / "m", b.keypair, mallory.public_key,
                                                   config=FAST)
            b.service.attach(from_mallory)
            # Genuine entries of another writer's queue to b (a's), under Mallory's name.
            await a.queue.publish("job", b"a's operation")
            entries, head = await a.queue.segment(0, 1 << 20)
            connection = await evil.connect(b.keypair.public_key, addresses=[b.swarm.address])
            for bad in (encode_entries(0, entries, head), b"\xc1garbage",
                        encode_entries(5, [encode_entry("k", b"x")], None)):
                channel = await connection.open_channel(PROTOCOL, mallory.public_key)
                status = decode_message(await channel.receive())
                assert (status.have, status.acked) == (0, 0)
                await channel.send(bad)
                with pytest.raises((trio.EndOfChannel, trio.BrokenResourceError)):
                    await channel.receive()
                await channel.aclose()
            assert from_mallory.statistics().received == 0
            codes = [r.message for r in caplog.records if "queue.bad_peer" in r.message]
            assert len(codes) == 3
            assert "BAD_SIGNATURE" in codes[0] and "DECODE_ERROR" in codes[1]
            assert "GAP" in codes[2]
            # A channel under someone else's id, or from a key with no queue, is refused.
            channel = await connection.open_channel(PROTOCOL, a.keypair.public_key)
            with pytest.raises((trio.EndOfChannel, trio.BrokenResourceError)):
                await channel.receive()
            b.service.detach(mallory.public_key)
            channel = await connection.open_channel(PROTOCOL, mallory.public_key)
            with pytest.raises((trio.EndOfChannel, trio.BrokenResourceError)):
                await channel.receive()
            # b goes on: a's operation arrives.
            got = await drain(b.queue, 1)
            assert got[0].payload == b"a's operation"
            await from_mallory.aclose()
