"""app-node's copy of wrk-ork's jobs, driven with watch items and no network: the
snapshot counts from its bookmark, events apply in order, a gap or a lost watch
unsyncs it, reads are team-scoped, and a write waits until its change is in."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.model import JobSpec, JobStatus
from contracts.ork import JobEvent, JobView
from nodes.app_node.job_projection import JobProjection, ProjectionGap

IMAGE = "docker://registry.local/jobs/app:1"


def view(job_id: str, team: str = "team-a", status: JobStatus = JobStatus.PENDING,
         reason: str = "") -> JobView:
    spec = JobSpec(name="box", team=team, type="container", image=IMAGE, gpus=1)
    return JobView(id=job_id, spec=spec, status=status, reason=reason, created_at=1.0,
                   updated_at=1.0, rack=None, replicas=())


def change(seq: int, job: JobView | None, job_id: str | None = None,
           previous: JobStatus | None = JobStatus.PENDING) -> JobEvent:
    return JobEvent(job_id=job.id if job is not None else str(job_id),
                    team=job.spec.team if job is not None else "team-a",
                    status=None if job is None else job.status, previous=previous, reason="",
                    at=2.0, seq=seq, job=job)


def bookmark(seq: int) -> JobEvent:
    return JobEvent(job_id="", team="", status=None, previous=None, reason="", at=2.0,
                    seq=seq, bookmark=True)


def synced(*jobs: JobView, revision: int = 10) -> JobProjection:
    projection = JobProjection()
    projection.begin()
    for job in jobs:
        projection.apply(change(revision, job, previous=job.status))
    projection.apply(bookmark(revision))
    return projection


def test_the_snapshot_counts_only_from_its_bookmark() -> None:
    projection = JobProjection()
    assert not projection.synced
    projection.begin()
    projection.apply(change(7, view("a")))
    assert not projection.synced and projection.get("a", "team-a") is None
    projection.apply(bookmark(7))
    assert projection.synced and projection.revision == 7
    assert projection.get("a", "team-a") == view("a")
    assert projection.statistics().syncs == 1


def test_events_create_change_and_remove_jobs_in_order() -> None:
    projection = synced(view("a"))
    projection.apply(change(11, view("b")))
    projection.apply(change(12, view("a", status=JobStatus.STARTING)))
    projection.apply(change(13, None, job_id="b"))
    assert projection.get("a", "team-a") == view("a", status=JobStatus.STARTING)
    assert projection.get("b", "team-a") is None
    assert projection.revision == 13 and projection.statistics().applied == 3


@pytest.mark.parametrize("seq", [12, 10, 11_000])
def test_an_event_out_of_sequence_is_a_gap(seq: int) -> None:
    projection = synced(view("a"))
    with pytest.raises(ProjectionGap) as caught:
        projection.apply(change(seq, view("a", reason="late")))
    assert caught.value.expected == 11 and caught.value.got == seq
    assert projection.get("a", "team-a") == view("a")  # nothing applied
    projection.lost()
    assert not projection.synced and projection.statistics().gaps == 1


def test_a_new_snapshot_replaces_the_copy() -> None:
    projection = synced(view("a"), view("b"))
    projection.lost()
    projection.begin()
    projection.apply(change(3, view("b", reason="seen again")))  # wrk-ork restarted: from 0
    projection.apply(bookmark(3))
    assert projection.synced and projection.revision == 3
    assert projection.get("a", "team-a") is None  # gone while app-node was not watching
    assert projection.get("b", "team-a") == view("b", reason="seen again")


def test_reads_are_scoped_to_the_team() -> None:
    projection = synced(view("a", team="team-a"), view("b", team="team-b"))
    assert projection.get("b", "team-a") is None
    assert projection.views(["a", "b", "missing"], "team-a") == {"a": view("a")}
    assert projection.views(["a", "b"], "team-b") == {"b": view("b", team="team-b")}


async def test_a_write_waits_until_its_change_is_in(autojump_clock) -> None:
    projection = synced(view("a"))
    mark = projection.mark()
    assert not projection.applied_since("a", mark)
    done = []

    async def write() -> None:
        done.append(await projection.wait_applied("a", mark, timeout_s=5))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        await trio.sleep(1)
        projection.apply(change(11, view("other")))  # another job's change: still waiting
        await trio.sleep(1)
        assert done == []
        projection.apply(change(12, view("a", status=JobStatus.DELETING)))
    assert done == [True]
    # A removal counts too (the job is gone from the copy, its revision kept).
    mark = projection.mark()
    projection.apply(change(13, None, job_id="a"))
    assert projection.applied_since("a", mark)


async def test_a_write_whose_change_never_comes_waits_its_bound_only(autojump_clock) -> None:
    projection = synced(view("a"))
    mark = projection.mark()
    start = trio.current_time()
    assert not await projection.wait_applied("a", mark, timeout_s=2)
    assert trio.current_time() - start == pytest.approx(2)
    assert projection.statistics().write_waits_expired == 1
    # Unsynced (the watch ended): reads go to wrk-ork, nothing to wait for.
    projection.lost()
    assert await projection.wait_applied("a", mark, timeout_s=2)


_ops = st.lists(st.tuples(st.sampled_from(["put", "remove"]), st.integers(0, 5),
                          st.sampled_from(list(JobStatus))), max_size=30)


@given(ops=_ops, lost=st.one_of(st.none(), st.integers(0, 29)),
       replayed=st.one_of(st.none(), st.integers(0, 29)))
@settings(max_examples=200, deadline=None)
def test_the_copy_equals_wrk_orks_jobs_or_says_it_lost_some(ops, lost, replayed) -> None:
    """wrk-ork's jobs change at random; the watch loses one event, or delivers one
    twice, or neither: the copy ends equal to wrk-ork's jobs, or it raised
    ProjectionGap (then the follower rebuilds it), never silently different. (The
    last event lost shows only at the next one: on the channel, events are lost
    only when the watch ends, and its end rebuilds the copy.)"""
    truth: dict[str, JobView] = {"j0": view("j0")}
    projection = synced(truth["j0"], revision=0)
    events = []
    for seq, (op, n, status) in enumerate(ops, start=1):
        job_id = f"j{n}"
        if op == "put":
            truth[job_id] = view(job_id, status=status, reason=str(seq))
            events.append(change(seq, truth[job_id]))
        else:
            truth.pop(job_id, None)
            events.append(change(seq, None, job_id=job_id))
    if lost is not None and lost < len(events):
        del events[lost]
    elif replayed is not None and replayed < len(events):
        events.insert(replayed + 1, events[replayed])
    try:
        for event in events:
            projection.apply(event)
    except ProjectionGap:
        assert len(events) != len(ops)  # only when one was lost or replayed
        return
    assert len(events) == len(ops) or (lost is not None and lost == len(ops) - 1)
    if len(events) == len(ops):
        assert projection._jobs == truth
