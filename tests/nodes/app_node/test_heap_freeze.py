"""app-node's process freezes its start-up heap once its copy of the jobs is synced
(full collections then skip it), not before; without wrk-ork at once."""

from __future__ import annotations

import gc

import pytest
import trio
import trio.testing

from nodes.app_node import daemon
from nodes.app_node.job_projection import JobProjection

from .test_job_projection import bookmark


@pytest.fixture
def freezes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """gc.freeze's calls, recorded instead of freezing the test process's heap."""
    calls: list[bool] = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append(True))
    return calls


async def test_the_heap_is_frozen_once_the_copy_is_synced(freezes: list[bool]) -> None:
    jobs = JobProjection()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(daemon.freeze_startup_heap, jobs)
        await trio.testing.wait_all_tasks_blocked()
        assert freezes == []  # still waiting for the copy
        jobs.begin()
        jobs.apply(bookmark(1))
    assert freezes == [True]


async def test_without_wrk_ork_at_once(freezes: list[bool]) -> None:
    await daemon.freeze_startup_heap(None)
    assert freezes == [True]


async def test_a_copy_that_never_syncs_freezes_after_the_wait(freezes: list[bool],
                                                               autojump_clock) -> None:
    await daemon.freeze_startup_heap(JobProjection())
    assert freezes == [True]
