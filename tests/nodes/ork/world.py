"""A small world for orchestrator tests: one or two racks, a clock, a worker's reports."""

from __future__ import annotations

import itertools
from pathlib import Path

from contracts.model import JobSpec, JobStatus, NodeInfo, RackReport, ReplicaState
from contracts.operations import RackUpdate, ReplicaReport
from contracts.ork import JobView
from nodes.ork.orchestrator import Orchestrator

RACK = "ab" * 32
OTHER_RACK = "cd" * 32
IMAGE = "docker://registry.local/jobs/app:1"
UNKNOWN_AFTER_S = 60.0


def container(gpus: int = 1, *, team: str = "team-a", location: str = "default") -> JobSpec:
    return JobSpec(name="shell", team=team, type="container", image=IMAGE, gpus=gpus,
                   location=location)


_served = itertools.count()


def inference(gpus: int = 1, replicas: int = 2, *, team: str = "team-a",
              served_name: str | None = None) -> JobSpec:
    """An inference job; each gets its own served name unless one is given
    (a team cannot serve one name twice)."""
    return JobSpec(name="llm", team=team, type="inference", image=IMAGE, gpus=gpus,
                   replicas=replicas, runtime="vllm", model="demo",
                   served_name=served_name or f"demo-{next(_served)}")


class World:
    """An orchestrator with one rack (``nodes`` of GPUs each), a clock and a worker."""

    def __init__(self, path: Path | None = None, *, nodes: tuple[int, ...] = (8,),
                 register: bool = True) -> None:
        self.now = 1000.0
        self.path = path
        self.orch = Orchestrator.open(path, unknown_after_s=UNKNOWN_AFTER_S)
        self.report = RackReport(nodes=tuple(NodeInfo(name=f"n{i}", gpus=g)
                                             for i, g in enumerate(nodes)))
        self.job_id = ""
        self.blocker = ""
        if register:
            self.orch.register_rack(RACK, "default", self.now, name="rack-1")
            self.hear()

    def reopen(self) -> None:
        self.orch.close()
        self.orch = Orchestrator.open(self.path, unknown_after_s=UNKNOWN_AFTER_S)

    def advance(self, dt: float) -> None:
        self.now += dt
        self.orch.tick(self.now)

    def hear(self, rack: str = RACK) -> None:
        """The worker's periodic rack report."""
        self.orch.on_report(rack, RackUpdate(rack=self.report, at=self.now), self.now)

    def silence(self) -> None:
        """The rack says nothing for longer than unknown_after_s."""
        self.advance(UNKNOWN_AFTER_S + 1)

    def create(self, spec: JobSpec) -> JobView:
        self.now += 1
        view = self.orch.create_job(spec, self.now)
        self.job_id = view.id
        return view

    def say(self, replica: int, state: ReplicaState | str, *, job: str | None = None,
            generation: int | None = None, rack: str = RACK, message: str = "",
            gateway=None) -> None:
        """The worker reports a replica's state (its current generation by default)."""
        job = job or self.job_id
        if generation is None:
            view = self.orch.get_job(job)
            generation = next(r.generation for r in view.replicas if r.index == replica)
        self.now += 1
        self.orch.on_report(rack, ReplicaReport(job_id=job, replica=replica,
                                                state=ReplicaState(state), generation=generation,
                                                message=message, at=self.now, gateway=gateway),
                            self.now)

    def status(self, job: str | None = None) -> JobStatus:
        return self.orch.get_job(job or self.job_id).status

    def replicas(self, job: str | None = None) -> dict[int, str]:
        return {r.index: r.status.value for r in self.orch.get_job(job or self.job_id).replicas}

    def published(self) -> list:
        """Take the outbox as the daemon would: the ops, then mark them published."""
        ops = [out.op for out in self.orch.outbox()]
        self.orch.mark_published([op.op_id for op in ops])
        return ops

    def changes(self) -> list[tuple[JobStatus | None, JobStatus | None]]:
        return [(e.previous, e.status) for e in self.orch.drain_events()]

    # -- steps for the table-driven tests ----------------------------------------------

    def do(self, step) -> None:
        match step:
            case "one":
                self.create(container())
            case "two":
                self.create(inference())
            case "pending":
                self.blocker = self.create(container(gpus=8)).id
                self.create(container())
            case "free":
                self.orch.delete_job(self.blocker, self.now)
                self.say(0, "deleted", job=self.blocker)
            case "unplaceable":
                self.create(container(location="nowhere"))
            case "restart":
                self.orch.restart_job(self.job_id, self.now)
            case "delete":
                self.orch.delete_job(self.job_id, self.now)
            case "silence":
                self.silence()
            case "hear":
                self.hear()
            case (replica, state):
                self.say(replica, state)
            case _:
                raise AssertionError(f"unknown step {step!r}")


#: How to bring a job to each status (steps of World.do).
SETUPS = {
    "none": [],
    "starting1": ["one"],
    "starting2": ["two"],
    "active1": ["one", (0, "active")],
    "active2": ["two", (0, "active"), (1, "active")],
    "degraded": ["two", (0, "active"), (1, "active"), (0, "failed")],
    "restarting1": ["one", (0, "active"), "restart"],
    "restarting2": ["two", (0, "active"), (1, "active"), "restart"],
    "worker_restarting": ["one", (0, "active"), (0, "restarting")],
    "failed1": ["one", (0, "active"), (0, "failed")],
    "failed2": ["two", (0, "failed"), (1, "failed")],
    "unknown1": ["one", (0, "active"), "silence"],
    "unknown_starting": ["one", "silence"],
    "unknown_degraded": ["two", (0, "active"), (1, "active"), (0, "failed"), "silence"],
    "unknown_failed": ["one", (0, "failed"), "silence"],
    "unknown_restarting": ["one", (0, "active"), "restart", "silence"],
    "pending": ["pending"],
    "unplaceable": ["unplaceable"],
    "deleting": ["one", (0, "active"), "delete"],
}
