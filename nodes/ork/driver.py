"""wrk-ork's trio driver: the orchestrator core on one side, the racks' queues on the other.

The :class:`~nodes.ork.orchestrator.Orchestrator` decides and records (in its
SQLite file, with an outbox of operations in the same transaction); this
driver does the I/O:

* every orchestrator call runs in a worker thread, one at a time (SQLite is
  the hot path and must not block the loop; the core is not thread-safe);
* one durable queue per registered rack (``<storage>/queues/<rack-key>``),
  attached to the daemon's queue service, opened when a rack is registered
  and closed when it is removed;
* the outbox is published on the racks' queues and marked published only once
  the queue holds it durably; after a crash the unmarked ones are published
  again under the same op ids, which the worker recognises;
* each rack's reports are applied with their queue position (saved with the
  state change) and acked; a position already applied is skipped, so a
  redelivery after an ork restart changes nothing;
* a tick marks silent racks Unknown and places Pending jobs. It is armed from
  the orchestrator's ``next_deadline()`` (when the next rack goes silent) and
  runs sooner only after a change (a report, an RPC that changed something),
  at most once per ``tick_interval_s``: an idle wrk-ork sleeps until a rack
  may fall silent, and a busy one does not tick after every call;
* after each change the service's ``pump`` hands the status changes to the
  ``jobs.watch`` streams.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import trio

from contracts.operations import BadMessage, SetShellKeys, decode_report, encode
from nodes.kit.metrics import Family, Snapshot
from p2p.keys import KeyPair
from p2p.log import FsyncPolicy
from p2p.queue import DurableQueue, QueueConfig, QueueService

from .orchestrator import Orchestrator
from .steps import nodes_text

__all__ = ["OrkDriver"]

log = logging.getLogger(__name__)

#: An operation as its System line names it.
_VERB = {"create_replica": "create", "restart_replica": "restart", "delete_replica": "delete"}

T = TypeVar("T")

#: How a blocking orchestrator call runs: ``run(function, limiter)``; in a worker
#: thread (:func:`in_thread`), one at a time under ``limiter``.
Runner = Callable[[Callable[[], T], trio.CapacityLimiter], Awaitable[T]]


async def in_thread(function: Callable[[], T], limiter: trio.CapacityLimiter) -> T:
    """Run ``function`` in a worker thread once ``limiter`` lets it (the default runner)."""
    return await trio.to_thread.run_sync(function, limiter=limiter)


class OrkDriver:
    """Runs the orchestrator's I/O: queues, outbox, reports, ticks, watchers.

    Args:
        tick_interval_s: the least time between two ticks; a change is picked up
            by a tick at most this long after the one before.
        clock: the orchestrator's time (seconds; wall clock).
        run: how blocking orchestrator calls run (tests pass one that runs them
            inline, so trio's autojump clock never jumps while a thread works).
    """

    def __init__(self, orchestrator: Orchestrator, queues: QueueService, keypair: KeyPair,
                 storage: Path, *, fsync: bool = True, tick_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.time,
                 pump: Callable[[], None] = lambda: None, run: Runner = in_thread) -> None:
        self.orchestrator = orchestrator
        self.queues = queues
        self._keypair = keypair
        self._storage = storage
        self._fsync = FsyncPolicy.ALWAYS if fsync else FsyncPolicy.NEVER
        self._tick_interval_s = tick_interval_s
        self._clock = clock
        self._run = run
        #: Every orchestrator call, from here or the RPC service, holds it.
        self.limiter = trio.CapacityLimiter(1)
        self._open: dict[str, tuple[DurableQueue, trio.CancelScope]] = {}
        self._changed = trio.Event()
        #: Set by a change: the tick loop ticks again (its own tick sets only ``_changed``).
        self._tick_wanted = trio.Event()
        self._pump = pump
        #: The orchestrator's families, measured after every tick.
        self._measured = Snapshot()
        self._nursery: trio.Nursery | None = None
        self.bad_reports = 0

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one orchestrator call in a thread, serialised; wake the publisher after."""
        try:
            return await self._run(lambda: function(*args, **kwargs), self.limiter)
        finally:
            self.changed()

    async def read(self, function: Callable[..., T], *args: Any) -> T:
        """Run one orchestrator read in a thread, serialised; wakes nobody.

        The publisher's own reads go through here: through :meth:`call` they
        would wake it again at once, a busy loop walking every job.
        """
        return await self._run(lambda: function(*args), self.limiter)

    def changed(self) -> None:
        """Something may have queued operations, status changes or freed capacity:
        publish them, and tick (Pending jobs may fit now)."""
        self._changed.set()
        self._tick_wanted.set()

    @property
    def snapshot(self) -> Snapshot:
        """What the metrics show: the orchestrator's families as of the last tick,
        and the racks' queues as they are now (trio objects, read at the scrape)."""
        queues = {rack: queue.statistics() for rack, (queue, _) in self._open.items()}
        return Snapshot({
            **self._measured.families,
            "ork_queue_unacked": Family("Operations a rack's worker has not applied yet",
                                        {rack[:16]: q.pending for rack, q in queues.items()},
                                        "rack"),
            "ork_queue_connected": Family("1 while a rack's queue replicates",
                                          {rack[:16]: float(q.connected)
                                           for rack, q in queues.items()}, "rack"),
        })

    def set_pump(self, pump: Callable[[], None]) -> None:
        """Who hands status changes to watchers (the RPC service's ``pump``)."""
        self._pump = pump

    def now(self) -> float:
        return self._clock()

    # -- running -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._sync_racks()
            nursery.start_soon(self._publish_loop)
            nursery.start_soon(self._tick_loop)
            task_status.started()

    async def _sync_racks(self) -> None:
        """Open a queue for every registered rack; close those of removed racks."""
        racks = {info.key for info in await self.read(self.orchestrator.racks)}
        for rack in racks - set(self._open):
            await self._open_queue(rack)
        for rack in set(self._open) - racks:
            queue, scope = self._open.pop(rack)
            scope.cancel()
            self.queues.detach(bytes.fromhex(rack))
            await queue.aclose()
            log.info("ork.queue_closed rack=%s", rack[:12])

    async def _open_queue(self, rack: str) -> None:
        assert self._nursery is not None
        peer = bytes.fromhex(rack)
        queue = await DurableQueue.open(self._storage / "queues" / rack, self._keypair, peer,
                                        config=QueueConfig(fsync=self._fsync))
        self.queues.attach(queue)
        scope = trio.CancelScope()
        self._open[rack] = (queue, scope)
        self._nursery.start_soon(self._consume, rack, queue, scope)
        log.info("ork.queue_opened rack=%s", rack[:12])

    async def _consume(self, rack: str, queue: DurableQueue, scope: trio.CancelScope) -> None:
        with scope:
            applied = await self.read(self.orchestrator.report_position, rack)
            async with queue.deliveries() as deliveries:
                async for delivery in deliveries:
                    if applied is None or delivery.position > applied:
                        try:
                            report = decode_report(delivery.payload)
                        except BadMessage as exc:
                            self.bad_reports += 1
                            log.warning("ork.bad_report rack=%s position=%d reason=%s",
                                        rack[:12], delivery.position, exc)
                        else:
                            await self.call(self.orchestrator.on_report, rack, report,
                                            self.now(), position=delivery.position)
                    await queue.ack(delivery.position)

    async def _publish_loop(self) -> None:
        while True:
            await self._changed.wait()
            self._changed = trio.Event()
            await self._sync_racks()
            outbox = await self.read(self.orchestrator.outbox)
            published = []
            for outbound in outbox:
                entry = self._open.get(outbound.rack)
                op = outbound.op
                if isinstance(op, SetShellKeys):
                    if entry is None:
                        log.warning("ork.no_queue rack=%s op=%s team=%s", outbound.rack[:12],
                                    op.op_id, op.keys.team)
                        continue
                    await entry[0].publish(op.queue_key, encode(op))
                    published.append(op.op_id)
                    log.info("ork.shell_keys_sent rack=%s team=%s version=%d keys=%d",
                             outbound.rack[:12], op.keys.team, op.keys.version,
                             len(op.keys.keys))
                    continue
                where = {"job_id": op.job_id, "replica": op.replica}
                if entry is None:
                    log.warning("replica %d: no queue to rack %s… yet: %s waits | ork.no_queue "
                                "rack=%s op=%s", op.replica, outbound.rack[:12], op.kind,
                                outbound.rack[:12], op.op_id, extra=where)
                    continue
                await entry[0].publish(op.job_id, encode(op))
                published.append(op.op_id)
                log.info("replica %d: %s sent to rack %s…%s | ork.op op=%s", op.replica,
                         _VERB[op.kind], outbound.rack[:12],
                         f" for {nodes_text(op.placement)}" if op.kind == "create_replica"
                         else "", op.op_id, extra=where)
            if published:
                await self._run(functools.partial(self.orchestrator.mark_published,
                                                  published), self.limiter)
                log.info("ork.published ops=%d", len(published))
            async with self.limiter:  # no orchestrator call runs in a thread meanwhile
                self._pump()

    async def _tick_loop(self) -> None:
        """Tick at start (racks restored from the store start their silence clock
        then), then at the orchestrator's next deadline, or after a change but not
        sooner than ``tick_interval_s`` after the last tick; never on a fixed poll."""
        while True:
            self._tick_wanted = trio.Event()  # a change from here on asks for another
            ticked_at = trio.current_time()
            try:
                await self._run(lambda: self.orchestrator.tick(self.now()), self.limiter)
            finally:
                self._changed.set()  # the tick may have queued status changes
            self._measured = await self._run(self._measure, self.limiter)
            async with self.limiter:  # in memory, but never beside a call in a thread
                deadline = self.orchestrator.next_deadline()
            with trio.move_on_at(self._trio_time(deadline)):
                await self._tick_wanted.wait()
                await trio.sleep_until(ticked_at + self._tick_interval_s)

    def _trio_time(self, deadline: float | None) -> float:
        """The orchestrator's ``deadline`` (its clock) on trio's clock; inf for None."""
        if deadline is None:
            return math.inf
        return trio.current_time() + max(0.0, deadline - self.now())

    def _measure(self) -> Snapshot:
        """The metrics' snapshot (in the orchestrator's thread, under the limiter)."""
        orch = self.orchestrator
        stats = orch.statistics()
        racks = orch.racks()
        rack_states = {"reported": 0, "silent": 0, "waiting": 0}
        for info in racks:
            state = "silent" if info.silent else "reported" if info.reported else "waiting"
            rack_states[state] += 1
        return Snapshot({
            "ork_jobs": Family("Jobs by status", orch.status_counts(), "status"),
            "ork_outbox": Family("Operations recorded, not yet on a rack's queue",
                                 stats.outbox),
            "ork_reports": Family("Worker reports read, by what became of them", {
                "applied": stats.reports_applied, "unknown": stats.reports_unknown,
                "stale": stats.reports_stale, "refused": stats.reports_refused,
                "undecodable": self.bad_reports}, "outcome", counter=True),
            "ork_unexpected_transitions": Family(
                "Job status changes missing from the transition table (a bug: stays 0)",
                stats.unexpected_transitions, counter=True),
            "ork_racks": Family("Registered racks by state", rack_states, "state"),
        })
