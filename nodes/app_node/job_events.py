"""Job status changes from wrk-ork, fanned out to app-node's event streams.

Theory of operation
-------------------
wrk-ork streams every job status change on ``jobs.watch`` (a
:class:`~contracts.ork.JobEvent` each). app-node keeps **one** such watch
(:func:`follow_ork`, a task of the daemon's nursery started next to its
:class:`~nodes.kit.ork_client.OrkClient`) and hands each event to a
:class:`JobHub`, which copies it to every subscriber that wants it: the
``GET /api/jobs/{job}/events`` and ``GET /api/jobs/events`` streams
(``api/_events.py``), however many clients follow them.

Nothing here ever waits for a slow reader. Each subscriber has a bounded queue
(``capacity`` items, plus the one a reader already waiting takes at once);
:meth:`JobHub.publish` puts without waiting, and a
subscriber whose queue is full is dropped: its queue is closed and
:attr:`Subscription.lagged` set, so its stream says ``lagged`` and ends (the
client re-reads and subscribes again). The hub holds at most ``max_subscribers``
subscriptions (:class:`TooManySubscribers` beyond), so its memory is bounded by
``max_subscribers * capacity`` events.

Events can be missed between two watches: when the connection to wrk-ork broke,
or wrk-ork ended the watch with ``LAGGED`` (app-node fell behind). Once the next
watch is open, :func:`follow_ork` calls :meth:`JobHub.resync`, which puts
:data:`RESYNC` in every queue: "something may have changed unseen; re-read". A
per-job stream re-reads its job; the team stream has nothing cheap to re-read,
so it says ``lagged`` and ends. (A change that lands in the instant between the
new watch being sent and wrk-ork registering it is re-read by that resync too:
the resync comes after the new watch's request.)

The same watch feeds app-node's copy of the jobs, :class:`~.job_projection.JobProjection`
(given to :func:`follow_ork`): it then asks for ``views`` and a snapshot, each
item goes to the projection first, and the hub gets the status changes only
(not the snapshot, nor a view's change that moved no status), so a subscriber
that re-reads its job from the projection sees the change it was told of.

The hub is synchronous (trio memory channels, ``send_nowait`` only): the tests
drive it without a network, and the watcher is a thin loop around it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import trio

from contracts.ork import WATCH_JOBS, JobEvent, WatchJobs
from p2p.rpc import RpcError

from .job_projection import JobProjection, ProjectionGap

if TYPE_CHECKING:
    from nodes.kit.ork_client import OrkClient

__all__ = ["RESYNC", "Item", "JobHub", "Resync", "Subscription", "TooManySubscribers",
           "follow_ork", "is_status_change"]

log = logging.getLogger(__name__)

#: Items queued for one subscriber before it is dropped as lagged.
DEFAULT_CAPACITY = 64
#: Subscriptions at once (open event streams); more are refused.
DEFAULT_MAX_SUBSCRIBERS = 1024


class Resync(enum.Enum):
    """Events may have been missed (a new watch of wrk-ork): re-read what you show."""

    RESYNC = "resync"


RESYNC = Resync.RESYNC
Item = JobEvent | Resync


class TooManySubscribers(Exception):
    """The hub already holds ``max_subscribers`` subscriptions."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"app-node serves at most {limit} event streams at once; "
                         "close one, or retry later")
        self.limit = limit


class Subscription:
    """One subscriber: its filter and its bounded queue (read :attr:`receive`).

    The queue ends (``trio.EndOfChannel``) when the subscriber was dropped
    (:attr:`lagged` is then True) or unsubscribed.
    """

    def __init__(self, job_id: str | None, team: str | None, capacity: int) -> None:
        self.job_id, self.team = job_id, team
        self._send, self.receive = trio.open_memory_channel[Item](capacity)
        self.lagged = False

    def wants(self, event: JobEvent) -> bool:
        return ((self.job_id is None or event.job_id == self.job_id)
                and (self.team is None or event.team == self.team))

    def _offer(self, item: Item) -> bool:
        """Queue ``item``; False (and closed, lagged) when the queue is full."""
        try:
            self._send.send_nowait(item)
        except trio.WouldBlock:
            self.lagged = True
            self._send.close()
            return False
        except trio.ClosedResourceError:
            return False
        return True


class JobHub:
    """Fans job events out to subscribers; never blocks (see the module doc).

    Args:
        capacity: items queued per subscriber before it is dropped as lagged.
        max_subscribers: subscriptions at once.
    """

    def __init__(self, *, capacity: int = DEFAULT_CAPACITY,
                 max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS) -> None:
        if capacity < 1 or max_subscribers < 1:
            raise ValueError("capacity and max_subscribers must be at least 1")
        self.capacity = capacity
        self.max_subscribers = max_subscribers
        self._subscribers: set[Subscription] = set()
        #: Counters (tests and the status line): events published, subscribers
        #: dropped as lagged, subscriptions ever made, resyncs.
        self.published = self.dropped = self.subscriptions = self.resyncs = 0
        #: Whether a watch of wrk-ork is open now (set by :func:`follow_ork`).
        self.watching = False

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @contextmanager
    def subscribe(self, *, job_id: str | None = None,
                  team: str | None = None) -> Iterator[Subscription]:
        """A subscription to the events of ``job_id`` and/or ``team`` (None: any),
        for the ``with`` block.

        Raises:
            TooManySubscribers: ``max_subscribers`` are subscribed already.
        """
        if len(self._subscribers) >= self.max_subscribers:
            raise TooManySubscribers(self.max_subscribers)
        sub = Subscription(job_id, team, self.capacity)
        self._subscribers.add(sub)
        self.subscriptions += 1
        try:
            yield sub
        finally:
            self._subscribers.discard(sub)
            sub._send.close()
            sub.receive.close()

    def publish(self, event: JobEvent) -> None:
        """Queue ``event`` for every subscriber that wants it; drop those that are full."""
        self.published += 1
        for sub in list(self._subscribers):
            if sub.wants(event) and not sub._offer(event):
                self._drop(sub)

    def resync(self) -> None:
        """Tell every subscriber that events may have been missed."""
        self.resyncs += 1
        for sub in list(self._subscribers):
            if not sub._offer(RESYNC):
                self._drop(sub)

    def _drop(self, sub: Subscription) -> None:
        if sub in self._subscribers:
            self._subscribers.discard(sub)
            self.dropped += 1
            log.info("app_node.events_subscriber_lagged job=%s team=%s", sub.job_id, sub.team)


#: Waits between failed watches: ``BACKOFF_BASE_S`` doubling up to ``BACKOFF_MAX_S``.
BACKOFF_BASE_S, BACKOFF_MAX_S = 0.5, 30.0
#: A watch that lasted this long resets the backoff (it was not failing at once).
HEALTHY_S = 10.0


def is_status_change(event: JobEvent) -> bool:
    """Not a change of a view alone (``previous`` equal to ``status``, from a
    ``views`` watch): what the hub's subscribers are sent."""
    return event.status is None or event.status != event.previous


async def follow_ork(ork: OrkClient, hub: JobHub, projection: JobProjection | None = None, *,
                     base_s: float = BACKOFF_BASE_S, max_s: float = BACKOFF_MAX_S,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Watch wrk-ork's ``jobs.watch`` into ``hub`` (and ``projection``) until
    cancelled (module doc).

    ``started`` at once. Watches again after the connection broke, after
    ``LAGGED``, after a gap in the projection's events and after any refusal,
    waiting with backoff between failures; every watch after the first is
    followed by :meth:`JobHub.resync` (with a projection: once its snapshot is
    in, so what the subscribers re-read is the new copy).

    With ``projection``, the watch asks for ``views`` and a snapshot, and every
    item goes to the projection before the hub. A wrk-ork that refuses
    ``views`` (``INVALID_PARAMS``: older than the projection) is watched without
    them until the connection ends; the projection then stays unsynced and the
    routes ask wrk-ork as before.
    """
    from nodes.kit.ork_client import OrkUnavailable

    task_status.started()
    wait, first, views_refused = base_s, True, False
    while True:
        began = trio.current_time()
        views = projection is not None and not views_refused
        try:
            async with ork.stream(WATCH_JOBS, WatchJobs(snapshot=views, views=views)
                                  ) as events:
                hub.watching = True
                resync = not first
                first = False
                if views:
                    assert projection is not None
                    projection.begin()
                elif resync:
                    hub.resync()
                async for event in events:
                    if views:
                        assert projection is not None
                        projection.apply(event)
                        if event.bookmark:
                            if resync:
                                hub.resync()
                            continue
                        if not projection.synced or not is_status_change(event):
                            continue  # the snapshot, or a view's change alone
                    hub.publish(event)
            why = "ended"
        except OrkUnavailable:
            why = "unreachable"
        except RpcError as exc:
            why = exc.code
        except ProjectionGap as exc:
            log.warning("app_node.ork_watch_gap expected=%d got=%d", exc.expected, exc.got)
            why = "GAP"
        finally:
            hub.watching = False
            if projection is not None:
                projection.lost()
        if why == "INVALID_PARAMS" and views:  # an older wrk-ork: watch without views
            log.warning("app_node.ork_watch_without_views: wrk-ork refuses views (older "
                        "than app-node); job listings ask wrk-ork per request")
            views_refused = True
            continue
        if why == "unreachable":  # perhaps a newer wrk-ork next time
            views_refused = False
        if why in ("LAGGED", "GAP"):  # app-node fell behind: watch again at once
            log.warning("app_node.ork_watch_lagged why=%s", why)
            wait = base_s
            continue
        if trio.current_time() - began >= HEALTHY_S:
            wait = base_s
        log.info("app_node.ork_watch_ended why=%s retry_in=%.1fs", why, wait)
        await trio.sleep(wait)
        wait = min(wait * 2, max_s)
