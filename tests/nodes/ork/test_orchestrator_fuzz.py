"""Random sequences of requests, worker reports, silences and restarts of wrk-ork:
the claims always match the replicas holding GPUs, every status change is in the
table, every job's status is what its replicas say, and a reopened store is the same."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from contracts.model import ReplicaState
from contracts.operations import CreateReplica, DeleteReplica, ReplicaReport, RestartReplica
from nodes.ork.errors import OrkError
from nodes.ork.status import derive_job_status
from tests.examples import examples

from .world import RACK, World, container, inference

STATES = [ReplicaState.STARTING, ReplicaState.ACTIVE, ReplicaState.FAILED,
          ReplicaState.RESTARTING, ReplicaState.UNKNOWN, ReplicaState.DELETED]


class OrkMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ork-fuzz-"))
        self.world = World(self.dir / "ork.sqlite", nodes=(4, 4, 2))
        #: Operations published and not yet carried out by the fake worker.
        self.queue: list = []

    def teardown(self) -> None:
        self.world.orch.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _job_ids(self) -> list[str]:
        return [job.id for job in self.world.orch.list_jobs()]

    @rule(gpus=st.integers(1, 5), replicas=st.integers(1, 3), shell=st.booleans())
    def create(self, gpus, replicas, shell):
        spec = container(gpus) if shell else inference(gpus, replicas)
        self.world.create(spec)

    @rule(pick=st.integers(0, 10), action=st.sampled_from(
        ["restart", "delete", "restart_replica", "delete_replica"]), replica=st.integers(0, 2))
    def act(self, pick, action, replica):
        ids = self._job_ids()
        if not ids:
            return
        job = ids[pick % len(ids)]
        orch, now = self.world.orch, self.world.now
        try:
            if action == "restart":
                orch.restart_job(job, now)
            elif action == "delete":
                orch.delete_job(job, now)
            elif action == "restart_replica":
                orch.restart_replica(job, replica, now)
            else:
                orch.delete_replica(job, replica, now)
        except OrkError:
            pass

    @rule()
    def publish(self):
        self.queue += self.world.published()

    @rule(state=st.sampled_from(STATES), pick=st.integers(0, 20))
    def worker_says(self, state, pick):
        """The worker reports anything about some replica (maybe a stale generation)."""
        jobs = self.world.orch.list_jobs()
        replicas = [(job.id, r) for job in jobs for r in job.replicas if r.placement]
        if not replicas:
            return
        job_id, replica = replicas[pick % len(replicas)]
        generation = max(0, replica.generation - pick % 2)
        self.world.now += 1
        self.world.orch.on_report(RACK, ReplicaReport(
            job_id=job_id, replica=replica.index, state=state, generation=generation,
            at=self.world.now), self.world.now)

    @rule()
    def worker_carries_out_one(self):
        """The worker does the oldest operation and reports its outcome."""
        if not self.queue:
            return
        op = self.queue.pop(0)
        say = self.world.say
        try:
            if isinstance(op, CreateReplica | RestartReplica):
                say(op.replica, "active", job=op.job_id, generation=op.generation)
            elif isinstance(op, DeleteReplica):
                say(op.replica, "deleted", job=op.job_id, generation=0)
                # Whatever generation it had: the worker removes everything.
                for gen in range(1, 4):
                    say(op.replica, "deleted", job=op.job_id, generation=gen)
        except OrkError:
            pass  # the job is gone already

    @rule(dt=st.sampled_from([1.0, 30.0, 61.0]))
    def time_passes(self, dt):
        self.world.advance(dt)

    @rule()
    def rack_reports(self):
        self.world.hear()

    @rule()
    def reopen(self):
        before = (self.world.orch.list_jobs(), self.world.orch.outbox(),
                  self.world.orch.nodes())
        self.world.reopen()
        assert (self.world.orch.list_jobs(), self.world.orch.outbox(),
                self.world.orch.nodes()) == before

    @invariant()
    def claims_match_the_replicas_holding_gpus(self):
        orch = self.world.orch
        claimed: dict[str, int] = {}
        for job in orch.book.jobs.values():
            for replica in job.replicas.values():
                if replica.claimed:
                    for share in replica.placement.shares:
                        claimed[share.node] = claimed.get(share.node, 0) + share.gpus
        for node in orch.nodes():
            assert node.free == max(0, node.gpus - claimed.get(node.name, 0)), node

    @invariant()
    def statuses_are_derived_and_every_change_is_in_the_table(self):
        orch = self.world.orch
        assert orch.statistics().unexpected_transitions == 0
        for job in orch.book.jobs.values():
            assert job.status is derive_job_status(
                [r.status for r in job.replicas.values()], orch.book.flags(job))
            assert job.replicas, "a job without replicas must be gone"


OrkMachine.TestCase.settings = settings(max_examples=examples(60), stateful_step_count=40,
                                        deadline=None)
test_orchestrator_under_random_sequences = OrkMachine.TestCase
