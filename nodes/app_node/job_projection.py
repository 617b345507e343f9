"""app-node's copy of wrk-ork's jobs, kept from the ``jobs.watch`` it follows.

Theory of operation
-------------------
A Kubernetes controller does not ask the API server for an object each time it
needs one: an informer lists the objects once, then applies the watch's events
to its cache, and the controller reads the cache. :class:`JobProjection` is
that cache for app-node's job routes (``GET /api/jobs``, ``GET
/api/jobs/{job}``, the job event streams), so a listing costs wrk-ork nothing.

It is fed from one stream (:func:`~.job_events.follow_ork`): a ``jobs.watch``
with ``views`` and ``snapshot`` (:mod:`contracts.ork`), which sends every job's
view (one per stream item: any number of jobs fits the channel), then a
*bookmark* with wrk-ork's revision ``R``, then every change of any job's view
as a :class:`~contracts.ork.JobEvent` numbered ``R + 1``, ``R + 2``, ... with
the job's whole view after it (None: gone). So:

- :meth:`begin` when a watch opens: the snapshot that follows is collected
  apart, and reads do not use the copy (:attr:`synced` False) until
- the bookmark, which swaps the snapshot in as the copy at revision ``R``;
- each later event is applied in order; one whose ``seq`` is not the next
  raises :class:`ProjectionGap` (events were lost: the follower watches again,
  which rebuilds the copy from a new snapshot);
- :meth:`lost` when the watch ends (the connection broke, wrk-ork restarted,
  ``LAGGED``): not synced until the next bookmark.

While not synced the routes do what they did before the copy: ask wrk-ork
(see ``api/_jobs.py``). That is also what happens with a wrk-ork too old for
``views``: the follower never calls :meth:`begin`.

Read-your-writes: a route that changed a job (create, restart, delete...)
takes :meth:`mark` before its call to wrk-ork and, once answered,
:meth:`wait_applied` until the copy has applied a change of that job numbered
after the mark (wrk-ork hands the change to the watch before it answers the
call, so it is already on its way). A later read by the same user then shows
the write. The wait is bounded (:data:`WRITE_WAIT_S`); past it, or when the
copy is not synced or was rebuilt meanwhile, it returns (reads are then
answered by wrk-ork, or the bound was hit: logged).

Everything here is synchronous but :meth:`wait_applied`; the tests drive it
with events and no network.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from contracts.ork import JobEvent, JobView
from nodes.kit.metrics import Family, Snapshot

__all__ = ["WRITE_WAIT_S", "JobProjection", "Mark", "ProjectionGap", "ProjectionStatistics"]

log = logging.getLogger(__name__)

#: How long a write waits for its change to reach the copy. wrk-ork sends the
#: change before its answer, so this is only hit when the watch is stuck.
WRITE_WAIT_S = 2.0
#: Removed jobs whose last revision is kept (for :meth:`JobProjection.wait_applied`
#: after a delete); the oldest is forgotten beyond it.
MAX_REMOVED = 4096


class ProjectionGap(Exception):
    """An event was not the next revision (or came where none may): rebuild the copy."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"wrk-ork's job watch skipped from revision {expected - 1} to {got}; "
                         "the copy of the jobs is rebuilt from a new watch")
        self.expected, self.got = expected, got


@dataclass(frozen=True)
class Mark:
    """Where the copy was when a write was sent (:meth:`JobProjection.mark`)."""

    generation: int
    revision: int


@dataclass(frozen=True)
class ProjectionStatistics:
    """The copy's counters (``statistics()``)."""

    #: Reads may use it.
    synced: bool
    jobs: int
    #: wrk-ork's revision it is at.
    revision: int
    #: Snapshots taken in (the first sync and every resync).
    syncs: int
    #: Events applied after a bookmark.
    applied: int
    #: Gaps seen (each ended its watch).
    gaps: int
    #: Writes whose change did not arrive within :data:`WRITE_WAIT_S`.
    write_waits_expired: int


class JobProjection:
    """wrk-ork's jobs as its watch says they are (see the module doc)."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobView] = {}
        #: Each job's revision when its view was last set (snapshot: the bookmark's).
        self._seq: dict[str, int] = {}
        #: Removed jobs' revisions, oldest first, at most MAX_REMOVED.
        self._removed: OrderedDict[str, int] = OrderedDict()
        #: The snapshot being received (None: none).
        self._pending: dict[str, JobView] | None = None
        self._changed = trio.Event()
        self.revision = 0
        #: Bookmarks taken in: a new one means a rebuilt copy.
        self.generation = 0
        self.synced = False
        self._applied = self._gaps = self._expired = 0

    # -- feeding (the follower) ----------------------------------------------------------

    def begin(self) -> None:
        """A watch with a snapshot opened: collect it; reads wait for its bookmark."""
        self.synced = False
        self._pending = {}

    def lost(self) -> None:
        """The watch ended: reads go to wrk-ork until the next bookmark."""
        self.synced = False
        self._pending = None
        self._notify()

    def apply(self, event: JobEvent) -> None:
        """Take in one item of the watch, in the order it came.

        Raises:
            ProjectionGap: an event out of sequence (events were lost), or one
                outside a watch (:meth:`begin` not called): call :meth:`lost`
                and watch again.
        """
        if self._pending is not None:
            if event.bookmark:
                self._install(self._pending, event.seq)
            elif event.job is not None:
                self._pending[event.job_id] = event.job
            return
        if not self.synced or event.bookmark or event.seq != self.revision + 1:
            self._gaps += 1
            raise ProjectionGap(self.revision + 1, event.seq)
        self.revision = event.seq
        self._applied += 1
        if event.job is None:
            self._jobs.pop(event.job_id, None)
            self._seq.pop(event.job_id, None)
            self._removed[event.job_id] = event.seq
            self._removed.move_to_end(event.job_id)
            while len(self._removed) > MAX_REMOVED:
                self._removed.popitem(last=False)
        else:
            self._jobs[event.job_id] = event.job
            self._seq[event.job_id] = event.seq
            self._removed.pop(event.job_id, None)
        self._notify()

    def _install(self, jobs: dict[str, JobView], revision: int) -> None:
        self._jobs, self._pending = jobs, None
        self._seq = dict.fromkeys(jobs, revision)
        self._removed.clear()
        self.revision, self.synced = revision, True
        self.generation += 1
        log.info("app_node.jobs_synced jobs=%d revision=%d", len(jobs), revision)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- reading (the routes) --------------------------------------------------------

    def get(self, job_id: str, team: str) -> JobView | None:
        """``job_id``'s view if the copy holds it and it is ``team``'s."""
        view = self._jobs.get(job_id)
        return view if view is not None and view.spec.team == team else None

    def views(self, job_ids: Iterable[str], team: str) -> dict[str, JobView]:
        """The views the copy holds of ``job_ids`` that are ``team``'s, by id."""
        found = {}
        for job_id in job_ids:
            view = self._jobs.get(job_id)
            if view is not None and view.spec.team == team:
                found[job_id] = view
        return found

    def metrics(self) -> Snapshot:
        """The counters for the daemon's ``/metrics`` (plain numbers: safe to read
        from the scrape's thread)."""
        stats = self.statistics()
        return Snapshot({
            "app_node_jobs_copy_synced": Family(
                "1 while app-node's copy of wrk-ork's jobs answers reads (0: the job "
                "routes ask wrk-ork)", float(stats.synced)),
            "app_node_jobs_copy_jobs": Family("jobs in app-node's copy", stats.jobs),
            "app_node_jobs_copy_revision": Family("wrk-ork's revision the copy is at",
                                                  stats.revision),
            "app_node_jobs_copy_syncs": Family(
                "snapshots taken in (the first sync and every resync)", stats.syncs,
                counter=True),
            "app_node_jobs_copy_gaps": Family("gaps in the watch's revisions (each "
                                              "rebuilt the copy)", stats.gaps, counter=True),
            "app_node_jobs_copy_write_waits_expired": Family(
                "writes whose change did not reach the copy in time", stats.write_waits_expired,
                counter=True)})

    def statistics(self) -> ProjectionStatistics:
        return ProjectionStatistics(synced=self.synced, jobs=len(self._jobs),
                                    revision=self.revision, syncs=self.generation,
                                    applied=self._applied, gaps=self._gaps,
                                    write_waits_expired=self._expired)

    # -- read-your-writes ------------------------------------------------------------

    def mark(self) -> Mark:
        """Where the copy is now: take it before sending a write to wrk-ork."""
        return Mark(self.generation, self.revision)

    def _last_change(self, job_id: str) -> int:
        seq = self._seq.get(job_id)
        return self._removed.get(job_id, 0) if seq is None else seq

    def applied_since(self, job_id: str, mark: Mark) -> bool:
        """The copy holds a change of ``job_id`` made after ``mark`` (or it no longer
        answers reads, or was rebuilt since: nothing to wait for then)."""
        return (not self.synced or self.generation != mark.generation
                or self._last_change(job_id) > mark.revision)

    async def wait_synced(self) -> None:
        """Until the copy answers reads (at once if it does)."""
        while not self.synced:
            await self._changed.wait()

    async def wait_applied(self, job_id: str, mark: Mark, *,
                           timeout_s: float = WRITE_WAIT_S) -> bool:
        """Until :meth:`applied_since` (True), or ``timeout_s`` passed (False, logged)."""
        with trio.move_on_after(timeout_s):
            while not self.applied_since(job_id, mark):
                await self._changed.wait()
            return True
        self._expired += 1
        log.warning("app_node.write_not_seen job=%s after_s=%.1f: wrk-ork's watch did not "
                    "bring the change; reads may show the job as before it", job_id, timeout_s)
        return False
