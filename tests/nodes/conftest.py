"""Fixtures shared by the platform's tests."""

from __future__ import annotations

import pytest
import trio


@pytest.fixture
def thread_clock():
    """Trio's virtual clock for tests whose code runs SQLite in threads.

    ``autojump_clock`` jumps as soon as every task waits, and a task waiting on
    ``trio.to_thread`` counts as waiting: time would race through every timer
    while one query runs. This clock jumps only after 2 ms of real idleness
    (as tests/crdt/test_replication.py does).
    """
    return trio.testing.MockClock(autojump_threshold=0.002)
