"""A job's System log in wrk-monitor shows how far a job that never became Active got.

wrk-monitor, wrk-ork and a worker whose VMIs are real agents run in the test's
trio run (tests/nodes/cluster.py) with telemetry on: wrk-ork, the worker and
the agents ship their log records over the (in-memory) swarm, and the test
reads a job's records back with ``logs.query`` as app-node would. Real time
(wrk-monitor's HTTP side is a real socket), conditions polled, every wait bounded.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from contracts.monitor import SYSTEM, LogRecord

from .cluster import IMAGE, Cluster, cluster, container, status

pytestmark = pytest.mark.slow

ORK, WORKER = "wrk-ork", "wrk-server-k8s-nvidia"


async def wait_logs(path: Cluster, job_id: str,
                    done: Callable[[list[LogRecord]], bool], limit_s: float = 30.0
                    ) -> list[LogRecord]:
    """Poll wrk-monitor until the job's records satisfy ``done``."""
    records: list[LogRecord] = []
    with trio.move_on_after(limit_s):
        while True:
            records = await path.logs(job_id)
            if done(records):
                return records
            await trio.sleep(0.2)
    raise AssertionError(f"job {job_id}'s logs never got there: {lines(records)}")


def lines(records: list[LogRecord]) -> list[str]:
    return [f"{r.service}: {r.text.partition(' | ')[0]}" for r in records]


def has(*needles: str) -> Callable[[list[LogRecord]], bool]:
    return lambda records: all(any(n in line for line in lines(records)) for n in needles)


async def test_a_job_that_never_fits_or_waits_for_gpus_says_so_in_its_system_log(tmp_path):
    with trio.fail_after(120):
        async with cluster(tmp_path, monitor=True) as path:
            too_big = await path.create(container("too-big", gpus=9))
            assert too_big.status.value == "failed"
            records = await wait_logs(path, too_big.id, has(f"{ORK}: failed: "))
            assert all(r.job_id == too_big.id and r.source == SYSTEM for r in records)
            got = lines(records)
            # How far it got: created and queued, never placed; and why it failed.
            assert got[0].startswith(f"{ORK}: created: container job 'too-big'")
            assert got[1] == f"{ORK}: queued: looking for free GPUs"
            failed = next(r for r in records if "failed: " in r.text)
            assert failed.level >= 40 and too_big.reason in failed.text
            assert not any("placed on" in line for line in got)

            first = await path.create(container("first", gpus=8))
            second = await path.create(container("second", gpus=8))
            waiting = await path.create(container("waiting", gpus=8))
            assert waiting.status.value == "pending"
            records = await wait_logs(path, waiting.id, has(f"{ORK}: pending: "))
            assert not any("placed on" in line for line in lines(records))
            # The jobs that fit were placed, and their worker's steps are theirs too.
            await path.wait_job(first.id, status("active"))
            placed = await wait_logs(path, first.id, has(
                f"{ORK}: starting: replica 0 placed on rack {path.worker_key[:12]}… node ",
                f"{WORKER}: create received: GPUs claimed (8 on node ",
                f"{WORKER}: agent ready", f"{ORK}: active"))
            assert all(r.job_id == first.id for r in placed)
            assert any(r.replica == 0 and r.service == WORKER for r in placed)
            await path.delete(second.id)
            await wait_logs(path, second.id, has(f"{ORK}: delete asked", f"{WORKER}: deleted"))


async def test_a_job_whose_agent_fails_at_start_shows_each_step_and_the_reason(tmp_path):
    from agents.inference import InferenceWorkload, SupervisorPolicy
    from contracts.model import JobSpec

    # vLLM is not installed here: the agent starts, says hello, and its model
    # server cannot start; after its retries (a second apart at most, not 30 s)
    # the agent reports failed.
    broken = JobSpec(name="broken", team="t1", type="inference", image=IMAGE, gpus=1,
                     runtime="vllm", model="org/model", served_name="broken")
    quick = SupervisorPolicy(backoff_min_s=0.05, backoff_max_s=1.0)
    with trio.fail_after(150):
        async with cluster(tmp_path, monitor=True,
                           workload=lambda config: InferenceWorkload(config, policy=quick)
                           ) as path:
            job = await path.create(broken)
            failed = await path.wait_job(job.id, status("failed"), limit_s=120)
            records = await wait_logs(path, job.id, has(
                f"{ORK}: starting: replica 0 placed on ", f"{WORKER}: create received",
                f"{WORKER}: creating VMIs", f"{WORKER}: agent hello", f"{WORKER}: agent failed",
                f"{ORK}: failed: "))
            got = lines(records)
            assert not any(f"{ORK}: active" in line for line in got)
            agent_failed = next(r for r in records if r.text.startswith("agent failed"))
            assert agent_failed.level >= 40 and agent_failed.replica == 0
            assert failed.reason and failed.reason in next(
                r.text for r in records if r.service == ORK and r.text.startswith("failed: "))
            # In order: placed before created on the worker before the agent's words.
            # wrk-ork and the worker ship apart, so wrk-monitor holds their records
            # in arrival order; their time stamps (one machine's clock) give the order.
            got = lines(sorted(records, key=lambda r: r.time_ns))
            order = [next(i for i, line in enumerate(got) if needle in line) for needle in (
                "placed on", "create received", "agent hello", "agent failed")]
            assert order == sorted(order)
            # The agent's own words came too, through its worker, stamped with
            # its replica by the worker whatever the agent wrote.
            records = await wait_logs(path, job.id, has("agent-inference: "))
            agent = [r for r in records if r.service == "agent-inference"]
            assert all(r.job_id == job.id and r.replica == 0 for r in agent)


async def test_a_live_follower_sees_a_daemons_record_within_a_second_of_its_sending(tmp_path):
    """wrk-ork logs a job's step in its own process; its shipper pushes it to
    wrk-monitor, which hands it to a follower that was already waiting: the
    delay from the record's own time stamp to its arrival is under 1 s (the
    shipper flushes every 20 ms; the target is the issue's)."""
    import time

    from contracts.health import STATUS, StatusRequest
    from contracts.monitor import FOLLOW, Follow, decode_batch

    with trio.fail_after(90):
        async with cluster(tmp_path, monitor=True) as path:
            assert path.monitor_client is not None
            monitor = path.monitor_client
            # Only the live path is timed: wrk-ork's shipper is connected (a job's
            # records already came through it), not dialling wrk-monitor for the first time.
            warm = await path.create(container("warm-up", gpus=9))
            await wait_logs(path, warm.id, has(f"{ORK}: failed: "))
            arrivals: list[tuple[LogRecord, int]] = []
            async with monitor.stream(FOLLOW, Follow(source=SYSTEM, snapshot=False)) as items:
                # ...and the follower is attached before the records are made: the
                # request was only sent, and a busy wrk-monitor may not have read it yet
                # (without a snapshot, what came before is not sent).
                with trio.fail_after(20):
                    while True:
                        status_now = await monitor.call(STATUS, StatusRequest(), timeout_s=10)
                        if status_now.details["followers"] >= 1:
                            break
                        await trio.sleep(0.02)
                job = await path.create(container("followed", gpus=9))  # fails at once
                async for item in items:
                    now = time.time_ns()
                    arrivals += [(r, now) for r in decode_batch(item.records)
                                 if r.job_id == job.id]
                    if any(r.text.startswith("failed: ") for r, _ in arrivals):
                        break
            delays_ms = [(now - r.time_ns) / 1e6 for r, now in arrivals]
            assert arrivals[0][0].text.startswith("created: ")
            assert max(delays_ms) < 1000, delays_ms
