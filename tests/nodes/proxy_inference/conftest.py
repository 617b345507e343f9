"""Fixtures of the proxy's tests."""

from __future__ import annotations

import pytest
import trio


@pytest.fixture
async def ticking(thread_clock, nursery):
    """``thread_clock`` with a timer always pending.

    Under ``thread_clock`` a wait on a worker thread (an fsync, a SQLite query)
    longer than 2 ms of real time jumps the clock to the next deadline; with
    nothing else pending that is the test's own timeout. A 10 ms tick keeps
    every jump small.
    """

    async def tick() -> None:
        while True:  # noqa: ASYNC110 - the sleeps are the point
            await trio.sleep(0.01)

    nursery.start_soon(tick)
