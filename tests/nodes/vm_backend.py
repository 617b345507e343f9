"""A worker backend whose VMIs are real agents running in the test's own trio run.

:class:`InProcessBackend` is a test double of the VM, not of the agent: for
each VMI the worker asks for it prepares the VMI's folders as the ``local``
backend lays them out (``<state_dir>/<disk>/agent/agent.json`` and
``agent/storage/``), and runs the real :class:`agents._agent.Agent` with the
:class:`~contracts.agent_config.AgentConfig` the worker rendered, on a host
of its own on the cluster's :class:`~p2p.net.MemoryInternet`. Hellos,
readiness, heartbeats, shell keys and log shipping go over the in-memory
network exactly as a VMI's agent sends them.

Agents run in the harness's nursery, not the worker's: as VMIs outlive a
worker pod, they outlive a worker that is stopped and started again (which
hands this same backend the replicas it knows, :meth:`adopt`).

One process holds every daemon and agent, so the root logger is shared: an
agent's log shipping handler only takes the records its own tasks log
(:func:`tests.nodes.owners.owned_by`), as its own process would.

What a VM (or the local backend's process) does that this does not: a
killed agent is cancelled (its ``finally`` blocks run), not SIGKILLed; no
agent runs as a user of its own, nor adopts its shells' processes (a
subreaper is the whole process); a model server is a child of the test's
process. The real thing: tests/nodes/k8s_worker (the ``local`` backend)
and tests/nodes/control_path.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from agents._agent import Agent, Workload
from agents._logs import install_log_shipping
from contracts.agent_config import AgentConfig
from contracts.model import JobType, NodeInfo, RackReport
from nodes.k8s_worker.backend import BackendError, ReplicaUnit, VmiEvent, VmiPhase, VmiSpec
from p2p.keys import load_or_create_keypair
from p2p.net import MemoryInternet

from .owners import owned_by, set_owner

__all__ = ["InProcessBackend", "Vm", "real_workload"]

log = logging.getLogger(__name__)

#: The simulated cluster: as the ``local`` backend's default, two nodes of 8 GPUs.
NODES = (("local-node-1", 8), ("local-node-2", 8))


def real_workload(config: AgentConfig) -> Workload | None:
    """What the agent process runs: an inference job's model server, else nothing."""
    if config.job_type is JobType.INFERENCE:
        from agents.inference import InferenceWorkload

        return InferenceWorkload(config)
    return None


@dataclass
class Vm:
    """One running (or ended, not deleted) VMI."""

    spec: VmiSpec
    folder: Path
    #: Counts the agent starts of this backend: a new VMI gets a new number (as a pid).
    boot: int
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    ended: trio.Event = field(default_factory=trio.Event)
    agent: Agent | None = None
    #: Stopped on purpose (restart, delete): its end is not reported as a failure.
    stopping: bool = False
    phase: VmiPhase = VmiPhase.BOOTING
    message: str = ""

    @property
    def storage(self) -> Path:
        return self.folder / "agent" / "storage"


class InProcessBackend:
    """Runs each VMI as an in-process agent (see the module doc).

    Args:
        nursery: where the agents run (the harness's: they outlive a worker).
        internet: the network the agents' hosts are on.
        state_dir: the VMIs' folders (the worker's ``<storage>/vmis``).
        workload: what an agent runs beside its reports (default: the real one).
    """

    name = "in-process"

    def __init__(self, nursery: trio.Nursery, internet: MemoryInternet, state_dir: Path, *,
                 workload: Callable[[AgentConfig], Workload | None] = real_workload) -> None:
        self.nursery = nursery
        self.internet = internet
        self.state_dir = state_dir
        self.workload = workload
        #: VMI name -> its VM, until deleted.
        self.vms: dict[str, Vm] = {}
        self._boots = 0
        self._events: trio.MemorySendChannel[VmiEvent] | None = None
        self._watching: trio.Nursery | None = None
        self._to_adopt: list[VmiSpec] = []
        self._locks: dict[str, trio.Lock] = {}

    # -- for tests -----------------------------------------------------------------------

    def vm_of(self, folder: Path) -> Vm:
        return next(vm for vm in self.vms.values() if vm.folder == folder)

    async def kill(self, folder: Path) -> None:
        """End the VMI's agent at once, as a SIGKILL would; the worker hears it failed."""
        vm = self.vm_of(folder)
        vm.scope.cancel()
        with trio.fail_after(10):
            await vm.ended.wait()

    async def stop_all(self) -> None:
        for vm in list(self.vms.values()):
            vm.stopping = True
            vm.scope.cancel()
        with trio.fail_after(10):
            for vm in list(self.vms.values()):
                await vm.ended.wait()

    # -- the Backend interface -----------------------------------------------------------

    async def run(self, events: trio.MemorySendChannel[VmiEvent], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._events = events
        try:
            async with trio.open_nursery() as nursery:
                await self._adopt_pending()
                self._watching = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._events = self._watching = None

    def adopt(self, units: Sequence[ReplicaUnit]) -> None:
        """After a worker restart: say what these VMIs do now (once :meth:`run` runs)."""
        self._to_adopt.extend(vmi for unit in units for vmi in unit.vmis)
        if self._watching is not None:
            self._watching.start_soon(self._adopt_pending)

    async def capacity(self) -> RackReport:
        return RackReport(nodes=tuple(NodeInfo(name=name, gpus=gpus) for name, gpus in NODES))

    async def create(self, unit: ReplicaUnit) -> None:
        await self._adopt_pending()
        for vmi in unit.vmis:
            self._check(vmi)
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                vm = self.vms.get(vmi.name)
                if vm is None:
                    await self._start(vmi)
                else:
                    await self._send(vm, vm.phase, vm.message)

    async def restart(self, unit: ReplicaUnit) -> None:
        await self._adopt_pending()
        for vmi in unit.vmis:
            self._check(vmi)
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                vm = self.vms.pop(vmi.name, None)
                if vm is not None:
                    await self._stop(vm)
                    await self._send(vm, VmiPhase.GONE, "stopped for restart (disk kept)")
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                await self._start(vmi)

    async def delete(self, unit: ReplicaUnit) -> None:
        await self._adopt_pending()
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                vm = self.vms.pop(vmi.name, None)
                if vm is not None:
                    await self._stop(vm)
                folder = self.state_dir / vmi.disk
                await trio.to_thread.run_sync(_remove_tree, folder)
                if self._events is not None:
                    await self._events.send(VmiEvent(vmi.name, VmiPhase.GONE, "deleted"))

    # -- inside --------------------------------------------------------------------------

    def _lock(self, name: str) -> trio.Lock:
        return self._locks.setdefault(name, trio.Lock())

    def _check(self, vmi: VmiSpec) -> None:
        gpus = dict(NODES).get(vmi.node)
        if gpus is None or vmi.gpus > gpus:
            raise BackendError(f"{vmi.name}: {vmi.gpus} GPUs on {vmi.node!r} do not fit",
                               retryable=False)

    async def _adopt_pending(self) -> None:
        """After a worker restart: say what each VMI it knows is doing now."""
        while self._to_adopt:
            vmi = self._to_adopt.pop(0)
            vm = self.vms.get(vmi.name)
            if vm is not None and not vm.ended.is_set():
                await self._send(vm, VmiPhase.RUNNING, f"agent {vm.boot} adopted")
            elif vm is not None:
                await self._send(vm, VmiPhase.FAILED, "agent gone while the worker was away")
            elif self._events is not None:
                await self._events.send(VmiEvent(vmi.name, VmiPhase.GONE, "no such VMI"))

    async def _start(self, vmi: VmiSpec) -> None:
        folder = self.state_dir / vmi.disk
        storage = folder / "agent" / "storage"
        config = vmi.agent.model_copy(update={"storage": str(storage)})
        await trio.to_thread.run_sync(_prepare, folder, storage, config)
        self._boots += 1
        vm = Vm(vmi, folder, self._boots)
        self.vms[vmi.name] = vm
        await self._send(vm, VmiPhase.PROVISIONING, f"storage folder {storage} ready")
        await self._send(vm, VmiPhase.BOOTING, f"starting the agent on {vmi.node}")
        # Running before the agent's first step, as a process runs before its
        # first line: how it ends is always said after.
        await self._send(vm, VmiPhase.RUNNING, f"agent {vm.boot} running on {vmi.node}")
        self.nursery.start_soon(self._live, vm, config)

    async def _live(self, vm: Vm, config: AgentConfig) -> None:
        """The VMI's life: its agent until it ends or is killed; then say how it ended."""
        owner = f"agent {vm.spec.name} boot {vm.boot}"
        set_owner(owner)  # this task's and its children's records are this agent's
        # Each VMI a machine of its own; its agent listens there, as in a VM.
        address = f"127.0.{3 + vm.boot // 250}.{1 + vm.boot % 250}"
        host = self.internet.host(address)
        shipping = install_log_shipping(config)
        if shipping is not None:
            shipping[1].addFilter(owned_by(owner))
        outcome, message = VmiPhase.FAILED, f"agent {vm.boot} killed"
        try:
            with vm.scope:
                try:
                    vm.agent = Agent(
                        config, load_or_create_keypair(vm.storage), bootstrap=config.bootstrap,
                        worker_addresses=config.worker_addresses,
                        workload=self.workload(config), network=host, host=address,
                        shipper=shipping[0] if shipping is not None else None,
                        state_dir=vm.storage)
                    await vm.agent.run()
                    outcome, message = VmiPhase.SUCCEEDED, f"agent {vm.boot} exited 0"
                except Exception as exc:  # as the agent process exits 1
                    message = f"agent {vm.boot} exited: {exc}"
        finally:
            if shipping is not None:
                logging.getLogger().removeHandler(shipping[1])
            await host.aclose()
            vm.ended.set()
        if not vm.stopping:
            log.info("in_process.ended vmi=%s %s", vm.spec.name, message)
            await self._send(vm, outcome, message)

    async def _stop(self, vm: Vm) -> None:
        vm.stopping = True
        vm.scope.cancel()
        with trio.fail_after(10):
            await vm.ended.wait()

    async def _send(self, vm: Vm, phase: VmiPhase, message: str) -> None:
        vm.phase, vm.message = phase, message
        if self._events is None:
            return  # no worker now: it asks (adopt) when it comes back
        try:
            await self._events.send(VmiEvent(vm.spec.name, phase, message, node=vm.spec.node,
                                              generation=vm.spec.agent.generation,
                                              extra={"folder": str(vm.folder)}))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the worker stopped meanwhile


def _prepare(folder: Path, storage: Path, config: AgentConfig) -> None:
    """The VMI's folders as the local backend makes them: the worker's, and the
    agent's own holding its config (with the report token) and its storage."""
    storage.mkdir(parents=True, exist_ok=True)
    for path in (folder, folder / "agent", storage):
        os.chmod(path, 0o700)
    config_file = folder / "agent" / "agent.json"
    config_file.write_text(config.to_json())
    os.chmod(config_file, 0o600)


def _remove_tree(folder: Path) -> None:
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
