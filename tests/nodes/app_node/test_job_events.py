"""The job-event hub without a network: fan-out by job and team, bounded queues
that drop a lagging subscriber (never block the publisher), resync, the
subscriber limit; and ``follow_ork`` against a fake wrk-ork client: it publishes
what the watch streams, watches again after LAGGED (at once) and after a broken
connection (with backoff), and resyncs every watch after the first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from contracts.model import JobStatus
from contracts.ork import JobEvent
from nodes.app_node.job_events import RESYNC, JobHub, TooManySubscribers, follow_ork
from nodes.kit.ork_client import OrkUnavailable
from p2p.rpc import RpcError


def event(job: str, status: JobStatus | None = JobStatus.ACTIVE, team: str = "a") -> JobEvent:
    return JobEvent(job_id=job, team=team, status=status, previous=JobStatus.STARTING,
                    reason="", at=1.0)


def drain(sub) -> list:
    items = []
    while True:
        try:
            items.append(sub.receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return items


def test_fan_out_by_job_and_team() -> None:
    hub = JobHub()
    with hub.subscribe(job_id="j1") as one, hub.subscribe(team="b") as team_b, \
            hub.subscribe() as every:
        assert hub.subscribers == 3
        hub.publish(event("j1"))
        hub.publish(event("j2", team="b"))
        hub.publish(event("j3", status=None))
        assert [e.job_id for e in drain(one)] == ["j1"]
        assert [e.job_id for e in drain(team_b)] == ["j2"]
        assert [e.job_id for e in drain(every)] == ["j1", "j2", "j3"]
        hub.resync()
        assert drain(one) == drain(team_b) == drain(every) == [RESYNC]
    assert hub.subscribers == 0 and hub.subscriptions == 3


def test_a_full_queue_drops_that_subscriber_only() -> None:
    hub = JobHub(capacity=2)
    with hub.subscribe() as slow, hub.subscribe() as quick:
        for n in range(5):  # never blocks, whatever the readers do
            hub.publish(event(f"j{n}"))
            drain(quick)
        assert slow.lagged and not quick.lagged
        assert hub.subscribers == 1 and hub.dropped == 1
        # The dropped one reads what it had, then the end.
        assert [e.job_id for e in drain(slow)] == ["j0", "j1"]
        with pytest.raises(trio.EndOfChannel):
            slow.receive.receive_nowait()
        hub.publish(event("later"))
        assert [e.job_id for e in drain(quick)] == ["later"]
    assert hub.subscribers == 0


def test_resync_drops_a_full_subscriber_and_the_limit_holds() -> None:
    hub = JobHub(capacity=1, max_subscribers=2)
    with hub.subscribe() as sub:
        hub.publish(event("j"))
        hub.resync()
        assert sub.lagged and hub.subscribers == 0
    with hub.subscribe(), hub.subscribe(), \
            pytest.raises(TooManySubscribers, match="at most 2"), hub.subscribe():
        pass
    with pytest.raises(ValueError):
        JobHub(capacity=0)


class FakeOrk:
    """``stream`` plays a script: per watch, events to yield then how it ends."""

    def __init__(self, script: list[tuple[list[JobEvent], Exception | None]]) -> None:
        self.script = script
        self.watches: list[float] = []

    @asynccontextmanager
    async def stream(self, method: Any, params: Any) -> AsyncIterator[Any]:
        self.watches.append(trio.current_time())
        events, end = self.script.pop(0) if self.script else ([], None)
        forever = not self.script and not events
        if isinstance(end, OrkUnavailable):
            raise end

        async def items() -> AsyncIterator[JobEvent]:
            for item in events:
                await trio.sleep(0.01)
                yield item
            if end is not None:
                raise end
            if forever:
                await trio.sleep_forever()
        yield items()


async def test_follow_ork_rewatches_with_backoff_and_resyncs(autojump_clock) -> None:
    hub = JobHub()
    ork = FakeOrk([
        ([event("a")], RpcError("LAGGED", "behind")),         # again at once
        ([event("b")], RpcError("CHANNEL_CLOSED", "gone")),   # again after 0.5 s
        ([], OrkUnavailable("down")),                          # again after 1 s
        ([event("c")], None),                                  # ended: after 2 s
        ([event("d")], None),
    ])
    with hub.subscribe() as sub:
        async with trio.open_nursery() as nursery:
            await nursery.start(follow_ork, ork, hub)
            await trio.sleep(60)  # the clock jumps; the script is long over by then
            assert len(ork.watches) == 6
            assert hub.watching
            nursery.cancel_scope.cancel()
        items = drain(sub)
    gaps = [round(b - a, 2) for a, b in zip(ork.watches, ork.watches[1:], strict=False)]
    assert gaps == [0.01, 0.51, 1.0, 2.01, 4.01]  # doubling: none lasted HEALTHY_S
    names = [i if i is RESYNC else i.job_id for i in items]
    # Each watch after the first resyncs (the unreachable one never opened).
    assert names == ["a", RESYNC, "b", RESYNC, "c", RESYNC, "d", RESYNC]
    assert hub.resyncs == 4
    assert hub.published == 4 and not hub.watching


class RecordingOrk(FakeOrk):
    """:class:`FakeOrk` that keeps each watch's params; ``old`` refuses ``views``
    as a wrk-ork older than them does (extra field: INVALID_PARAMS)."""

    def __init__(self, script: list[tuple[list[JobEvent], Exception | None]], *,
                 old: bool = False) -> None:
        super().__init__(script)
        self.old = old
        self.params: list[Any] = []

    @asynccontextmanager
    async def stream(self, method: Any, params: Any) -> AsyncIterator[Any]:
        self.params.append(params)
        if self.old and params.views:
            raise RpcError("INVALID_PARAMS", "views: extra inputs are not permitted")
        async with super().stream(method, params) as items:
            yield items


def _view_event(job: str, seq: int, status: JobStatus | None, previous: JobStatus | None
                ) -> JobEvent:
    from contracts.model import JobSpec
    from contracts.ork import JobView
    spec = JobSpec(name="box", team="a", type="container",
                   image="docker://registry.local/jobs/app:1", gpus=1)
    view = None if status is None else JobView(
        id=job, spec=spec, status=status, reason="", created_at=1.0, updated_at=1.0,
        rack=None, replicas=())
    return JobEvent(job_id=job, team="a", status=status, previous=previous, reason="",
                    at=1.0, seq=seq, job=view)


def _bookmark(seq: int) -> JobEvent:
    return JobEvent(job_id="", team="", status=None, previous=None, reason="", at=1.0,
                    seq=seq, bookmark=True)


async def test_follow_ork_keeps_the_projection_and_rebuilds_it_after_a_gap(
        autojump_clock) -> None:
    from nodes.app_node.job_projection import JobProjection
    hub, projection = JobHub(), JobProjection()
    P, S = JobStatus.PENDING, JobStatus.STARTING
    ork = RecordingOrk([
        ([_view_event("x", 5, P, P), _bookmark(5),
          _view_event("x", 6, S, P),          # a status change: the hub hears it
          _view_event("x", 7, S, S),          # a view's change alone: the copy only
          _view_event("x", 9, None, S)],      # 8 was lost: a gap, watch again at once
         None),
        ([_view_event("y", 2, P, P), _bookmark(2)], None),  # e.g. wrk-ork restarted
    ])
    with hub.subscribe() as sub:
        async with trio.open_nursery() as nursery:
            await nursery.start(follow_ork, ork, hub, projection)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()
        items = drain(sub)
    assert all(p.views and p.snapshot for p in ork.params)
    assert [(i.job_id, i.status) if i is not RESYNC else i for i in items] == [
        ("x", S), RESYNC]  # the resync once the new snapshot is in
    assert ork.watches[1] - ork.watches[0] < 0.1  # a gap re-watches at once
    stats = projection.statistics()
    assert stats.gaps == 1 and stats.syncs == 2 and stats.revision == 2
    assert projection.get("x", "a") is None and projection.get("y", "a") is not None
    assert not projection.synced  # the second watch ended, the third sent no bookmark


async def test_follow_ork_watches_an_older_wrk_ork_without_views(autojump_clock) -> None:
    from nodes.app_node.job_projection import JobProjection
    hub, projection = JobHub(), JobProjection()
    ork = RecordingOrk([([event("a")], None)], old=True)
    with hub.subscribe() as sub:
        async with trio.open_nursery() as nursery:
            await nursery.start(follow_ork, ork, hub, projection)
            await trio.sleep(0.5)
            assert not projection.synced  # the routes ask wrk-ork
            nursery.cancel_scope.cancel()
        items = drain(sub)
    assert [p.views for p in ork.params] == [True, False]
    assert [i.job_id for i in items] == ["a"]
