"""A thread of its own for a queue end's blocking file work, in order.

Why not ``trio.to_thread.run_sync``: a group commit there is a trio task that
hands the write to a pooled thread and is rescheduled when it returns, then
wakes its publishers and lets one of them lead the next commit in a later
scheduling round: at 5,000 publishes/s that round trip, not the 0.2-0.3 ms
``fdatasync``, was most of the commit cycle (p2p/queue/README.md,
*Benchmark*). Here the thread runs jobs from a queue and reports each result
with ``TrioToken.run_sync_soon``: the result is handled (and the next batch
handed over) between two trio tasks, with no task of its own to schedule.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import outcome
import trio

__all__ = ["FileThread"]


class FileThread:
    """Runs blocking calls one at a time, in submission order, on one thread.

    Started lazily from trio (it needs the run's token); :meth:`aclose` waits
    for what was submitted, then stops it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any],
                                            Callable[[outcome.Outcome], None]] | None] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    def call_soon(self, job: Callable[[], Any], done: Callable[[outcome.Outcome], None]) -> None:
        """Run ``job`` on the thread; ``done(its outcome)`` then runs on the trio thread."""
        if self._thread is None:
            self._token = trio.lowlevel.current_trio_token()
            self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self._thread.start()
        self._jobs.put((job, done))

    async def run(self, job: Callable[[], Any]) -> Any:
        """Run ``job`` on the thread and return (or raise) what it did.

        Not cancellable once submitted (like ``to_thread.run_sync``'s default):
        the caller's state must not change under a job still running.
        """
        task = trio.lowlevel.current_task()
        await trio.lowlevel.checkpoint_if_cancelled()
        self.call_soon(job, lambda result: trio.lowlevel.reschedule(task, result))
        return await trio.lowlevel.wait_task_rescheduled(
            lambda _: trio.lowlevel.Abort.FAILED)

    def _main(self) -> None:
        token = self._token
        assert token is not None
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done = item
            result = outcome.capture(job)
            try:
                token.run_sync_soon(done, result)
            except trio.RunFinishedError:
                return

    async def aclose(self) -> None:
        """Let submitted jobs finish, then stop the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            await trio.to_thread.run_sync(self._thread.join)
            self._thread = None
