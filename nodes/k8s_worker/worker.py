"""wrk-server-k8s-nvidia's core: queue operations in, backend calls out, states back.

Theory of operation:

* **Apply, then ack.** :meth:`Worker.apply` writes an operation's intent to the
  worker's SQLite file with its op id, in one transaction, and returns; the
  daemon acks the queue position only after that. A redelivered operation
  finds its op id and changes nothing; a worker killed before the ack gets
  the operation again.
* **Reconcile.** One task per replica drives the backend towards the recorded
  intent (create, restart to generation *g*, delete). It resumes from the file
  after a restart, so a worker killed in the middle of a restart finishes it
  when it comes back. Backend calls are idempotent; a retryable failure is
  retried with back-off, a permanent one fails the replica.
* **Derive.** Backend :class:`~.backend.VmiEvent` s and agent events update a
  view per VMI; :func:`~.replica_state.replica_state` turns the views into the
  replica's state, and a change is published to wrk-ork. Events about an older
  generation (the VMI a restart replaced) are ignored.
* **Shell keys.** ``set_shell_keys`` operations carry a team's shell keys
  (:mod:`contracts.shell_access`); the newest version per team is kept in the
  file, rendered into every (re)created container agent's config, and handed
  to the team's running agents, which long-poll for it
  (:meth:`Worker.wait_shell_keys`, ``agent.shell_keys``). Older versions
  are ignored; each change is a System line of each of the team's jobs.
* **Rack.** The cluster's capacity is published at start and every
  ``report_interval_s``; it doubles as the worker's heartbeat, by which wrk-ork
  tells a silent worker (Unknown) from a quiet one.

Every System step is logged as ``<line> | system job=<id> replica=<n>``, with
``extra={"job_id", "replica"}`` so that, with telemetry on, wrk-monitor files
it under the job (nodes/kit/telemetry.py): operation received, VMIs created, disk
import progress (one line per 10 %), VMI scheduled and running, agent hello,
ready or failed, restart, delete, and every failure with its reason (failures
as warnings or errors). The lines follow state changes, never requests.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from contracts.gateway import GatewayView
from contracts.model import JobType, ReplicaState
from contracts.operations import (
    MAX_MESSAGE_CHARS,
    CreateReplica,
    DeleteReplica,
    RackUpdate,
    ReplicaReport,
    RestartReplica,
    SetShellKeys,
    encode,
)
from contracts.shell_access import ShellKeys

from .backend import (
    NO_TOKEN,
    Backend,
    BackendError,
    ReplicaUnit,
    VmiEvent,
    VmiPhase,
    replica_unit,
    token_digest,
    vmi_name,
)
from .replica_state import AgentStatus, VmiView, replica_state
from .store import ReplicaRecord, WorkerStore

__all__ = ["Worker", "WorkerRuntime"]

log = logging.getLogger(__name__)

#: Queue key of the rack reports (job ids start with ``j-``, so it cannot clash).
RACK_KEY = "rack"
#: Message-only updates (the same state, a new System line) at most this often
#: per replica, so an import's progress does not flood the durable queue.
MESSAGE_REPORT_INTERVAL_S = 2.0
#: Longest wait between two tries of a failing backend call.
MAX_RETRY_WAIT_S = 30.0

Publish = Callable[[str, bytes], Awaitable[Any]]

#: A DataVolume's progress line (kubevirt/status.py): logged once per 10 % step.
_IMPORTING = re.compile(r"DataVolume importing (\d+(?:\.\d+)?)%")
#: Log levels of the VMI phases and agent reports that need a human.
_PHASE_LEVELS = {VmiPhase.FAILED: logging.ERROR, VmiPhase.UNKNOWN: logging.WARNING}
_AGENT_LEVELS = {"failed": logging.ERROR, "silent": logging.WARNING}


def _where(job_id: str, replica: int) -> dict[str, Any]:
    """The log call's ``extra``: which job's System log a line belongs to."""
    return {"job_id": job_id, "replica": replica}


@dataclass(frozen=True)
class WorkerRuntime:
    """What the worker puts into every new replica's agent config."""

    #: The worker's swarm public key (hex): agents report to it.
    worker_key: str
    #: Addresses agents try before the DHT (``host:port``).
    worker_addresses: tuple[str, ...] = ()
    bootstrap: tuple[str, ...] = ()
    #: Relay keys given to jobs created from now on.
    relays: tuple[str, ...] = ()
    #: (relay key hex, its ``host:port`` addresses): passed to agents with the relays.
    relay_addresses: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: proxy-inference keys that inference agents serve (read at each (re)start).
    proxies: tuple[str, ...] = ()
    heartbeat_interval_s: float = 5.0
    #: The agent's storage folder inside the VMI; None: the agent's default.
    agent_storage: str | None = None
    report_interval_s: float = 15.0
    #: Agents send their log records to the worker, for wrk-monitor.
    telemetry: bool = False


@dataclass
class _Replica:
    record: ReplicaRecord
    views: dict[int, VmiView] = field(default_factory=dict)
    wake: trio.Event = field(default_factory=trio.Event)
    restarting: bool = False
    #: A permanent backend failure, reported as FAILED until the next operation.
    broken: str | None = None
    last_state: ReplicaState | None = None
    last_message: str = ""
    message: str = ""
    last_report_at: float = -math.inf
    last_agents: tuple[str, ...] = ()
    #: An isolated network's gateway, as the backend last said (and reported).
    gateway: GatewayView | None = None
    last_gateway: GatewayView | None = None
    #: Per node rank, the 10 % step of its disk import last logged.
    import_steps: dict[int, int] = field(default_factory=dict)
    #: The report tokens this worker process minted, and for which generation:
    #: reused when a failed create or restart is retried (a VMI the backend kept
    #: has them). In memory only; the store keeps their digests.
    tokens: tuple[int, tuple[str, ...]] | None = None


class Worker:
    """One worker's replicas: apply operations, reconcile the backend, report."""

    def __init__(self, *, store: WorkerStore, backend: Backend, registry,
                 agent_events: trio.MemoryReceiveChannel, publish: Publish,
                 runtime: WorkerRuntime, clock: Callable[[], float] = time.time) -> None:
        """
        Args:
            registry: the :class:`~.agents.AgentRegistry` (``expect``/``forget``).
            agent_events: where that registry sends its :class:`~.agents.AgentEvent` s.
            publish: ``await publish(key, payload)`` appends a report to the queue.
        """
        self.store = store
        self.backend = backend
        self.registry = registry
        self._agent_events = agent_events
        self._publish = publish
        self.runtime = runtime
        self._clock = clock
        self._replicas: dict[tuple[str, int], _Replica] = {}
        self._by_vmi: dict[str, tuple[tuple[str, int], int]] = {}
        self._nursery: trio.Nursery | None = None
        self._capacity_changed = trio.Event()
        self.bad_operations = 0
        #: Per team, the newest shell keys wrk-ork sent (loaded from the file by run()).
        self._shell_keys: dict[str, ShellKeys] = {}
        self._shell_keys_changed = trio.Event()
        # The registry answers its agents' ``agent.shell_keys`` from here.
        registry.shell_keys = self.wait_shell_keys

    # -- operations ----------------------------------------------------------

    async def apply(self, op: CreateReplica | RestartReplica | DeleteReplica | SetShellKeys
                    ) -> None:
        """Record the operation's intent durably; the reconciler does the rest."""
        if isinstance(op, SetShellKeys):
            await self.set_shell_keys(op.keys)
            return
        now = self._clock()
        if isinstance(op, CreateReplica):
            record = ReplicaRecord(
                job_id=op.job_id, replica=op.replica, spec=op.spec, placement=op.placement,
                generation=op.generation, done_generation=-1, desired="run", removed=False,
                relays=self.runtime.relays, token_hashes=(),
                reported_state=None, reported_message="", created_at=now)
            if await trio.to_thread.run_sync(self.store.apply_create, op.op_id, record, now):
                shares = ", ".join(f"{share.gpus} on node {share.node}"
                                   for share in op.placement.shares)
                log.info("create received: GPUs claimed (%s) | worker.create job=%s replica=%d "
                         "generation=%d op=%s", shares, op.job_id, op.replica, op.generation,
                         op.op_id, extra=_where(op.job_id, op.replica))
                self._track(record)
            return
        key = (op.job_id, op.replica)
        if isinstance(op, RestartReplica):
            changed = await trio.to_thread.run_sync(self.store.apply_restart, op.op_id,
                                                    op.job_id, op.replica, op.generation, now)
            verb = "restart"
        else:
            changed = await trio.to_thread.run_sync(self.store.apply_delete, op.op_id,
                                                    op.job_id, op.replica, now)
            verb = "delete"
        record = await trio.to_thread.run_sync(self.store.replica, op.job_id, op.replica)
        if record is None:
            log.warning("%s received for a replica this worker does not have | "
                        "worker.%s_unknown job=%s replica=%d op=%s", verb, verb, op.job_id,
                        op.replica, op.op_id, extra=_where(op.job_id, op.replica))
            if verb == "delete":  # nothing of it exists: say so, so wrk-ork frees the GPUs
                await self._send(ReplicaReport(job_id=op.job_id, replica=op.replica,
                                               state=ReplicaState.DELETED,
                                               message="nothing to delete", at=now))
            return
        if changed:
            log.info("%s received | worker.%s job=%s replica=%d op=%s", verb, verb, op.job_id,
                     op.replica, op.op_id, extra=_where(op.job_id, op.replica))
            state = self._replicas.get(key)
            if state is None:
                self._track(record)
            else:
                state.record = record
                state.broken = None
                state.wake.set()

    async def set_shell_keys(self, keys: ShellKeys) -> bool:
        """Keep the team's newer shell keys (in the file first) and wake the
        agents' long polls. Returns False, changing nothing, for a version not
        above the one held (a redelivery, or an older update)."""
        keys = keys.normalised()
        current = self._shell_keys.get(keys.team)
        if current is not None and keys.version <= current.version:
            log.debug("worker.shell_keys_stale team=%s version=%d held=%d", keys.team,
                      keys.version, current.version)
            return False
        if not await trio.to_thread.run_sync(self.store.set_shell_keys, keys):
            return False
        self._shell_keys[keys.team] = keys
        jobs = sorted({state.record.job_id for state in self._replicas.values()
                       if state.record.spec.team == keys.team
                       and state.record.spec.type is JobType.CONTAINER})
        for job_id in jobs:
            log.info("shell access changed: %d keys may open shells (version %d) | "
                     "worker.shell_keys job=%s team=%s", len(keys.keys), keys.version, job_id,
                     keys.team, extra=_where(job_id, 0))
        isolated = sorted({state.record.job_id for state in self._replicas.values()
                           if state.record.spec.team == keys.team
                           and state.record.spec.isolated_network})
        set_peers = getattr(self.backend, "set_gateway_peers", None)
        for job_id in isolated if set_peers is not None else ():
            try:
                await set_peers(job_id, [bytes.fromhex(key) for key in keys.keys])
            except BackendError as exc:  # the gateway keeps its members until next time
                log.warning("the WireGuard gateway keeps its former members: %s | "
                            "worker.gateway_peers_failed job=%s", exc, job_id,
                            extra=_where(job_id, 0))
            else:
                log.info("WireGuard gateway: %d members may connect | worker.gateway_peers "
                         "job=%s", len(keys.keys), job_id, extra=_where(job_id, 0))
        self._shell_keys_changed.set()
        self._shell_keys_changed = trio.Event()
        return True

    def shell_keys_of(self, vmi: str) -> ShellKeys | None:
        """The shell keys VMI ``vmi``'s agent should hold now; None: not a
        container job's VMI of this worker."""
        found = self._by_vmi.get(vmi)
        state = None if found is None else self._replicas.get(found[0])
        if state is None or state.record.spec.type is not JobType.CONTAINER:
            return None
        spec = state.record.spec
        return self._shell_keys.get(spec.team) or ShellKeys(
            team=spec.team, keys=spec.authorized_keys, version=0)

    async def wait_shell_keys(self, vmi: str, version: int, wait_s: float) -> ShellKeys | None:
        """``agent.shell_keys``: VMI ``vmi``'s shell keys once their version is not
        ``version`` (at once if it is not now), or after ``wait_s`` as they are."""
        deadline = trio.current_time() + wait_s
        while True:
            current = self.shell_keys_of(vmi)
            if current is None or current.version != version:
                return current
            changed = self._shell_keys_changed
            with trio.move_on_at(deadline):
                await changed.wait()
            if trio.current_time() >= deadline:
                return self.shell_keys_of(vmi)

    # -- running -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Adopt what the file holds, then watch, reconcile and report until cancelled."""
        records = await trio.to_thread.run_sync(self.store.replicas)
        self._shell_keys = await trio.to_thread.run_sync(self.store.shell_keys)
        send, receive = trio.open_memory_channel[VmiEvent](256)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.backend.adopt([self._unit(record) for record in records
                                if record.done_generation >= 0])
            await nursery.start(self.backend.run, send)
            nursery.start_soon(self._backend_events, receive)
            nursery.start_soon(self._follow_agents)
            for record in records:
                state = self._track(record)
                state.last_state = record.reported_state
                state.last_message = record.reported_message
            nursery.start_soon(self._report_rack)
            task_status.started()

    def _track(self, record: ReplicaRecord) -> _Replica:
        key = record.key
        state = self._replicas.get(key)
        if state is not None:
            state.record = record
            state.wake.set()
            return state
        state = self._replicas[key] = _Replica(record)
        for rank in range(len(record.placement.shares)):
            name = vmi_name(record.job_id, record.replica, rank)
            self._by_vmi[name] = (key, rank)
            state.views[rank] = VmiView()
        if record.desired == "run" and record.done_generation >= 0:
            for vmi in self._unit(record).vmis:
                self.registry.expect(vmi)
        assert self._nursery is not None, "Worker.run is not running"
        self._nursery.start_soon(self._reconcile, key)
        return state

    async def _reconcile(self, key: tuple[str, int]) -> None:
        state = self._replicas[key]
        failures = 0
        while True:
            record = state.record = await trio.to_thread.run_sync(self.store.replica, *key)
            if record is None:
                return
            if record.settled or state.broken is not None:
                if record.desired == "delete":
                    await self._finish_delete(state)
                    return
                state.wake = trio.Event()
                await state.wake.wait()
                continue
            try:
                if record.desired == "delete":
                    await self.backend.delete(self._unit(record))
                    await trio.to_thread.run_sync(self.store.mark_removed, *key)
                    continue
                minted = await self._mint(state, record)
                if minted is None:
                    continue  # another generation was asked for meanwhile
                tokens, replaced = minted
                unit = self._unit(record, tokens)
                if record.done_generation < 0 and replaced:
                    # This worker restarted while creating them: VMIs it made then
                    # carry tokens it no longer has. Replace them, as a restart does.
                    self._system(state, "creating VMIs again with new report tokens "
                                 "(the worker restarted during their creation): "
                                 + ", ".join(unit.names))
                    self._expect(state, unit)
                    await self.backend.restart(unit)
                elif record.done_generation < 0:
                    self._system(state, "creating VMIs " + ", ".join(unit.names))
                    self._expect(state, unit)
                    await self.backend.create(unit)
                else:
                    state.restarting = True
                    await self._update(state)
                    self._system(state, f"restarting to generation {record.generation}")
                    self._expect(state, unit)
                    await self.backend.restart(unit)
                    state.restarting = False
                await trio.to_thread.run_sync(self.store.mark_done, *key, record.generation)
                failures = 0
                await self._update(state)
            except BackendError as exc:
                state.restarting = False
                if not exc.retryable:
                    state.broken = str(exc)
                    self._system(state, f"failed: {exc}", level=logging.ERROR)
                    await self._update(state)
                    continue
                failures += 1
                wait = min(MAX_RETRY_WAIT_S, 0.5 * 2 ** min(failures, 10))
                self._system(state, f"backend call failed (retrying in {wait:.0f} s): {exc}",
                             level=logging.WARNING)
                await self._update(state)
                await trio.sleep(wait)

    async def _mint(self, state: _Replica,
                    record: ReplicaRecord) -> tuple[tuple[str, ...], bool] | None:
        """The report tokens to create or restart ``record.generation`` with.

        Those this process minted for the generation (a retry: a VMI the backend
        kept has them), or new ones, whose digests are stored before any VMI gets
        them. Returns the tokens and whether new ones replace digests kept for
        VMIs that may exist (see the caller); None if the replica now asks for
        another generation (or is gone)."""
        if state.tokens is not None and state.tokens[0] == record.generation:
            return state.tokens[1], False
        tokens = tuple(secrets.token_hex(32) for _ in record.placement.shares)
        hashes = tuple(token_digest(token) for token in tokens)
        if not await trio.to_thread.run_sync(self.store.set_token_hashes, record.job_id,
                                             record.replica, record.generation, hashes):
            return None
        state.tokens = (record.generation, tokens)
        return tokens, bool(record.token_hashes)

    def _expect(self, state: _Replica, unit: ReplicaUnit) -> None:
        state.import_steps.clear()
        for vmi in unit.vmis:
            state.views[vmi.node_rank] = VmiView()
            self.registry.expect(vmi)

    async def _finish_delete(self, state: _Replica) -> None:
        for rank in list(state.views):
            name = vmi_name(state.record.job_id, state.record.replica, rank)
            self.registry.forget(name)
            self._by_vmi.pop(name, None)
        self._system(state, "deleted")
        await self._update(state)
        self._replicas.pop(state.record.key, None)
        self._capacity_changed.set()

    def _unit(self, record: ReplicaRecord,
              tokens: tuple[str, ...] | None = None) -> ReplicaUnit:
        """The replica's unit: with ``tokens`` (just minted) one to create or restart
        VMIs with; without, one to watch and expect them (its configs carry
        :data:`~.backend.NO_TOKEN`, the registry the stored digests)."""
        runtime = self.runtime
        agent: dict[str, Any] = {
            "worker": runtime.worker_key, "worker_addresses": runtime.worker_addresses,
            "bootstrap": runtime.bootstrap, "relays": record.relays,
            # Where the job's relays listen now (a relay box that moved keeps its key).
            "relay_addresses": {key: where for key, where in runtime.relay_addresses
                                if key in record.relays},
            "heartbeat_interval_s": runtime.heartbeat_interval_s,
            "report_token": tokens[0] if tokens else NO_TOKEN,
            # Who may use the workload: the team's shell users, or the proxies.
            "authorized_keys": runtime.proxies}
        if record.spec.type is JobType.CONTAINER:
            # The newest shell keys wrk-ork sent for the team, else the job's own.
            shell = self._shell_keys.get(record.spec.team)
            agent["authorized_keys"] = (record.spec.authorized_keys if shell is None
                                        else shell.keys)
            agent["shell_keys_version"] = 0 if shell is None else shell.version
        if runtime.agent_storage is not None:
            agent["storage"] = runtime.agent_storage
        return replica_unit(record.job_id, record.replica, record.spec, record.placement,
                            generation=record.generation, agent=agent, tokens=tokens,
                            token_hashes=record.token_hashes,
                            telemetry=runtime.telemetry)

    # -- events ----------------------------------------------------------------

    def _current(self, name: str, generation: int | None) -> tuple[_Replica, int] | None:
        """The replica and node rank of VMI ``name``, unless it is unknown or the
        event is about an older generation (the VMI a restart replaced)."""
        found = self._by_vmi.get(name)
        if found is None:
            return None
        key, rank = found
        state = self._replicas.get(key)
        if state is None or (generation is not None and generation < state.record.generation):
            return None
        return state, rank

    async def _backend_events(self, receive: trio.MemoryReceiveChannel[VmiEvent]) -> None:
        async for event in receive:
            found = self._current(event.name, event.generation)
            if found is None:
                continue
            state, rank = found
            if event.gateway is not None:  # the job's network, not the VMI's phase
                state.gateway = event.gateway
                if event.message:
                    self._system(state, event.message)
                await self._update(state)
                continue
            if state.restarting and event.phase in (VmiPhase.GONE, VmiPhase.FAILED,
                                                    VmiPhase.SUCCEEDED):
                continue  # the restart is stopping it on purpose
            view = state.views.get(rank, VmiView())
            state.views[rank] = VmiView(phase=event.phase, agent=view.agent)
            if event.message:
                line = event.message if len(state.views) == 1 else f"{event.name}: {event.message}"
                self._system(state, line, level=_PHASE_LEVELS.get(event.phase, logging.INFO),
                             logged=self._import_step_changed(state, rank, event.message))
            await self._update(state)

    @staticmethod
    def _import_step_changed(state: _Replica, rank: int, message: str) -> bool:
        """False for a disk progress line within the 10 % step already logged for
        that VMI (it still becomes the replica's message)."""
        found = _IMPORTING.search(message)
        if found is None:
            return True
        step = min(int(float(found[1])) // 10, 10)
        if state.import_steps.get(rank) == step:
            return False
        state.import_steps[rank] = step
        return True

    async def _follow_agents(self) -> None:
        async for event in self._agent_events:
            found = self._current(event.vmi_name, getattr(event, "generation", None))
            if found is None:
                continue
            state, rank = found
            status = _AGENT_STATUS.get(str(event.kind))
            if status is None:
                continue
            view = state.views.get(rank, VmiView())
            state.views[rank] = VmiView(phase=view.phase, agent=status)
            message = getattr(event, "message", "") or ""
            self._system(state, f"agent {event.kind}" + (f": {message}" if message else ""),
                         level=_AGENT_LEVELS.get(str(event.kind), logging.INFO))
            await self._update(state)

    def _system(self, state: _Replica, line: str, *, level: int = logging.INFO,
                logged: bool = True) -> None:
        """``line`` becomes the replica's message (reported to wrk-ork) and, when
        ``logged``, a System log line of its job."""
        record = state.record
        if logged:
            log.log(level, "%s | system job=%s replica=%d", line, record.job_id,
                    record.replica, extra=_where(record.job_id, record.replica))
        state.message = line[:MAX_MESSAGE_CHARS]

    async def _update(self, state: _Replica) -> None:
        record = state.record
        if state.broken is not None and record.desired == "run":
            computed: ReplicaState | None = ReplicaState.FAILED
        else:
            computed = replica_state(desired=record.desired, removed=record.removed,
                                     restarting=state.restarting,
                                     vmis=[state.views[rank] for rank in sorted(state.views)])
        if computed is None:
            return
        agents = self._agent_keys(state)
        now = trio.current_time()
        if computed == state.last_state and agents == state.last_agents and (
                state.gateway == state.last_gateway) and (
                state.message == state.last_message
                or now - state.last_report_at < MESSAGE_REPORT_INTERVAL_S):
            return
        state.last_state, state.last_message, state.last_report_at = computed, state.message, now
        state.last_agents, state.last_gateway = agents, state.gateway
        await self._send(ReplicaReport(job_id=record.job_id, replica=record.replica,
                                       state=computed, generation=record.generation,
                                       message=state.message, agents=agents,
                                       gateway=state.gateway, at=self._clock()))
        await trio.to_thread.run_sync(self.store.mark_reported, record.job_id, record.replica,
                                      computed, state.message)

    def _agent_keys(self, state: _Replica) -> tuple[str, ...]:
        """The keys of the replica's agents that said hello, by node rank (whom
        proxy-inference may trust as this replica), or () until all of them did."""
        record = state.record
        keys = []
        for rank in range(len(record.placement.shares)):
            agent = self.registry.state(vmi_name(record.job_id, record.replica, rank))
            if agent is None or agent.key is None:
                return ()
            keys.append(agent.key.hex())
        return tuple(keys)

    async def _send(self, report: ReplicaReport | RackUpdate) -> None:
        key = report.job_id if isinstance(report, ReplicaReport) else RACK_KEY
        await self._publish(key, encode(report))

    async def _report_rack(self) -> None:
        last = None
        while True:
            try:
                rack = await self.backend.capacity()
            except BackendError as exc:
                log.warning("worker.capacity_failed reason=%s", exc)
            else:
                if rack != last:
                    log.info("worker.rack nodes=%d gpus=%d", len(rack.nodes),
                             sum(node.gpus for node in rack.nodes))
                last = rack
                await self._send(RackUpdate(rack=rack, at=self._clock()))
            self._capacity_changed = trio.Event()
            with trio.move_on_after(self.runtime.report_interval_s):
                await self._capacity_changed.wait()

    def statistics(self) -> dict[str, int]:
        states: dict[str, int] = {}
        for state in self._replicas.values():
            name = state.last_state.value if state.last_state else "none"
            states[name] = states.get(name, 0) + 1
        return states


_AGENT_STATUS = {
    "hello": AgentStatus.HELLO,
    "ready": AgentStatus.READY,
    "failed": AgentStatus.FAILED,
    "silent": AgentStatus.SILENT,
}
