"""``wrk-server-k8s-nvidia`` as a daemon: one peer hosting the queue and the agents' service.

One swarm, one identity (``<storage>/identity``), services plugged into it:

- ``cosmicac-mq/1``: the durable queue with wrk-ork (operations in, reports
  out), kept connected by dialling wrk-ork's key;
- ``cosmicac-agent/1``: the agents' hello, readiness and heartbeats.

With ``telemetry.monitor`` set, its log records (every job's System steps:
operation received, VMIs created, disk import progress, VMI scheduled and
running, agent hello/ready/failed, restart, delete, each failure and why) are
shipped to wrk-monitor (:mod:`nodes.kit.telemetry`), and so are its agents'
figures (``metrics.agents`` every 5 s: :mod:`.agent_metrics`).

Files under ``--storage``: ``identity``, ``queue/`` (both logs and the
cursor), ``worker.sqlite`` (replica intents, applied op ids), ``vmis/`` (the
``local`` backend's agent folders).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

import trio

from contracts.operations import BadMessage, decode_operation
from nodes.kit.metrics import Snapshot, snapshot_registry
from nodes.kit.peer import start_peer
from nodes.kit.ready import print_ready
from nodes.kit.telemetry import start_telemetry
from p2p.daemon import Daemon, DaemonError
from p2p.host import Reserved
from p2p.keys import KeyPair, format_key, load_or_create_keypair
from p2p.log import FsyncPolicy
from p2p.queue import DurableQueue, QueueConfig, QueueService
from p2p.swarm import Swarm, stay_connected

from .agent_metrics import AgentMetricsReporter, agent_metrics_snapshot
from .agents import AgentEvent, AgentRegistry, AgentTable
from .backend import Backend
from .metrics import worker_snapshot
from .settings import WorkerSettings, relays_hex
from .store import WorkerStore
from .worker import Worker, WorkerRuntime

__all__ = ["make_backend", "reserved_peers", "start_worker"]

log = logging.getLogger(__name__)

#: A worker's only rightful strangers are new agents before their hello (a
#: round trip; then bound, hence reserved, and never evicted): a stranger that
#: has held a slot this long may give it up to a newcomer, so a client holding
#: every strangers' slot keeps a new job's agent out for about this long, not
#: the swarm's 10 s.
STRANGER_EVICT_AFTER_S = 2.0

#: How often the metrics' snapshot is refreshed.
METRICS_INTERVAL_S = 2.0


def make_backend(settings: WorkerSettings, storage: Path,
                 keypair: KeyPair | None = None) -> Backend:
    """The backend the settings name (``keypair``: the worker's, which the
    isolated networks' gateway keys are derived from)."""
    if settings.backend == "kubevirt":
        from .kubevirt.backend import KubevirtBackend
        seed = None
        if keypair is not None:
            # Not the identity itself: a key of its own for the gateways, from it.
            seed = hashlib.blake2b(keypair.seed, digest_size=32,
                                   person=b"cac-wg-gw-seed").digest()
        return KubevirtBackend(settings.kubevirt, gateway_seed=seed)
    if settings.backend == "qemu":
        from .qemu.backend import QemuBackend
        return QemuBackend(settings.qemu, storage / "vms", secrets_dir=storage / "secrets")
    from .local import LocalBackend
    return LocalBackend(settings.local, storage / "vmis", secrets_dir=storage / "secrets")


def reserved_peers(settings: WorkerSettings, table: AgentTable) -> Reserved:
    """The keys that keep connection slots under a flood of strangers: wrk-ork
    and every agent ``table`` has bound by its hello (bound at run time)."""
    return lambda key: key == settings.ork or table.bound(key) is not None


async def start_worker(daemon: Daemon[WorkerSettings], *, backend: Backend | None = None) -> None:
    """Start every part of the worker in ``daemon.nursery``; return once serving."""
    settings = daemon.settings
    storage = daemon.storage
    assert storage is not None
    keypair = load_or_create_keypair(storage)
    # The worker's folder is its own: identity, queue, state, the VMIs' logs. The
    # local backend's agents, run as users of their own, live elsewhere
    # (local.agents_dir), so nothing in here needs to be reachable by others.
    await trio.to_thread.run_sync(os.chmod, storage, 0o700)
    if settings.ork == keypair.public_key:
        raise DaemonError("ork is this worker's own key: give wrk-ork's public key")
    fsync = FsyncPolicy.ALWAYS if settings.fsync else FsyncPolicy.NEVER
    store = await trio.to_thread.run_sync(WorkerStore.open, storage / "worker.sqlite")
    queue = await DurableQueue.open(storage / "queue", keypair, settings.ork,
                                    config=QueueConfig(fsync=fsync))
    queues = QueueService()
    queues.attach(queue)
    agent_send, agent_events = trio.open_memory_channel[AgentEvent](1024)
    registry = AgentRegistry(agent_send, silent_after_s=settings.agents.silent_after_s,
                             log_limit=settings.agents.log_limit())
    backend = backend or make_backend(settings, storage, keypair)

    def watch_connections(swarm: Swarm) -> None:
        # A hello from a new key for a VMI whose agent is connected is a takeover.
        registry.connected = lambda key: key in swarm.connections

    # wrk-ork and every agent bound by its hello keep their room under a flood.
    swarm, address = await start_peer(
        daemon, keypair, settings, [queues, registry.service],
        reserved=reserved_peers(settings, registry.table), setup=watch_connections,
        stranger_evict_after_s=STRANGER_EVICT_AFTER_S)
    measured = Snapshot()
    daemon.metrics.add(snapshot_registry(lambda: measured))
    # The worker's own records (every job's System steps) go to wrk-monitor when
    # telemetry is on, and so do its agents': they send them to the worker
    # (``agent.logs``, re-stamped with their replica) and new agents are told
    # to (``AgentConfig.telemetry``). Until then (or with telemetry off) the
    # registry answers their batches and discards them.
    shipper = await start_telemetry(daemon, swarm, settings.telemetry,
                                    service="wrk-server-k8s-nvidia")
    registry.on_logs = None if shipper is None else shipper.offer_many
    reporter = None
    monitor = settings.telemetry.monitor_peer
    if shipper is not None and monitor is not None:
        table = registry.table
        reporter = AgentMetricsReporter(lambda: table.agent_report(trio.current_time()),
                                        interval_s=settings.agent_metrics_interval_s)
        daemon.nursery.start_soon(functools.partial(
            reporter.run, swarm, monitor.key, monitor.addresses))
    worker_addresses = tuple(f"{host}:{port}" for host, port in settings.agents.worker_addresses)
    # The guest of a qemu VM reaches this host's loopback too (the backend gives
    # the agent the user-mode network's alias of it).
    if not worker_addresses and settings.backend in ("local", "qemu"):
        host = "127.0.0.1" if address[0] in ("0.0.0.0", "::") else address[0]
        worker_addresses = (f"{host}:{address[1]}",)
    runtime = WorkerRuntime(
        worker_key=keypair.hex, worker_addresses=worker_addresses,
        bootstrap=tuple(f"{h}:{p}" for h, p in settings.bootstrap),
        relays=relays_hex(settings),
        relay_addresses=tuple(
            (key.hex(), tuple(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in where))
            for key, where in settings.relay_addresses.items()),
        proxies=tuple(key.hex() for key in settings.interconnect.proxies),
        heartbeat_interval_s=settings.agents.heartbeat_interval_s,
        report_interval_s=settings.report_interval_s, telemetry=shipper is not None)
    worker = Worker(store=store, backend=backend, registry=registry, agent_events=agent_events,
                    publish=queue.publish,
                    runtime=runtime)
    await daemon.nursery.start(registry.run)
    await daemon.nursery.start(worker.run)
    daemon.nursery.start_soon(_consume, queue, worker)

    async def measure() -> None:
        nonlocal measured
        while True:
            measured = worker_snapshot(worker, queue, registry)
            if reporter is not None:
                measured.families.update(agent_metrics_snapshot(reporter).families)
            await trio.sleep(METRICS_INTERVAL_S)

    daemon.nursery.start_soon(measure)
    ork = settings.ork_peer
    daemon.nursery.start_soon(functools.partial(
        stay_connected, swarm, ork.key, addresses=ork.addresses or None))
    if settings.backend == "kubevirt":
        # What `cosmicac doctor` checks, as warnings in the log: a cluster that is
        # not ready yet (or an API server that is down) never stops the worker.
        from .kubevirt.doctor import warn_at_start
        daemon.nursery.start_soon(functools.partial(warn_at_start, settings.kubevirt))
    isolated = getattr(backend, "isolated", None)  # the local backend's (see local.py)
    agents = ("" if isolated is None else ", agents isolated" if isolated
              else ", agents NOT isolated: shells run as this user")
    print_ready("wrk-server-k8s-nvidia", key=keypair.hex, addresses={"swarm": address},
                note=f"backend {backend.name}, ork {format_key(settings.ork)[:16]}…, "
                     f"telemetry {'on' if shipper is not None else 'off'}{agents}")


async def _consume(queue: DurableQueue, worker: Worker) -> None:
    """Apply wrk-ork's operations in order; ack each once its intent is on disk."""
    async with queue.deliveries() as deliveries:
        async for delivery in deliveries:
            try:
                op = decode_operation(delivery.payload)
            except BadMessage as exc:
                worker.bad_operations += 1
                log.warning("worker.bad_operation position=%d reason=%s", delivery.position, exc)
            else:
                await worker.apply(op)
            await queue.ack(delivery.position)
