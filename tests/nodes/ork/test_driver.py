"""The driver's publishing loop sleeps while nothing changes.

Its own reads (racks, outbox) once went through the call that wakes it, so
an idle wrk-ork walked every job in a loop and took a core (found by
bench/api.py). Only a change (or a tick) wakes it now.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio

from nodes.ork.driver import OrkDriver
from p2p.keys import KeyPair

from ...p2p.helpers import wait_until


class CountingOrchestrator:
    """The orchestrator's surface the driver uses, with nothing in it."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def racks(self) -> list:
        self._count("racks")
        return []

    def outbox(self) -> list:
        self._count("outbox")
        return []

    def tick(self, now: float) -> None:
        self._count("tick")

    def statistics(self) -> SimpleNamespace:
        return SimpleNamespace(outbox=0, reports_applied=0, reports_unknown=0,
                               reports_stale=0, reports_refused=0, unexpected_transitions=0)

    def status_counts(self) -> dict:
        return {}

    def next_deadline(self) -> None:
        return None


async def test_an_idle_driver_does_not_wake_itself(tmp_path):
    # Real time, not trio's autojump clock: the driver's reads run in threads,
    # and the autojump clock jumps while a thread runs.
    orch = CountingOrchestrator()
    driver = OrkDriver(orch, SimpleNamespace(), KeyPair.generate(), tmp_path,  # type: ignore[arg-type]
                       tick_interval_s=3600.0)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(driver.run)
            await trio.sleep(0.5)  # the busy loop read the outbox thousands of times in this
            idle = orch.calls.get("outbox", 0)
            driver.changed()
            await wait_until(lambda: orch.calls.get("outbox", 0) > idle, limit_s=5,
                             step_s=0.01)
            await trio.sleep(0.2)
            nursery.cancel_scope.cancel()
    assert idle == 1, orch.calls  # the tick at start publishes what a crash left, once
    assert orch.calls["outbox"] == 2  # a change wakes it, once


class DeadlineOrchestrator(CountingOrchestrator):
    """Records when it ticks; its next deadline is whatever the test sets."""

    def __init__(self, deadline: float | None) -> None:
        super().__init__()
        self.deadline = deadline
        self.ticks: list[float] = []

    def tick(self, now: float) -> None:
        self.ticks.append(now)

    def next_deadline(self) -> float | None:
        return self.deadline

    def mark_published(self, op_ids: list) -> None:
        pass


async def _inline(function, limiter: trio.CapacityLimiter):
    """Runs an orchestrator call in the trio thread: the autojump clock jumps while a
    worker thread runs, so a test on trio's clock keeps the calls out of threads."""
    async with limiter:
        return function()


def _driver(orch: DeadlineOrchestrator, tmp_path) -> OrkDriver:
    return OrkDriver(orch, SimpleNamespace(), KeyPair.generate(), tmp_path,  # type: ignore[arg-type]
                     tick_interval_s=1.0, clock=trio.current_time, run=_inline)


async def _wait_ticks(orch: DeadlineOrchestrator, count: int) -> None:
    await wait_until(lambda: len(orch.ticks) >= count, limit_s=60, step_s=0.01)


async def test_the_tick_waits_for_the_next_deadline_not_a_poll(tmp_path, autojump_clock):
    start = trio.current_time()
    orch = DeadlineOrchestrator(deadline=start + 30.0)
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            await nursery.start(_driver(orch, tmp_path).run)
            await _wait_ticks(orch, 1)
            assert orch.ticks == [start]  # at start: restored racks' silence starts now
            await trio.sleep_until(start + 29.9)
            assert len(orch.ticks) == 1  # nothing early, and no tick a second
            orch.deadline = None  # after this tick no rack can fall silent
            await _wait_ticks(orch, 2)
            assert orch.ticks[1] == pytest.approx(start + 30.0)
            await trio.sleep(600)
            assert len(orch.ticks) == 2  # no deadline: it sleeps until a change
            nursery.cancel_scope.cancel()


async def test_a_change_ticks_at_once_but_not_twice_within_the_interval(tmp_path,
                                                                         autojump_clock):
    start = trio.current_time()
    orch = DeadlineOrchestrator(deadline=None)
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            driver = _driver(orch, tmp_path)
            await nursery.start(driver.run)
            await _wait_ticks(orch, 1)
            await trio.sleep_until(start + 5.0)
            driver.changed()  # e.g. a reservation freed nodes: Pending jobs may fit
            await _wait_ticks(orch, 2)
            assert orch.ticks[1] == pytest.approx(start + 5.0)
            driver.changed()
            driver.changed()
            await _wait_ticks(orch, 3)
            assert orch.ticks[2] == pytest.approx(start + 6.0)  # tick_interval_s after
            await trio.sleep(600)
            assert len(orch.ticks) == 3
            nursery.cancel_scope.cancel()
