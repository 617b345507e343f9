"""wrk-monitor benchmark: log records/s into one monitor, live delivery delay
p50/p99, and the same paced run pushing every record to a Loki.

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
* ``monitor_cpu_us_per_record`` / ``monitor_gc_s``: the monitor process's CPU
  (user + system) per accepted record over the paced run, and its garbage
  collector's seconds then (a fuller ring makes each full collection longer);
  CPU per record moves less with the machine's load than the rates do.
* The same paced run into a second monitor process (after ``--warmup``
  flat-out records with Loki off: its ring then holds as much as the first
  one's, and the Loki figures are of the paced records alone) that also
  hands every accepted record to a ``LokiPusher``
  (default settings, which are the daemon's defaults) through the service's
  ``on_records`` hook with ``to_loki``, as ``serve_monitor`` wires it. Loki is
  the tests' Loki-compatible server (tests/nodes/monitor/loki_server.py,
  hypercorn + starlette; it counts and time-stamps each push and stores
  nothing) in a third process, so that its JSON decoding is not charged to the
  monitor. Printed: ``*_with_loki`` live delivery (to compare with the run
  without Loki), ``loki_records_per_s`` (paced records Loki decoded / paced
  start to Loki's decoding of the last one), ``loki_delay_ms_p50`` / ``_p99``
  (a record's ``time_ns`` to Loki's decoding of its push; the machine's one
  wall clock), and the pusher's counters ``loki_dropped`` / ``loki_failed`` /
  ``loki_rejected`` (0 when Loki keeps up).

Target: >= 50,000 records/s into one wrk-monitor, p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import multiprocessing
import resource
import time

import trio
from _common import ChildServer, emit, machine, percentile

MONITOR_SEED = b"m" * 32
FOLLOWER_SEED = b"f" * 32
#: Bound on every wait for the children (follower catching up, Loki settling, a reply).
WAIT_S = 60.0


def _serve(port_queue, control, replies, loki_url: str | None) -> None:
    """The monitor process; with ``loki_url``, every accepted record also goes to Loki.

    ``control`` takes ``"stats"``: the pusher's counters (none without Loki),
    the process's CPU seconds and its garbage collector's seconds so far are
    put on ``replies`` as a dict; ``"loki on"`` sets the service's hook (then
    answers as ``"stats"``)."""
    from nodes.monitor._buffer import LogBuffer
    from nodes.monitor.daemon import to_loki, tune_gc
    from nodes.monitor.loki import LokiPusher
    from nodes.monitor.service import MonitorService
    from p2p.host import serve_tcp
    from p2p.keys import KeyPair

    gc_time = {"s": 0.0, "started": 0.0, "gen2": 0, "gen2_s": 0.0}

    def gc_timer(phase: str, info: dict) -> None:
        if phase == "start":
            gc_time["started"] = time.perf_counter()
        else:
            took = time.perf_counter() - gc_time["started"]
            gc_time["s"] += took
            if info["generation"] == 2:
                gc_time["gen2"] += 1
                gc_time["gen2_s"] += took

    gc.callbacks.append(gc_timer)
    tune_gc()  # as the daemon's start does

    def stats(pusher: LokiPusher | None) -> dict:
        counters = {} if pusher is None else dataclasses.asdict(pusher.statistics())
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {**counters, "gc_s": gc_time["s"], "gc_gen2": gc_time["gen2"],
                "gc_gen2_s": gc_time["gen2_s"],
                "cpu_s": usage.ru_utime + usage.ru_stime}

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            pusher = None if loki_url is None else LokiPusher(loki_url)
            on_records = None
            if pusher is not None:
                offer_many = pusher.offer_many

                def on_records(records, cursors) -> None:  # ObservabilityHolder.offer's work
                    offer_many(map(to_loki, records, cursors()))

                nursery.start_soon(pusher.run)
            # The hook is set by "loki on", after the warm-up has filled the ring.
            service = MonitorService(LogBuffer(), allow_any_pusher=True,
                                     followers=[KeyPair.from_seed(FOLLOWER_SEED).public_key],
                                     loki=pusher)
            _host, port = await nursery.start(functools.partial(
                serve_tcp, KeyPair.from_seed(MONITOR_SEED), services=[service]))
            port_queue.put(port)
            while (command := await trio.to_thread.run_sync(control.get)) in ("stats", "loki on"):
                if command == "loki on":
                    service.on_records = on_records
                replies.put(stats(pusher))
            nursery.cancel_scope.cancel()

    trio.run(serve)


def _serve_loki(port_queue, control, replies) -> None:
    """The Loki process: counts and time-stamps pushes; ``control`` takes
    ``"arrivals"``: the [(arrival_ns, [ts_ns, ...])] list is put on ``replies``."""
    from tests.nodes.monitor.loki_server import LokiServer, start_loki

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            server = await start_loki(nursery, LokiServer(arrivals=[], keep=False))
            port_queue.put(server.url)
            while await trio.to_thread.run_sync(control.get) == "arrivals":
                replies.put(server.arrivals)
            nursery.cancel_scope.cancel()

    trio.run(serve)


class _Child:
    """A spawned process (``ChildServer``) with a command queue and a reply queue."""

    def __init__(self, target, *args) -> None:
        context = multiprocessing.get_context("spawn")
        self.control, self.replies = context.Queue(), context.Queue()
        self._server = ChildServer(target, self.control, self.replies, *args)

    def __enter__(self):
        return self._server.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._server.__exit__(*exc)

    async def ask(self, command: str):
        self.control.put(command)
        return await trio.to_thread.run_sync(functools.partial(self.replies.get, timeout=WAIT_S))


async def _client(nursery, port: int, seed: bytes | None):
    from contracts.monitor import PROTOCOL
    from p2p.connection import dial_tcp
    from p2p.keys import KeyPair
    from p2p.rpc import RpcClient

    key = KeyPair.from_seed(seed) if seed else KeyPair.generate()
    connection = await dial_tcp("127.0.0.1", port, key, KeyPair.from_seed(MONITOR_SEED).public_key)
    await nursery.start(connection.run)
    client = RpcClient(await connection.open_channel(PROTOCOL))
    await nursery.start(client.run)
    return client


async def _measure(monitor: _Child, port: int, total: int, in_flight: int, rate: int,
                   seconds: float):
    """Flat out (``total`` records, the warm-up too), then paced at ``rate`` for ``seconds``;
    ``monitor``'s CPU and GC seconds over the paced run."""
    from contracts.health import STATUS, StatusRequest
    from contracts.monitor import FOLLOW, PUSH, Follow, PushBatch, decode_batch, encode_batch
    from contracts.monitor import LogRecord as R
    from p2p.rpc import RpcError
    from runtime.log_shipper import LogShipper

    text = "GET /v1/completions 200 12.3 ms " * 3
    results: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        follower = await _client(nursery, port, FOLLOWER_SEED)
        pusher = await _client(nursery, port, None)
        delays: list[float] = []
        state = {"got": 0, "target": total, "first": 0.0, "last": 0.0, "lagged": 0}
        done = trio.Event()

        async def follow() -> None:
            try:
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
            except RpcError as exc:  # cut off: the figures are then of what it received
                if exc.code != "LAGGED":
                    raise
                state["lagged"] = 1
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
        results["flat_out_records"] = total // 500 // in_flight * in_flight * 500
        results["flat_out"] = results["flat_out_records"] / (time.perf_counter() - began)
        nursery.start_soon(follow)

        # Paced through a LogShipper at ``rate``, once the follower is attached
        # (a fixed pause could end before it is on a starved machine).
        for _ in range(int(WAIT_S / 0.05)):
            status = await follower.call(STATUS, StatusRequest())
            if status.details.get("followers", 0) >= 1:
                break
            await trio.sleep(0.05)
        else:
            raise RuntimeError(f"the follower did not attach within {WAIT_S} s")
        delays.clear()
        state["got"] = 0
        state["last"] = 0.0
        done = trio.Event()
        paced = int(rate * seconds)
        state["target"] = paced
        shipper = LogShipper(max_records=max(100_000, rate))
        results["ship_restarts"] = 0
        ship_scope = trio.CancelScope()

        async def ship() -> None:
            # ship() returns when a push fails (a timeout on a starved machine):
            # a daemon's run() would ship again on a new connection; here, on this one.
            with ship_scope:
                while True:
                    await shipper.ship(pusher)
                    results["ship_restarts"] += 1
                    await trio.sleep(0.01)

        before = await monitor.ask("loki on")
        nursery.start_soon(ship)
        start = time.perf_counter()
        results["start_ns"] = time.time_ns()
        offered = 0
        while offered < paced:
            due = min(paced, int((time.perf_counter() - start) * rate))
            for _ in range(due - offered):
                shipper.offer(R(time.time_ns(), "j-1", 0, "Application", 20, "bench", text))
            offered = due
            await trio.sleep(0.001)
        with trio.move_on_after(WAIT_S):
            # All offered came, or all the shipper did not drop once it is drained.
            while not done.is_set():
                if not shipper.pending and state["got"] >= paced - shipper.dropped:
                    state["last"] = time.perf_counter()
                    break
                await trio.sleep(0.01)
        if not state["last"]:  # figures of what came; ``follower_missing`` says how much did not
            state["last"] = time.perf_counter()
        for _ in range(500):  # the last push's answer (5 s at most)
            if shipper.sent + shipper.dropped >= paced:
                break
            await trio.sleep(0.01)
        after = await monitor.ask("stats")
        results["cpu_s"] = after["cpu_s"] - before["cpu_s"]
        results["gc_s"] = after["gc_s"] - before["gc_s"]
        results["gc_gen2"] = after["gc_gen2"] - before["gc_gen2"]
        results["gc_gen2_s"] = after["gc_gen2_s"] - before["gc_gen2_s"]
        results["paced"] = paced
        results["accepted"] = results["flat_out_records"] + shipper.sent
        results["paced_rate"] = state["got"] / (state["last"] - start)
        results["lagged"] = state["lagged"]
        results["missing"] = paced - state["got"]
        results["p50"] = percentile(delays, 0.5)
        results["p99"] = percentile(delays, 0.99)
        results["shipper_dropped"] = shipper.dropped
        ship_scope.cancel()
        nursery.cancel_scope.cancel()
    return results


async def _loki_figures(monitor: _Child, loki: _Child, r: dict[str, float]) -> dict[str, float]:
    """Wait (bounded) until the pusher has settled every record, then Loki's figures
    for the paced records (those with ``time_ns >= start_ns``)."""
    expected = r["accepted"] - r["flat_out_records"]  # Loki is on from the paced run
    with trio.move_on_after(WAIT_S):
        while True:
            stats = await monitor.ask("stats")
            settled = stats["pushed"] + stats["failed"] + stats["dropped"] + stats["rejected"]
            if settled >= expected:
                break
            await trio.sleep(0.1)
    stats = await monitor.ask("stats")
    start_ns = r["start_ns"]
    delays: list[float] = []
    last_ns = start_ns
    for arrival_ns, stamps in await loki.ask("arrivals"):
        paced = [ts for ts in stamps if ts >= start_ns]
        if paced:
            last_ns = max(last_ns, arrival_ns)
            delays.extend((arrival_ns - ts) / 1e6 for ts in paced)
    return {
        "received": len(delays),
        "rate": len(delays) / max(1e-9, (last_ns - start_ns) / 1e9),
        "p50": percentile(delays, 0.5) if delays else float("nan"),
        "p99": percentile(delays, 0.99) if delays else float("nan"),
        **{key: stats[key] for key in ("failed", "dropped", "rejected", "retries", "buffered")},
    }


def _emit_cpu(r: dict[str, float], suffix: str) -> None:
    """The monitor process's CPU per record over the paced run (what load does not
    change much, unlike the rates), and its garbage collector's share of it."""
    accepted = max(1.0, r["accepted"] - r["flat_out_records"])
    emit("monitor", f"monitor_cpu_us_per_record{suffix}", r["cpu_s"] / accepted * 1e6, "us",
         cpu_s=round(r["cpu_s"], 3), records=int(accepted))
    emit("monitor", f"monitor_gc_s{suffix}", r["gc_s"], "s", gen2_collections=r["gc_gen2"],
         gen2_s=round(r["gc_gen2_s"], 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000, help="flat-out records")
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--rate", type=int, default=50_000, help="paced records/s")
    parser.add_argument("--seconds", type=float, default=5.0, help="paced duration")
    parser.add_argument("--warmup", type=int, default=None,
                        help="flat-out records into the Loki run's monitor, Loki off, before "
                             "its paced run (default --records: the ring then holds as much "
                             "as in the run without Loki)")
    parser.add_argument("--no-loki", action="store_true", help="skip the run with Loki")
    args = parser.parse_args()
    monitor = _Child(_serve, None)
    with monitor as port:
        r = trio.run(_measure, monitor, port, args.records, args.in_flight, args.rate,
                     args.seconds)
    how = ("monitor in a spawned process, serve_tcp on 127.0.0.1; senders and one follower "
           "in this process; 500-record pushes, ~100-char texts")
    emit("monitor", "records_per_s_flat_out", r["flat_out"], "records/s",
         in_flight=args.in_flight, how=how, machine=machine())
    emit("monitor", "records_per_s_paced", r["paced_rate"], "records/s", target=args.rate)
    emit("monitor", "delivery_ms_p50", r["p50"], "ms", rate=args.rate)
    emit("monitor", "delivery_ms_p99", r["p99"], "ms", rate=args.rate)
    emit("monitor", "shipper_dropped", r["shipper_dropped"], "records")
    emit("monitor", "follower_lagged", r["lagged"], "runs")
    emit("monitor", "follower_missing", r["missing"], "records")
    emit("monitor", "shipper_restarts", r["ship_restarts"], "pushes failed")
    _emit_cpu(r, "")
    if args.no_loki:
        return
    loki = _Child(_serve_loki)
    with loki as url:
        monitor = _Child(_serve, url)
        with monitor as port:
            warmup = args.records if args.warmup is None else args.warmup
            r = trio.run(_measure, monitor, port, warmup, args.in_flight, args.rate,
                         args.seconds)
            k = trio.run(_loki_figures, monitor, loki, r)
    how = ("a second monitor process also pushing every accepted record to Loki (LokiPusher "
           "defaults, to_loki in on_records, as serve_monitor); Loki: "
           "tests/nodes/monitor/loki_server.py in a third process, counting only")
    emit("monitor", "records_per_s_paced_with_loki", r["paced_rate"], "records/s",
         target=args.rate, how=how)
    emit("monitor", "delivery_ms_p50_with_loki", r["p50"], "ms", rate=args.rate)
    emit("monitor", "delivery_ms_p99_with_loki", r["p99"], "ms", rate=args.rate)
    emit("monitor", "shipper_dropped_with_loki", r["shipper_dropped"], "records")
    emit("monitor", "follower_lagged_with_loki", r["lagged"], "runs")
    emit("monitor", "follower_missing_with_loki", r["missing"], "records")
    emit("monitor", "shipper_restarts_with_loki", r["ship_restarts"], "pushes failed")
    _emit_cpu(r, "_with_loki")
    emit("monitor", "loki_records_per_s", k["rate"], "records/s", target=args.rate,
         received=k["received"], paced=r["paced"])
    emit("monitor", "loki_delay_ms_p50", k["p50"], "ms", rate=args.rate)
    emit("monitor", "loki_delay_ms_p99", k["p99"], "ms", rate=args.rate)
    for key in ("dropped", "failed", "rejected", "buffered"):
        emit("monitor", f"loki_{key}", k[key], "records")
    emit("monitor", "loki_retries", k["retries"], "pushes")


if __name__ == "__main__":
    main()
