"""The worker core: operations applied once, the backend reconciled, states reported.

A small in-memory backend (a fake, not a mock: it keeps VMIs and emits the
events a cluster would) and a registry fed by the test stand in for KubeVirt
and the agents; the real ones are tested in their own files and end to end.
"""

from __future__ import annotations

import pytest
import trio

from contracts.model import ReplicaState
from contracts.operations import CreateReplica, DeleteReplica, RackUpdate, RestartReplica
from nodes.k8s_worker.backend import BackendError, token_digest
from nodes.k8s_worker.store import WorkerStore

from ...p2p.helpers import wait_until
from .worker_harness import SPEC, TWO_NODES, WORKER_KEY, AgentEvent, FakeBackend, Harness


def create(op_id: str = "op-c") -> CreateReplica:
    return CreateReplica(op_id=op_id, job_id="j-1", replica=0, spec=SPEC, placement=TWO_NODES)


NAMES = ("cac-1-r0-n0", "cac-1-r0-n1")


async def test_a_replica_is_active_once_every_vmi_runs_and_every_agent_is_ready(thread_clock):
    harness = Harness(WorkerStore.open(None))
    async with trio.open_nursery() as nursery:
        await nursery.start(harness.worker.run)
        await harness.worker.apply(create())
        await harness.worker.apply(create())  # redelivered: nothing more happens
        await wait_until(lambda: len(harness.backend.vmis) == 2)
        assert harness.backend.calls == [("create", "j-1", 0)]
        assert set(harness.registry.expected) == set(NAMES)
        config = harness.registry.expected[NAMES[1]].agent
        assert (config.node_rank, config.node_count, config.gpus) == (1, 2, 8)
        assert config.relays == ("cc" * 32,) and config.worker == WORKER_KEY
        # Where the job's relays listen (not another relay's: the job has one).
        assert config.relay_addresses == {"cc" * 32: (("203.0.113.7", 49737),)}
        await harness.registry.ready(NAMES[0])
        await trio.sleep(0.1)
        assert ReplicaState.ACTIVE not in harness.states()
        await harness.registry.ready(NAMES[1])
        await wait_until(lambda: harness.states()[-1:] == [ReplicaState.ACTIVE])
        assert harness.states()[0] is ReplicaState.STARTING
        assert any(isinstance(r, RackUpdate) for r in harness.published)
        nursery.cancel_scope.cancel()


async def test_a_restart_reports_restarting_mints_new_tokens_and_ignores_the_old_vmis_words(
        thread_clock):
    harness = Harness(WorkerStore.open(None))
    async with trio.open_nursery() as nursery:
        await nursery.start(harness.worker.run)
        await harness.worker.apply(create())
        await wait_until(lambda: len(harness.backend.vmis) == 2)
        await harness.registry.ready(*NAMES)
        await wait_until(lambda: harness.states()[-1:] == [ReplicaState.ACTIVE])
        token = harness.registry.expected[NAMES[0]].agent.report_token
        await harness.worker.apply(RestartReplica(op_id="op-r", job_id="j-1", replica=0,
                                                  generation=1))
        await wait_until(lambda: harness.backend.calls[-1] == ("restart", "j-1", 1))
        await wait_until(lambda: harness.states()[-1:] == [ReplicaState.STARTING])
        assert ReplicaState.RESTARTING in harness.states()
        assert ReplicaState.FAILED not in harness.states()  # the old VMIs' GONE was not a crash
        renewed = harness.registry.expected[NAMES[0]].agent
        # A new generation, new tokens: the old VMI's token proves nothing any more.
        assert renewed.generation == 1 and renewed.report_token != token
        kept = harness.store.replica("j-1", 0).token_hashes
        assert kept[0] == token_digest(renewed.report_token) != token_digest(token)
        await harness.registry.send.send(AgentEvent(NAMES[0], "ready", generation=0))  # stale
        await harness.registry.ready(NAMES[1])
        await trio.sleep(0.1)
        assert harness.states()[-1] is ReplicaState.STARTING
        await harness.registry.ready(NAMES[0])
        await wait_until(lambda: harness.states()[-1:] == [ReplicaState.ACTIVE])
        assert harness.published[-1].generation == 1
        nursery.cancel_scope.cancel()


async def test_a_crashed_vmi_fails_the_replica_and_a_delete_removes_it(thread_clock):
    harness = Harness(WorkerStore.open(None))
    async with trio.open_nursery() as nursery:
        await nursery.start(harness.worker.run)
        await harness.worker.apply(create())
        await wait_until(lambda: len(harness.backend.vmis) == 2)
        await harness.backend.crash(NAMES[1])
        await wait_until(lambda: harness.states()[-1:] == [ReplicaState.FAILED])
        await harness.worker.apply(DeleteReplica(op_id="op-d", job_id="j-1", replica=0))
        await wait_until(lambda: harness.states()[-1:] == [ReplicaState.DELETED])
        assert harness.backend.vmis == {} and harness.registry.expected == {}
        await harness.worker.apply(DeleteReplica(op_id="op-d2", job_id="j-9", replica=0))
        await wait_until(lambda: harness.states("j-9") == [ReplicaState.DELETED])
        nursery.cancel_scope.cancel()


async def test_retryable_failures_are_retried_and_a_permanent_one_fails_the_replica(
        thread_clock):
    backend = FakeBackend()
    backend.fail_next = [BackendError("API server busy"), BackendError("API server busy")]
    harness = Harness(WorkerStore.open(None), backend)
    async with trio.open_nursery() as nursery:
        await nursery.start(harness.worker.run)
        await harness.worker.apply(create())
        await wait_until(lambda: len(backend.vmis) == 2, limit_s=30)
        assert [call[0] for call in backend.calls] == ["create"] * 3
        backend.fail_next = [BackendError("image not found", retryable=False)]
        await harness.worker.apply(RestartReplica(op_id="op-r", job_id="j-1", replica=0,
                                                  generation=1))
        await wait_until(lambda: harness.states()[-1:] == [ReplicaState.FAILED])
        assert "image not found" in harness.published[-1].message
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("stop_during", ["create", "restart"])
async def test_a_worker_restarted_mid_operation_finishes_it(tmp_path, thread_clock,
                                                            stop_during):
    path = tmp_path / "worker.sqlite"
    backend = FakeBackend()
    backend.fail_next = [BackendError("connection reset")] * (1 if stop_during == "create" else 0)
    first = Harness(WorkerStore.open(path), backend)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.worker.run)
        await first.worker.apply(create())
        if stop_during == "restart":
            await wait_until(lambda: len(backend.vmis) == 2)
            backend.fail_next = [BackendError("connection reset")]
            await first.worker.apply(RestartReplica(op_id="op-r", job_id="j-1", replica=0,
                                                    generation=1))
        await wait_until(lambda: backend.calls and backend.calls[-1][0] == stop_during)
        nursery.cancel_scope.cancel()  # the worker dies while the backend call is failing
    first.store.close()
    second = Harness(WorkerStore.open(path), backend)
    async with trio.open_nursery() as nursery:
        await nursery.start(second.worker.run)
        generation = 0 if stop_during == "create" else 1
        await wait_until(lambda: backend.calls[-1] == (stop_during, "j-1", generation))
        await wait_until(lambda: second.store.replica("j-1", 0).settled)
        if stop_during == "restart":
            assert set(backend.adopted) == set(NAMES)
        await second.registry.ready(*NAMES)
        await wait_until(lambda: second.states()[-1:] == [ReplicaState.ACTIVE])
        nursery.cancel_scope.cancel()


async def test_relay_keys_are_fixed_when_a_job_is_created_and_new_ones_go_to_new_jobs(
        tmp_path, thread_clock):
    """seeds/relay.txt: existing jobs don't receive a relay key given after they were made."""
    path = tmp_path / "worker.sqlite"
    backend = FakeBackend()
    old_relay, new_relay = "cc" * 32, "dd" * 32
    first = Harness(WorkerStore.open(path), backend, relays=(old_relay,))
    async with trio.open_nursery() as nursery:
        await nursery.start(first.worker.run)
        await first.worker.apply(create())
        await wait_until(lambda: len(backend.vmis) == 2)
        nursery.cancel_scope.cancel()
    first.store.close()
    # The operator applies a config with another relay and restarts the worker.
    second = Harness(WorkerStore.open(path), backend, relays=(new_relay,))
    async with trio.open_nursery() as nursery:
        await nursery.start(second.worker.run)
        await second.worker.apply(RestartReplica(op_id="op-r", job_id="j-1", replica=0,
                                                 generation=1))
        await wait_until(lambda: backend.calls[-1] == ("restart", "j-1", 1))
        assert second.registry.expected[NAMES[0]].agent.relays == (old_relay,)
        await second.worker.apply(CreateReplica(op_id="op-c2", job_id="j-2", replica=0,
                                                spec=SPEC, placement=TWO_NODES))
        await wait_until(lambda: "cac-2-r0-n0" in second.registry.expected)
        assert second.registry.expected["cac-2-r0-n0"].agent.relays == (new_relay,)
        nursery.cancel_scope.cancel()


async def test_the_report_tokens_are_in_no_byte_of_the_workers_state_file(thread_clock, tmp_path):
    """A local user who reads worker.sqlite (and its WAL) learns no token;
    the digests the file keeps are what the registry expects."""
    path = tmp_path / "worker.sqlite"
    harness = Harness(WorkerStore.open(path))
    async with trio.open_nursery() as nursery:
        await nursery.start(harness.worker.run)
        await harness.worker.apply(create())
        await wait_until(lambda: len(harness.backend.vmis) == 2)
        await harness.worker.apply(RestartReplica(op_id="op-r", job_id="j-1", replica=0,
                                                  generation=1))
        await wait_until(lambda: harness.backend.calls[-1] == ("restart", "j-1", 1))
        tokens = [harness.registry.expected[name].agent.report_token for name in NAMES]
        hashes = harness.store.replica("j-1", 0).token_hashes
        assert hashes == tuple(harness.registry.expected[n].expected_token for n in NAMES)
        assert hashes == tuple(token_digest(t) for t in tokens)
        files = [p for p in tmp_path.iterdir() if p.name.startswith("worker.sqlite")]
        assert {p.name for p in files} >= {"worker.sqlite", "worker.sqlite-wal"}
        for file in files:
            data = file.read_bytes()
            assert all(token.encode() not in data for token in tokens), file.name
        nursery.cancel_scope.cancel()


async def test_a_create_the_worker_restarted_in_is_done_again_with_new_tokens(thread_clock):
    """The tokens of VMIs created before a worker restart are lost with it (only their
    digests were kept): the create resumes as a restart, so no VMI keeps a token the
    registry no longer expects."""
    store = WorkerStore.open(None)
    backend = FakeBackend()
    backend.fail_next.append(BackendError("the cluster went away", retryable=True))
    first = Harness(store, backend)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.worker.run)
        await first.worker.apply(create())
        await wait_until(lambda: backend.calls[:1] == [("create", "j-1", 0)])
        nursery.cancel_scope.cancel()  # the worker dies before the create succeeded
    minted = store.replica("j-1", 0).token_hashes
    assert len(minted) == 2
    again = Harness(store, backend)
    async with trio.open_nursery() as nursery:
        await nursery.start(again.worker.run)
        await wait_until(lambda: backend.calls[-1:] == [("restart", "j-1", 0)])
        kept = store.replica("j-1", 0).token_hashes
        assert kept != minted and kept == tuple(again.registry.expected[n].expected_token
                                                for n in NAMES)
        nursery.cancel_scope.cancel()
