"""wrk-monitor benchmark: log records/s into one monitor, live delivery delay p50/p99.

The monitor (``MonitorService`` over a ``LogBuffer``, as the daemon will serve
it) runs in a spawned process behind ``serve_tcp`` on 127.0.0.1 (secret stream
+ mux + RPC). This process runs the senders and one follower (``logs.follow``,
all records), each on its own connection:

* ``records_per_s_flat_out``: pushes of 500 records, ``--in-flight`` at once,
  as fast as they are answered (acknowledged records/s; no follower then: one
  follower in this process cannot take them that fast and is cut off with
  LAGGED, as designed).
* ``delivery_ms_p50`` / ``_p99`` at ``--rate`` records/s (the issue's 50,000):
  records offered to a ``LogShipper`` in steps of 1 ms, shipped as a daemon
  will; the delay is from each record's ``time_ns`` (set when it is offered) to
  its decoding by the follower, on one clock (same process).

Issue 14's target: >= 50,000 records/s into one wrk-monitor, p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import functools
import time

import trio
from _common import ChildServer, emit, machine, percentile

MONITOR_SEED = b"m" * 32
FOLLOWER_SEED = b"f" * 32


def _serve(port_queue) -> None:
    from nodes.monitor._buffer import LogBuffer
    from nodes.monitor.service import MonitorService
    from p2p.host import serve_tcp
    from p2p.keys import KeyPair

    service = MonitorService(LogBuffer(), allow_any_pusher=True,
                             followers=[KeyPair.from_seed(FOLLOWER_SEED).public_key])

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            _host, port = await nursery.start(functools.partial(
                serve_tcp, KeyPair.from_seed(MONITOR_SEED), services=[service]))
            port_queue.put(port)

    trio.run(main)


async def _client(nursery, port: int, seed: bytes | None):
    from contracts.telemetry import PROTOCOL
    from p2p.connection import dial_tcp
    from p2p.keys import KeyPair
    from p2p.rpc import RpcClient

    key = KeyPair.from_seed(seed) if seed else KeyPair.generate()
    connection = await dial_tcp("127.0.0.1", port, key, KeyPair.from_seed(MONITOR_SEED).public_key)
    await nursery.start(connection.run)
    client = RpcClient(await connection.open_channel(PROTOCOL))
    await nursery.start(client.run)
    return client


async def _measure(port: int, total: int, in_flight: int, rate: int, seconds: float):
    from contracts.log_shipper import LogShipper
    from contracts.telemetry import FOLLOW, PUSH, Follow, PushBatch, decode_batch, encode_batch
    from contracts.telemetry import LogRecord as R

    text = "GET /v1/completions 200 12.3 ms " * 3
    results: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        follower = await _client(nursery, port, FOLLOWER_SEED)
        pusher = await _client(nursery, port, None)
        delays: list[float] = []
        state = {"got": 0, "target": total, "first": 0.0, "last": 0.0}
        done = trio.Event()

        async def follow() -> None:
            async with follower.stream(FOLLOW, Follow(snapshot=False)) as items:
                async for item in items:
                    now = time.time_ns()
                    records = decode_batch(item.records)
                    if not state["got"]:
                        state["first"] = time.perf_counter()
                    state["got"] += len(records)
                    delays.extend((now - r.time_ns) / 1e6 for r in records[::10])
                    if state["got"] >= state["target"]:
                        state["last"] = time.perf_counter()
                        done.set()

        # Flat out: pre-encoded batches (the senders' encoding is not what we measure).
        batch = PushBatch(records=encode_batch(
            [R(time.time_ns(), "j-1", 0, "System", 20, "bench", text) for _ in range(500)]))

        async def push_loop(count: int) -> None:
            for _ in range(count):
                await pusher.call(PUSH, batch)

        began = time.perf_counter()
        async with trio.open_nursery() as senders:
            for _ in range(in_flight):
                senders.start_soon(push_loop, total // 500 // in_flight)
        results["flat_out"] = total // 500 // in_flight * in_flight * 500 / (
            time.perf_counter() - began)
        nursery.start_soon(follow)

        # Paced through a LogShipper at ``rate``.
        await trio.sleep(0.5)
        delays.clear()
        state["got"] = 0
        done = trio.Event()
        paced = int(rate * seconds)
        state["target"] = paced
        shipper = LogShipper(max_records=max(100_000, rate))
        ship_scope = trio.CancelScope()

        async def ship() -> None:
            with ship_scope:
                await shipper.ship(pusher)

        nursery.start_soon(ship)
        start = time.perf_counter()
        offered = 0
        while offered < paced:
            due = min(paced, int((time.perf_counter() - start) * rate))
            for _ in range(due - offered):
                shipper.offer(R(time.time_ns(), "j-1", 0, "Application", 20, "bench", text))
            offered = due
            await trio.sleep(0.001)
        with trio.fail_after(60):
            await done.wait()
        results["paced_rate"] = paced / (state["last"] - start)
        results["p50"] = percentile(delays, 0.5)
        results["p99"] = percentile(delays, 0.99)
        results["shipper_dropped"] = shipper.dropped
        ship_scope.cancel()
        nursery.cancel_scope.cancel()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000, help="flat-out records")
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--rate", type=int, default=50_000, help="paced records/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="paced duration")
    args = parser.parse_args()
    with ChildServer(_serve) as port:
        r = trio.run(_measure, port, args.records, args.in_flight, args.rate, args.seconds)
    how = ("monitor in a spawned process, serve_tcp on 127.0.0.1; senders and one follower "
           "in this process; 500-record pushes, ~100-char texts")
    emit("monitor", "records_per_s_flat_out", r["flat_out"], "records/s",
         in_flight=args.in_flight, how=how, machine=machine())
    emit("monitor", "records_per_s_paced", r["paced_rate"], "records/s", target=args.rate)
    emit("monitor", "delivery_ms_p50", r["p50"], "ms", rate=args.rate)
    emit("monitor", "delivery_ms_p99", r["p99"], "ms", rate=args.rate)
    emit("monitor", "shipper_dropped", r["shipper_dropped"], "records")


if __name__ == "__main__":
    main()
