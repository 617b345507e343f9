"""The cosmicac-ork/1 RPC service over in-memory mux channels: every method, its
error codes, authorisation by the caller's key, and the jobs.watch stream."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from pydantic import BaseModel

from contracts.model import JobStatus
from contracts.ork import (
    CREATE_JOB,
    DELETE_JOB,
    DELETE_REPLICA,
    GET_JOB,
    LIST_JOBS,
    LIST_NODES,
    LIST_RACKS,
    REGISTER_RACK,
    RELEASE_NODES,
    REMOVE_RACK,
    RESERVE_NODES,
    RESTART_JOB,
    RESTART_REPLICA,
    WATCH_JOBS,
    CreateJob,
    Empty,
    JobRef,
    JobResult,
    ListJobs,
    RackRef,
    RegisterRack,
    ReleaseNodes,
    ReplicaRef,
    ReserveNodes,
    WatchJobs,
)
from nodes.ork import service as ork_service
from p2p.rpc import Method, RpcError

from .support import STRANGER, Harness, connect
from .world import RACK, container, inference

J = JobStatus


class LooseCreate(BaseModel):
    """jobs.create's params as a client that does not validate them sends them."""

    spec: dict


LOOSE_CREATE = Method("jobs.create", params=LooseCreate, result=JobResult)


async def test_jobs_are_created_read_listed_restarted_and_deleted(nursery, autojump_clock):
    harness = Harness()
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            created = (await client.call(CREATE_JOB, CreateJob(spec=container(gpus=2)))).job
            assert created.status is J.STARTING and created.id.startswith("j-")
            assert harness.changes == 1
            assert [o.op.job_id for o in harness.world.orch.outbox()] == [created.id]
            got = (await client.call(GET_JOB, JobRef(job_id=created.id))).job
            assert got == created
            listed = (await client.call(LIST_JOBS, ListJobs(team="team-a"))).jobs
            assert [j.id for j in listed] == [created.id]
            assert (await client.call(LIST_JOBS, ListJobs(team="team-z"))).jobs == []
            assert harness.changes == 1  # reads change nothing and wake nobody
            harness.report(created.id, 0, "active")
            restarted = (await client.call(RESTART_JOB, JobRef(job_id=created.id))).job
            assert restarted.status is J.RESTARTING
            deleted = (await client.call(DELETE_JOB, JobRef(job_id=created.id))).job
            assert deleted is not None and deleted.status is J.DELETING


async def test_jobs_list_pages_by_cursor_and_answers_ids(nursery, autojump_clock):
    harness = Harness()
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            made = []
            for _ in range(5):
                harness.world.now += 1
                made.append((await client.call(CREATE_JOB, CreateJob(
                    spec=container(gpus=1)))).job.id)
            seen, after, pages = [], None, 0
            while True:
                page = await client.call(LIST_JOBS, ListJobs(after=after, limit=2))
                seen += [job.id for job in page.jobs]
                pages += 1
                if page.next is None:
                    break
                after = page.next
                # A job deleted between pages does not move the cursor.
                if pages == 1:
                    await client.call(DELETE_JOB, JobRef(job_id=made[0]))
            assert seen == made and pages == 3
            picked = await client.call(LIST_JOBS, ListJobs(ids=[made[3], "j-nope", made[1]]))
            assert [job.id for job in picked.jobs] == [made[3], made[1]] and picked.next is None
            other = await client.call(LIST_JOBS, ListJobs(team="team-z", ids=[made[3]]))
            assert other.jobs == []
            with pytest.raises(RpcError) as caught:
                await client.call(LIST_JOBS, {"limit": 10_000})
            assert caught.value.code == "BAD_PARAMS"


async def test_a_pending_job_is_gone_at_once_on_delete(nursery, autojump_clock):
    harness = Harness()
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            await client.call(CREATE_JOB, CreateJob(spec=container(gpus=4)))
            await client.call(CREATE_JOB, CreateJob(spec=container(gpus=4)))
            waiting = (await client.call(CREATE_JOB, CreateJob(spec=container(gpus=4)))).job
            assert waiting.status is J.PENDING
            result = await client.call(DELETE_JOB, JobRef(job_id=waiting.id))
            assert result.job is None


async def test_errors_carry_stable_codes(nursery, autojump_clock):
    harness = Harness()
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            with pytest.raises(RpcError) as info:
                await client.call(GET_JOB, JobRef(job_id="j-0000000000000000"))
            assert info.value.code == "NOT_FOUND"
            shell = (await client.call(CREATE_JOB, CreateJob(spec=container()))).job
            with pytest.raises(RpcError) as info:
                await client.call(RESTART_REPLICA, ReplicaRef(job_id=shell.id, replica=0))
            assert info.value.code == "BAD_REQUEST"
            llm = (await client.call(CREATE_JOB, CreateJob(spec=inference()))).job
            harness.report(llm.id, 0, "active")
            with pytest.raises(RpcError) as info:
                await client.call(DELETE_REPLICA, ReplicaRef(job_id=llm.id, replica=0))
            assert info.value.code == "INVALID_STATE"
            assert "whole job" in info.value.message
            view = (await client.call(RESTART_REPLICA, ReplicaRef(job_id=llm.id, replica=1))).job
            assert view.replicas[1].generation == 1
            # A spec that fails validation is refused by the RPC layer, fields named.
            bad = container().model_dump(mode="json") | {"gpus": 0}
            with pytest.raises(RpcError) as info:
                await client.call(LOOSE_CREATE, LooseCreate(spec=bad))
            assert info.value.code == "INVALID_PARAMS" and "gpus" in info.value.message


@pytest.mark.parametrize("key", [STRANGER, None])
async def test_callers_other_than_app_node_are_forbidden(nursery, autojump_clock, key):
    harness = Harness()
    async with connect(nursery, harness, key=key) as client:
        with trio.fail_after(10):
            with pytest.raises(RpcError) as info:
                await client.call(CREATE_JOB, CreateJob(spec=container()))
            assert info.value.code == "FORBIDDEN"
            with pytest.raises(RpcError) as info:
                await client.call(LIST_RACKS, Empty())
            assert info.value.code == "FORBIDDEN"
            with pytest.raises(RpcError) as info:
                async with client.stream(WATCH_JOBS, WatchJobs()) as events:
                    async for _ in events:
                        pass
            assert info.value.code == "FORBIDDEN"
    assert harness.world.orch.list_jobs() == []


async def test_racks_and_nodes(nursery, autojump_clock):
    harness = Harness()
    other = "cd" * 32
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            rack = (await client.call(REGISTER_RACK, RegisterRack(rack=other.upper(),
                                                                  location="eu-1",
                                                                  name="spare"))).rack
            assert (rack.key, rack.location, rack.reported) == (other, "eu-1", False)
            racks = (await client.call(LIST_RACKS, Empty())).racks
            assert [r.key for r in racks] == [RACK, other]
            with pytest.raises(RpcError) as info:
                await client.call(REGISTER_RACK, RegisterRack(rack=other, location="us-1"))
            assert info.value.code == "BAD_REQUEST"
            await client.call(REMOVE_RACK, RackRef(rack=other))
            with pytest.raises(RpcError) as info:
                await client.call(REMOVE_RACK, RackRef(rack=other))
            assert info.value.code == "NOT_FOUND"

            await client.call(RESERVE_NODES, ReserveNodes(rack=RACK, nodes=["n1"],
                                                          team="team-b"))
            nodes = (await client.call(LIST_NODES, Empty())).nodes
            assert [(n.name, n.gpus, n.free, n.reserved_for) for n in nodes] == [
                ("n0", 4, 4, None), ("n1", 4, 4, "team-b")]
            with pytest.raises(RpcError) as info:
                await client.call(RESERVE_NODES, ReserveNodes(rack=RACK, nodes=["n1"],
                                                              team="team-c"))
            assert info.value.code == "INVALID_STATE"
            job = (await client.call(CREATE_JOB, CreateJob(spec=container(gpus=1)))).job
            with pytest.raises(RpcError) as info:
                await client.call(REMOVE_RACK, RackRef(rack=RACK))
            assert info.value.code == "INVALID_STATE" and job.id in info.value.message
            await client.call(RELEASE_NODES, ReleaseNodes(rack=RACK, nodes=["n1"]))
            nodes = (await client.call(LIST_NODES, Empty())).nodes
            assert [n.reserved_for for n in nodes] == [None, None]


async def test_watch_streams_status_changes_as_they_happen(nursery, autojump_clock):
    harness = Harness()
    seen: list[tuple] = []
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            done = trio.Event()

            async def watch(params: WatchJobs, count: int, into: list) -> None:
                async with client.stream(WATCH_JOBS, params) as events:
                    async for event in events:
                        into.append((event.job_id, event.previous, event.status))
                        if len(into) == count:
                            break
                done.set()

            nursery.start_soon(watch, WatchJobs(team="team-a"), 5, seen)
            await trio.testing.wait_all_tasks_blocked()
            assert harness.service.watchers == 1
            other_team = (await client.call(
                CREATE_JOB, CreateJob(spec=container(team="team-b")))).job
            job = (await client.call(CREATE_JOB, CreateJob(spec=container()))).job
            harness.report(job.id, 0, "active")
            harness.report(other_team.id, 0, "active")
            await client.call(DELETE_JOB, JobRef(job_id=job.id))
            await done.wait()
            assert seen == [(job.id, None, J.CREATING), (job.id, J.CREATING, J.QUEUED),
                            (job.id, J.QUEUED, J.STARTING), (job.id, J.STARTING, J.ACTIVE),
                            (job.id, J.ACTIVE, J.DELETING)]
            await trio.testing.wait_all_tasks_blocked()
            assert harness.service.watchers == 0

            # A snapshot first gives the current status of each matching job.
            snap: list[tuple] = []
            done = trio.Event()
            nursery.start_soon(watch, WatchJobs(job_id=other_team.id, snapshot=True), 2, snap)
            await trio.testing.wait_all_tasks_blocked()
            harness.world.orch.restart_job(other_team.id, harness.world.now)
            harness.service.pump()
            await done.wait()
            assert snap == [(other_team.id, J.ACTIVE, J.ACTIVE),
                            (other_team.id, J.ACTIVE, J.RESTARTING)]


async def test_a_watcher_that_falls_behind_is_ended_with_lagged(nursery, autojump_clock,
                                                               monkeypatch):
    monkeypatch.setattr(ork_service, "WATCH_BUFFER", 3)
    harness = Harness()
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            got = []
            with pytest.raises(RpcError) as info:
                async with client.stream(WATCH_JOBS, WatchJobs()) as events:
                    await trio.testing.wait_all_tasks_blocked()
                    for _ in range(5):  # 3 events each, no checkpoint between
                        harness.world.orch.create_job(container(), harness.world.now)
                    harness.service.pump()
                    async for event in events:
                        got.append(event)
            assert info.value.code == "LAGGED"
            # The buffer's 3, plus the one handed straight to the waiting stream.
            assert len(got) == 4
            assert harness.service.watchers == 0


async def test_a_views_watch_numbers_every_change_of_a_view_after_its_snapshot(
        nursery, autojump_clock):
    harness = Harness()
    async with connect(nursery, harness) as client:
        with trio.fail_after(10):
            job = (await client.call(CREATE_JOB, CreateJob(spec=inference(replicas=2)))).job
            assert job.status is J.STARTING
            views: list = []
            plain: list = []

            async def watch(params: WatchJobs, count: int, into: list) -> None:
                async with client.stream(WATCH_JOBS, params) as events:
                    async for event in events:
                        into.append(event)
                        if len(into) == count:
                            break

            nursery.start_soon(watch, WatchJobs(snapshot=True, views=True), 4, views)
            nursery.start_soon(watch, WatchJobs(), 1, plain)
            await trio.testing.wait_all_tasks_blocked()
            # One replica runs, the other still starts: the job stays Starting, so
            # only the views watch hears of it.
            harness.report(job.id, 0, "active")
            await client.call(DELETE_JOB, JobRef(job_id=job.id))
            await trio.testing.wait_all_tasks_blocked()
            snapshot, bookmark, replica_up, deleting = views
            revision = bookmark.seq
            assert (snapshot.job_id, snapshot.seq, snapshot.job) == (job.id, revision, job)
            assert bookmark.bookmark and bookmark.job_id == "" and bookmark.job is None
            assert replica_up.seq == revision + 1
            assert replica_up.previous is replica_up.status is J.STARTING
            assert replica_up.job is not None
            assert [r.status.value for r in replica_up.job.replicas] == ["active", "starting"]
            assert deleting.seq == revision + 2 and deleting.status is J.DELETING
            assert deleting.job is not None and deleting.job.status is J.DELETING
            # The plain watch: the status change only, as an older peer reads it.
            [event] = plain
            assert (event.previous, event.status, event.seq, event.job) == (
                J.STARTING, J.DELETING, 0, None)
            assert set(event.model_dump()) == {"job_id", "team", "status", "previous",
                                               "reason", "at"}
            assert WatchJobs(snapshot=True).model_dump() == {
                "job_id": None, "team": None, "snapshot": True}


async def test_a_views_watch_of_nothing_opens_with_a_bookmark(nursery, autojump_clock):
    harness = Harness()
    async with connect(nursery, harness) as client, \
            client.stream(WATCH_JOBS, WatchJobs(views=True)) as events:
        with trio.fail_after(10):
            first = await events.__anext__()
            assert first.bookmark and first.seq == harness.service.revision == 0
            job = (await client.call(CREATE_JOB, CreateJob(spec=container()))).job
            seqs = []
            async for event in events:
                seqs.append(event.seq)
                assert event.job_id == job.id and event.job is not None
                if event.status is J.STARTING:
                    break
            assert seqs == [1, 2, 3]  # Creating, Queued, Starting: one each, no gap
