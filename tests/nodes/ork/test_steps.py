"""wrk-ork's System lines: a sentence per status change (what, where, why), its
level (Failed an error, Unknown and Degraded warnings), and the machine tail
bench/job_start.py reads (``ork.job_status job=… status=… `` … ``at=`` last);
and the orchestrator's real events through the service's pump carry the job."""

from __future__ import annotations

import logging

import pytest

from contracts.model import JobSpec, JobStatus, NodeInfo, RackReport
from contracts.operations import RackUpdate
from contracts.ork import JobEvent
from nodes.ork.orchestrator import Orchestrator
from nodes.ork.service import OrkService
from nodes.ork.steps import step_line

RACK = "ab" * 32
S = JobStatus


def event(status, previous, reason="") -> JobEvent:
    return JobEvent(job_id="j-1", team="t1", status=status, previous=previous, reason=reason,
                    at=1764640000.25)


@pytest.mark.parametrize("status, previous, reason, level, head", [
    (S.QUEUED, S.CREATING, "", logging.INFO, "queued: looking for free GPUs"),
    (S.PENDING, S.QUEUED, "no room now for 2 GPUs", logging.INFO,
     "pending: no room now for 2 GPUs"),
    (S.QUEUED, S.PENDING, "capacity freed", logging.INFO, "queued again: capacity freed"),
    (S.FAILED, S.STARTING, "agent failed: exit 1", logging.ERROR,
     "failed: agent failed: exit 1"),
    (S.UNKNOWN, S.ACTIVE, "no report from rack ab for 60 s", logging.WARNING,
     "unknown: no report from rack ab for 60 s"),
    (S.DEGRADED, S.ACTIVE, "VMI failed", logging.WARNING, "degraded: VMI failed"),
    (S.RESTARTING, S.ACTIVE, "restart asked", logging.INFO,
     "restarting: replacing its VMIs, keeping storage (restart asked)"),
    (S.ACTIVE, S.STARTING, "", logging.INFO, "active: every replica's agent is ready"),
    (None, S.DELETING, "deleted", logging.INFO, "deleted"),
])
def test_each_status_change_reads_as_a_sentence(status, previous, reason, level, head):
    got_level, text = step_line(event(status, previous, reason), None)
    assert got_level == level
    line, _, tail = text.partition(" | ")
    assert line.startswith(head), line
    assert tail.startswith(f"ork.job_status job=j-1 status={status} ")
    assert float(tail.rpartition("at=")[2]) == 1764640000.25


def test_a_job_that_never_fits_says_how_far_it_got_through_the_pump(caplog):
    caplog.set_level(logging.INFO)
    orch = Orchestrator.open(None)
    service = OrkService(orch, allow=lambda key: True, clock=lambda: 100.0)
    orch.register_rack(RACK, "default", 1.0)
    orch.on_report(RACK, RackUpdate(rack=RackReport(nodes=(NodeInfo(name="n1", gpus=2),)),
                                    at=1.0), 1.0)
    small = JobSpec(name="box", team="t1", type="container", gpus=1,
                    image="docker://registry.example/cosmicac/ubuntu:1")
    placed = orch.create_job(small, 2.0)
    waiting = orch.create_job(small.model_copy(update={"name": "box2", "gpus": 2}), 3.0)
    service.pump()
    lines = {job: [r for r in caplog.records if getattr(r, "job_id", None) == job]
             for job in (placed.id, waiting.id)}
    heads = {job: [r.getMessage().partition(" | ")[0] for r in records]
             for job, records in lines.items()}
    assert heads[placed.id][0].startswith("created: container job 'box' of team t1, "
                                          "1 replica(s) of 1 GPU(s) in location default")
    assert heads[placed.id][1] == "queued: looking for free GPUs"
    assert heads[placed.id][2] == (f"starting: replica 0 placed on rack {RACK[:12]}… "
                                   "node n1 (1 GPU); creating its VMIs")
    assert heads[waiting.id][2].startswith("pending: ")
    assert "GPU" in heads[waiting.id][2]
