"""LogShipper: offer never blocks and drops the oldest beyond its bound; records
wait while wrk-monitor is down and are delivered, in order, when it is back; a
refused batch does not wedge the queue; the logging handler makes System records."""

from __future__ import annotations

import logging

import trio
import trio.testing

from contracts.monitor import make_record
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.service import MonitorService
from runtime.log_shipper import LogShipper, ShipperHandler
from tests.nodes.monitor.support import DAEMON, STRANGER, connect


def rec(i: int):
    return make_record(f"line {i}", service="wrk-ork", job_id="j-1", time_ns=i)


async def until(condition, step: float = 0.01, limit: int = 10_000) -> None:
    """Wait (in virtual time) for ``condition``, at most ``limit`` steps."""
    for _ in range(limit):
        if condition():
            return
        await trio.sleep(step)
    raise AssertionError("condition never held")


def times(service: MonitorService) -> list[int]:
    return [r.time_ns for _, r in service.buffer.records()]


def test_offer_drops_the_oldest_beyond_the_bound():
    shipper = LogShipper(max_records=10)
    for i in range(25):
        shipper.offer(rec(i))
    assert shipper.pending == 10 and shipper.dropped == 15
    assert [r.time_ns for r in shipper._take()] == list(range(15, 25))


def test_put_back_keeps_the_newest_within_the_bound():
    shipper = LogShipper(max_records=10, batch_records=5)
    for i in range(8):
        shipper.offer(rec(i))
    batch = shipper._take()  # 0..4 in flight, 5..7 queued
    for i in range(8, 13):
        shipper.offer(rec(i))  # queue 5..12: 8 records
    shipper._put_back(batch)  # room for 2 of 0..4: the newest two
    assert shipper.dropped == 3
    assert [r.time_ns for r in shipper._take() + shipper._take()] == [3, 4, *range(5, 13)]


def test_offer_many_keeps_order_and_drops_the_oldest_beyond_the_bound():
    shipper = LogShipper(max_records=10)
    shipper.offer_many([rec(i) for i in range(4)])
    shipper.offer_many(rec(i) for i in range(4, 8))  # any iterable
    assert shipper.pending == 8 and shipper.dropped == 0
    shipper.offer_many([rec(i) for i in range(8, 13)])  # 0..2 go
    assert shipper.dropped == 3
    shipper.offer_many([rec(i) for i in range(13, 40)])  # more than the bound at once
    assert shipper.pending == 10 and shipper.dropped == 30
    assert [r.time_ns for r in shipper._take()] == list(range(30, 40))
    shipper.offer_many([])
    assert shipper.pending == 0 and shipper.dropped == 30


async def test_records_wait_while_the_monitor_is_down_then_arrive_in_order(nursery,
                                                                      autojump_clock):
    service = MonitorService(LogBuffer(), pushers=[DAEMON])
    shipper = LogShipper(max_records=100, batch_records=30)
    for i in range(150):  # the monitor is down: nothing is sent, the oldest 50 go
        shipper.offer(rec(i))
    assert shipper.dropped == 50
    with trio.fail_after(30):
        async with connect(nursery, service, DAEMON) as client, trio.open_nursery() as inner:
            inner.start_soon(shipper.ship, client)
            await until(lambda: shipper.sent >= 100, 0.01)
            assert shipper.connected
            shipper.offer(rec(150))
            before = trio.current_time()
            await until(lambda: shipper.sent >= 101, 0.001)
            assert trio.current_time() - before <= 0.05  # a partial batch flushes soon
            inner.cancel_scope.cancel()
        assert times(service) == list(range(50, 151))
        # The monitor went away: the shipper's call fails, the batch is kept.
        for i in range(151, 160):
            shipper.offer(rec(i))
        await shipper.ship(client)  # the closed client: returns at once
        assert shipper.pending == 9 and not shipper.connected
        async with connect(nursery, service, DAEMON) as client, trio.open_nursery() as inner:
            inner.start_soon(shipper.ship, client)
            await until(lambda: shipper.sent >= 110, 0.01)
            inner.cancel_scope.cancel()
        assert times(service) == list(range(50, 160))
        assert shipper.dropped == 50


class _HangingClient:
    """An RPC client whose push is never answered (a monitor that went quiet)."""

    def __init__(self) -> None:
        self.calls = 0

    async def call(self, method, params, *, timeout_s=None):
        self.calls += 1
        await trio.sleep_forever()


async def test_a_push_cancelled_in_flight_keeps_its_records(autojump_clock):
    shipper = LogShipper(max_records=100, batch_records=10)
    for i in range(25):
        shipper.offer(rec(i))
    client = _HangingClient()
    with trio.move_on_after(5):  # the session ends while the first push is in flight
        await shipper.ship(client)
    assert client.calls == 1
    assert shipper.pending == 25 and shipper.dropped == 0 and not shipper.connected
    assert [r.time_ns for r in shipper._take() + shipper._take() + shipper._take()] \
        == list(range(25))


class _AcceptingClient:
    """An RPC client whose pushes are all accepted (the records they carried kept)."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []

    async def call(self, method, params, *, timeout_s=None):
        from contracts.monitor import PushResult, decode_batch

        self.batches.append(params.records)
        return PushResult(accepted=len(decode_batch(params.records)))


async def test_a_record_msgpack_cannot_encode_costs_its_batch_not_the_shipper(autojump_clock):
    from contracts.monitor import LogRecord

    shipper = LogShipper(batch_records=2)
    bad = LogRecord(1, None, None, "System", 20, "x", "lone \udcff surrogate")  # not make_record's
    for record in (rec(0), bad, rec(2), rec(3)):
        shipper.offer(record)
    client = _AcceptingClient()
    with trio.move_on_after(1):
        await shipper.ship(client)
    assert shipper.refused == 2 and shipper.sent == 2 and shipper.pending == 0
    assert len(client.batches) == 1


async def test_an_idle_shipper_runs_no_timer_and_a_record_from_any_thread_wakes_it(nursery):
    # Real clock: the wake from another thread goes through the run's TrioToken.
    shipper = LogShipper(flush_interval_s=0.01)
    client = _AcceptingClient()
    nursery.start_soon(shipper.ship, client)
    await until(lambda: shipper._idle, 0.001)  # bounded by its step count
    await trio.testing.wait_all_tasks_blocked()
    # Nothing queued: the shipper waits with no deadline at all in the run.
    assert trio.lowlevel.current_statistics().seconds_to_next_deadline == float("inf")
    with trio.fail_after(30):
        await trio.to_thread.run_sync(shipper.offer, rec(0))
        await until(lambda: shipper.sent == 1, 0.001)
        shipper.offer(rec(1))  # from the trio thread
        await until(lambda: shipper.sent == 2, 0.001)
        await trio.to_thread.run_sync(shipper.offer_many, [rec(2), rec(3)])
        await until(lambda: shipper.sent == 4, 0.001)
    assert shipper.pending == 0 and len(client.batches) == 3
    nursery.cancel_scope.cancel()


async def test_a_refused_batch_is_dropped_and_counted_not_retried(nursery, autojump_clock):
    service = MonitorService(LogBuffer(), pushers=[DAEMON])
    shipper = LogShipper()
    for i in range(20):
        shipper.offer(rec(i))
    with trio.fail_after(10):
        async with connect(nursery, service, STRANGER) as client, trio.open_nursery() as inner:
            inner.start_soon(shipper.ship, client)
            await until(lambda: shipper.refused >= 20, 0.01)
            inner.cancel_scope.cancel()
    assert shipper.pending == 0 and shipper.sent == 0


def test_the_logging_handler_makes_system_records_with_the_job():
    shipper = LogShipper()
    logger = logging.getLogger("tests.monitor.handler")
    logger.propagate = False
    handler = ShipperHandler(shipper, service="wrk-ork")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        logger.debug("not at INFO")
        logger.warning("placed job=%s", "j-9", extra={"job_id": "j-9", "replica": 2})
        logger.info("x" * 20_000)
        logger.info("bad extras", extra={"job_id": 5, "replica": -1})
    finally:
        logger.removeHandler(handler)
    got = shipper._take()
    assert [(r.job_id, r.replica, r.level, r.source, r.service) for r in got] == [
        ("j-9", 2, logging.WARNING, "System", "wrk-ork"),
        (None, None, logging.INFO, "System", "wrk-ork"),
        (None, None, logging.INFO, "System", "wrk-ork")]
    assert got[0].text == "placed job=j-9" and got[1].text.endswith("[cut]")


async def test_run_keeps_shipping_across_a_monitor_restart_over_a_swarm(autojump_clock):
    from p2p.keys import KeyPair
    from p2p.swarm import UpkeepPolicy
    from tests.p2p.swarm.helpers import FAST_STREAMS, memory_swarm_net

    monitor_key = KeyPair.generate()
    service = MonitorService(LogBuffer(), allow_any_pusher=True)
    shipper = LogShipper(max_records=1000, retry_s=0.2)
    quick = UpkeepPolicy(base_s=0.1, max_s=1.0, proven_after_s=2.0, dial_timeout_s=3.0)
    with trio.fail_after(60):
        async with memory_swarm_net() as net:
            monitor = await net.start(monitor_key, connection=FAST_STREAMS, services=[service])
            daemon = await net.start(connection=FAST_STREAMS)
            await net.nursery.start(lambda task_status: shipper.run(
                daemon, monitor_key.public_key, backoff=quick, task_status=task_status))
            for i in range(10):
                shipper.offer(rec(i))
            await until(lambda: shipper.sent >= 10)
            net.stop(monitor)
            await until(lambda: monitor_key.public_key not in daemon.connections)
            for i in range(10, 1500):  # down: the oldest beyond 1,000 go
                shipper.offer(rec(i))
            await trio.sleep(3.0)
            assert shipper.pending == 1000 and shipper.dropped == 490
            await net.start(monitor_key, connection=FAST_STREAMS, services=[service])
            await until(lambda: shipper.sent >= 1010)
            assert times(service) == [*range(10), *range(500, 1500)]
