"""The worker's System log lines: one per step, under the job (``extra``), failures
as errors, a disk import's progress at most once per 10 % step of each VMI."""

from __future__ import annotations

import logging

import trio

from contracts.model import NodeShare, ReplicaPlacement
from contracts.operations import CreateReplica, DeleteReplica
from nodes.k8s_worker.backend import ReplicaUnit, VmiPhase
from nodes.k8s_worker.store import WorkerStore

from ...p2p.helpers import wait_until
from .worker_harness import RACK, SPEC, AgentEvent, FakeBackend, Harness

ONE_NODE = ReplicaPlacement(rack=RACK, shares=(NodeShare(node="n1", gpus=8),))
SMALL = SPEC.model_copy(update={"gpus": 8})
NAME = "cac-1-r0-n0"


class ImportingBackend(FakeBackend):
    """Creates a VMI whose disk imports in 0.5 % steps (as CDI reports it), then runs."""

    async def create(self, unit: ReplicaUnit) -> None:
        self._check("create", unit)
        for vmi in unit.vmis:
            self.vmis.setdefault(vmi.name, unit.generation)
            for tenth in range(0, 1001, 5):
                await self._emit(vmi, VmiPhase.PROVISIONING, unit.generation,
                                 f"DataVolume importing {tenth / 10:.1f}%")
            await self._emit(vmi, VmiPhase.BOOTING, unit.generation, "VMI scheduled on n1")
            await self._emit(vmi, VmiPhase.RUNNING, unit.generation, "VMI running on n1")


def job_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name == "nodes.k8s_worker.worker" and getattr(r, "job_id", None) == "j-1"]


async def test_every_step_is_a_line_of_the_job_and_progress_is_thinned(thread_clock, caplog):
    caplog.set_level(logging.INFO)
    harness = Harness(WorkerStore.open(None), ImportingBackend())
    async with trio.open_nursery() as nursery:
        await nursery.start(harness.worker.run)
        await harness.worker.apply(CreateReplica(op_id="op-c", job_id="j-1", replica=0,
                                                 spec=SMALL, placement=ONE_NODE))
        await wait_until(lambda: any("VMI running" in r.getMessage()
                                     for r in job_lines(caplog)))
        await harness.registry.send.send(AgentEvent(NAME, "failed", "model server exited 1",
                                                    generation=0))
        await wait_until(lambda: any("agent failed" in r.getMessage()
                                     for r in job_lines(caplog)))
        await harness.worker.apply(DeleteReplica(op_id="op-d", job_id="j-1", replica=0))
        await wait_until(lambda: any(r.getMessage().startswith("deleted")
                                     for r in job_lines(caplog)))
        nursery.cancel_scope.cancel()
    lines = job_lines(caplog)
    assert all(r.replica == 0 for r in lines)
    texts = [r.getMessage().partition(" | ")[0] for r in lines]
    assert texts[0] == "create received: GPUs claimed (8 on node n1)"
    assert texts[1] == f"creating VMIs {NAME}"
    progress = [t for t in texts if t.startswith("DataVolume importing")]
    # 201 progress lines from the cluster, one logged per 10 % step (0 … 100).
    assert progress == [f"DataVolume importing {step * 10:.1f}%" for step in range(11)]
    for text in ("VMI scheduled on n1", "VMI running on n1",
                 "agent failed: model server exited 1", "delete received", "deleted"):
        assert text in texts
    failed = next(r for r in lines if "agent failed" in r.getMessage())
    assert failed.levelno == logging.ERROR
