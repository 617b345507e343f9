"""The worker core for the tests: a fake backend whose VMIs live in a dict, a fake
agent registry, and a harness that runs the worker over them and keeps its reports."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from contracts.model import JobSpec, NodeInfo, NodeShare, RackReport, ReplicaPlacement, ReplicaState
from contracts.operations import RackUpdate, ReplicaReport, decode_report
from nodes.k8s_worker.agents import AgentState
from nodes.k8s_worker.backend import BackendError, ReplicaUnit, VmiEvent, VmiPhase, VmiSpec
from nodes.k8s_worker.store import WorkerStore
from nodes.k8s_worker.worker import Worker, WorkerRuntime

WORKER_KEY = "aa" * 32
RACK = "bb" * 32
SPEC = JobSpec(name="chat", team="t1", type="inference", runtime="vllm", model="m",
               image="docker://registry.example/cosmicac/vllm:1", gpus=16, replicas=1)
TWO_NODES = ReplicaPlacement(rack=RACK, shares=(NodeShare(node="n1", gpus=8),
                                                NodeShare(node="n2", gpus=8)))


class FakeBackend:
    """VMIs in a dict; every change is an event, as a cluster's watch would give."""

    name = "fake"

    def __init__(self) -> None:
        self.vmis: dict[str, int] = {}  # name -> generation
        self.calls: list[tuple[str, str, int]] = []
        self.fail_next: list[BackendError] = []
        self.adopted: list[str] = []
        self._send: trio.MemorySendChannel[VmiEvent] | None = None

    async def run(self, events, *, task_status=trio.TASK_STATUS_IGNORED):
        self._send = events
        task_status.started()
        await trio.sleep_forever()

    def adopt(self, units: Sequence[ReplicaUnit]) -> None:
        self.adopted += [name for unit in units for name in unit.names]

    async def capacity(self) -> RackReport:
        return RackReport(nodes=(NodeInfo(name="n1", gpus=8), NodeInfo(name="n2", gpus=8)))

    async def _emit(self, vmi: VmiSpec, phase: VmiPhase, generation: int, message="") -> None:
        assert self._send is not None
        await self._send.send(VmiEvent(vmi.name, phase, message, vmi.node, generation))

    def _check(self, what: str, unit: ReplicaUnit) -> None:
        self.calls.append((what, unit.job_id, unit.generation))
        if self.fail_next:
            raise self.fail_next.pop(0)

    async def create(self, unit: ReplicaUnit) -> None:
        self._check("create", unit)
        for vmi in unit.vmis:
            self.vmis.setdefault(vmi.name, unit.generation)
            await self._emit(vmi, VmiPhase.PROVISIONING, unit.generation, "DataVolume importing")
            await self._emit(vmi, VmiPhase.RUNNING, unit.generation, f"VMI running on {vmi.node}")

    async def restart(self, unit: ReplicaUnit) -> None:
        self._check("restart", unit)
        for vmi in unit.vmis:
            await self._emit(vmi, VmiPhase.GONE, unit.generation - 1)
            self.vmis[vmi.name] = unit.generation
            await self._emit(vmi, VmiPhase.RUNNING, unit.generation, "VMI running again")

    async def delete(self, unit: ReplicaUnit) -> None:
        self._check("delete", unit)
        for vmi in unit.vmis:
            if self.vmis.pop(vmi.name, None) is not None:
                await self._emit(vmi, VmiPhase.GONE, unit.generation)

    async def crash(self, name: str) -> None:
        assert self._send is not None
        await self._send.send(VmiEvent(name, VmiPhase.FAILED, "VMI failed", None,
                                       self.vmis[name]))


@dataclass(frozen=True)
class AgentEvent:
    vmi_name: str
    kind: str
    message: str = ""
    generation: int | None = None


class FakeRegistry:
    def __init__(self) -> None:
        self.expected: dict[str, VmiSpec] = {}
        self.keys: dict[str, bytes] = {}
        self.send, self.receive = trio.open_memory_channel[AgentEvent](100)

    def expect(self, vmi: VmiSpec) -> None:
        self.expected[vmi.name] = vmi

    def forget(self, name: str) -> None:
        self.expected.pop(name, None)
        self.keys.pop(name, None)

    def state(self, name: str) -> AgentState | None:
        vmi = self.expected.get(name)
        if vmi is None:
            return None
        key = self.keys.get(name)
        return AgentState(vmi_name=name, generation=vmi.agent.generation, key=key,
                          ready=key is not None, failed=False, silent=False,
                          last_report_at=None)

    async def ready(self, *names: str) -> None:
        for name in names:
            # A distinct key per VMI, as each agent has its own identity.
            self.keys[name] = hashlib.blake2b(name.encode(), digest_size=32).digest()
            await self.send.send(AgentEvent(name, "ready",
                                            generation=self.expected[name].agent.generation))


class Harness:
    def __init__(self, store: WorkerStore, backend: FakeBackend | None = None,
                 relays: tuple[str, ...] = ("cc" * 32,)) -> None:
        self.store = store
        self.backend = backend or FakeBackend()
        self.registry = FakeRegistry()
        self.published: list[ReplicaReport | RackUpdate] = []
        self.worker = Worker(store=store, backend=self.backend, registry=self.registry,
                             agent_events=self.registry.receive,
                             publish=self.publish,
                             runtime=WorkerRuntime(
                                 worker_key=WORKER_KEY, relays=relays, report_interval_s=60,
                                 relay_addresses=(("cc" * 32, ("203.0.113.7:49737",)),
                                                  ("dd" * 32, ("203.0.113.8:49737",)))))

    async def publish(self, key: str, payload: bytes) -> int:
        report = decode_report(payload)
        assert key == (report.job_id if isinstance(report, ReplicaReport) else "rack")
        self.published.append(report)
        return len(self.published)

    def states(self, job_id: str = "j-1", replica: int = 0) -> list[ReplicaState]:
        return [r.state for r in self.published
                if isinstance(r, ReplicaReport) and (r.job_id, r.replica) == (job_id, replica)]
