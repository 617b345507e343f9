"""The driver's publishing loop sleeps while nothing changes.

Its own reads (racks, outbox) once went through the call that wakes it, so
an idle wrk-ork walked every job in a loop and took a core (found by
bench/api.py). Only a change (or a tick) wakes it now.
"""

from __future__ import annotations

from types import SimpleNamespace

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
    assert idle == 0, orch.calls
    assert orch.calls["outbox"] == 1  # a change wakes it, once
