"""The supervisor's rules with plain processes (sh, sleep): steps in order,
bounded waits, restarts with backoff, giving up, and output as Application logs."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import trio

from agents.inference import ModelServerFailed, ModelSupervisor, SupervisorPolicy
from agents.inference.runtimes import Lifetime, RuntimePlan, Step, StepRole
from contracts.model import Runtime

from ...p2p.helpers import wait_until

QUICK = SupervisorPolicy(backoff_min_s=0.05, backoff_max_s=0.1, max_crashes=3,
                         stable_after_s=30.0)


def plan(*steps: Step) -> RuntimePlan:
    # A plan that does not listen: healthy while its kept steps live (a Ray worker's).
    return RuntimePlan(runtime=Runtime.VLLM, steps=steps, listens=False, base_url=None,
                       health_path=None, deep_check=None, startup_timeout_s=10.0)


def sh(name: str, script: str, *, keep: bool = True, timeout_s: float | None = None) -> Step:
    return Step(name=name, argv=("sh", "-c", script), role=StepRole.RAY_WORKER if keep
                else StepRole.WAIT, lifetime=Lifetime.KEEP_RUNNING if keep
                else Lifetime.RUN_TO_EXIT, timeout_s=None if keep else timeout_s,
                stop_timeout_s=2.0)


class Health:
    def __init__(self) -> None:
        self.changes: list[tuple[bool, str]] = []

    def __call__(self, healthy: bool, why: str) -> None:
        self.changes.append((healthy, why))


async def test_steps_run_in_order_and_their_output_becomes_application_logs(caplog):
    caplog.set_level(logging.INFO, logger="cosmicac.agent.application")
    health = Health()
    supervisor = ModelSupervisor(plan(sh("wait", "echo waited; exit 0", keep=False,
                                         timeout_s=10),
                                      sh("worker", "echo started >&2; exec sleep 60")),
                                 on_health=health, job_id="j-1", policy=QUICK)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        await wait_until(lambda: health.changes == [(True, "ray worker joined")], limit_s=10)
        await wait_until(lambda: any("started" in r.getMessage() for r in caplog.records),
                         limit_s=10)
        nursery.cancel_scope.cancel()
    lines = [(r.getMessage(), r.step, r.stream, r.job_id) for r in caplog.records
             if r.name == "cosmicac.agent.application"]
    assert ("waited", "wait", "stdout", "j-1") in lines
    assert ("started", "worker", "stderr", "j-1") in lines


async def test_a_kept_step_that_dies_restarts_the_plan_then_gives_up_with_its_last_words():
    health = Health()
    supervisor = ModelSupervisor(plan(sh("worker", "echo 'cuda: out of memory' >&2; exit 3")),
                                 on_health=health, policy=QUICK)
    with pytest.raises(ModelServerFailed) as caught, trio.fail_after(20):
        await supervisor.run()
    assert supervisor.starts == 3
    assert "failed 3 times" in str(caught.value)
    assert "worker exited with status 3: cuda: out of memory" in str(caught.value)


async def test_a_killed_step_is_restarted_and_healthy_again():
    health = Health()
    supervisor = ModelSupervisor(plan(sh("worker", "exec sleep 60")), on_health=health,
                                 policy=QUICK)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervisor.run)
        await wait_until(lambda: supervisor.healthy, limit_s=10)
        first = supervisor.pids["worker"]
        os.kill(first, signal.SIGKILL)
        await wait_until(lambda: supervisor.starts == 2 and supervisor.healthy, limit_s=10)
        assert supervisor.pids["worker"] != first
        assert [healthy for healthy, _ in health.changes] == [True, False, True]
        assert "worker killed by SIGKILL" in health.changes[1][1]
        nursery.cancel_scope.cancel()


async def test_a_wait_step_that_hangs_is_killed_at_its_deadline():
    supervisor = ModelSupervisor(plan(sh("wait", "exec sleep 60", keep=False, timeout_s=0.1),
                                      sh("worker", "exec sleep 60")),
                                 on_health=Health(), policy=QUICK)
    with pytest.raises(ModelServerFailed, match=r"wait did not finish within 0\.1 s"), \
            trio.fail_after(20):
        await supervisor.run()


async def test_a_missing_program_is_a_clear_failure():
    step = Step(name="vllm", argv=("/nonexistent/vllm", "serve"), role=StepRole.RAY_WORKER,
                lifetime=Lifetime.KEEP_RUNNING)
    supervisor = ModelSupervisor(plan(step), on_health=Health(), policy=QUICK)
    with pytest.raises(ModelServerFailed, match="cannot start vllm"), trio.fail_after(20):
        await supervisor.run()
