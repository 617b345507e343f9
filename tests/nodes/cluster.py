"""The control path in the test's own trio run: wrk-ork, a worker, its agents, wrk-monitor.

:func:`cluster` starts wrk-ork (:func:`nodes.ork.daemon.start_ork`) and one
worker (:func:`nodes.k8s_worker.daemon.start_worker`, two nodes of 8 GPUs)
whose VMIs are real agents in this run (:mod:`.vm_backend`), each daemon on a
host of its own on one :class:`~p2p.net.MemoryInternet`, and gives the test
an RPC client of wrk-ork's ``cosmicac-ork/1`` service, as app-node would
hold. No process is started: what a ``cosmicac run`` process costs in imports
is paid once.

The worker and wrk-ork can be stopped at once (their tasks cancelled, as a
SIGKILL ends a process; their files stay) and started again on the same
address and storage; the agents, as VMIs outlive a worker, keep running.

With ``monitor=True`` it first starts wrk-monitor
(:func:`nodes.monitor.daemon.serve_monitor`: any key may push, the test's
key may follow; its HTTP side on a real 127.0.0.1 socket with
:data:`MONITOR_TOKEN`) and turns telemetry on in wrk-ork's and the worker's
settings; :meth:`Cluster.logs` reads a job's records back with
``logs.query``, as app-node does. Each daemon ships only its own records
(:mod:`.owners`).

Clock: real. The daemons do their SQLite and file work in threads, and an
autojump clock jumps while a thread works (to the test's own deadline, when
nothing else is due: seen at wrk-ork's start), so wrk-ork would see a worker
silent for seconds that were never lived. Every wait is polled and bounded.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from agents._agent import Workload
from contracts.agent_config import AgentConfig
from contracts.monitor import PROTOCOL as MONITOR_PROTOCOL
from contracts.monitor import QUERY, LogRecord, Query, decode_batch
from contracts.ork import (
    PROTOCOL,
    REGISTER_RACK,
    RegisterRack,
)
from nodes.k8s_worker.daemon import start_worker
from nodes.k8s_worker.settings import WorkerSettings
from nodes.monitor.daemon import RunningMonitor, serve_monitor
from nodes.monitor.settings import MonitorSettings
from nodes.ork.daemon import start_ork
from nodes.ork.settings import OrkSettings
from p2p.connection import Connection, ConnectionConfig
from p2p.daemon import Daemon
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.metrics import ProcessMetrics
from p2p.net import MemoryHost, MemoryInternet
from p2p.noise import SecretStream
from p2p.rpc import RpcClient

from .ork_driver import IMAGE, OrkDriver, container, hold_client, inference, status
from .owners import owned_shipping, release, set_owner
from .vm_backend import InProcessBackend, real_workload

__all__ = ["IMAGE", "MONITOR_TOKEN", "Cluster", "cluster", "container", "inference",
           "status"]

#: wrk-monitor's HTTP bearer token.
MONITOR_TOKEN = "in-process-cluster-monitor-token"

#: Each daemon's machine: its address and swarm port, the same on every start.
ORK = ("127.0.2.1", 4001)
WORKER = ("127.0.2.2", 4002)
MONITOR = ("127.0.2.3", 4003)
#: Where the test's clients (app-node's stand-in) dial from.
CLIENT = "127.0.1.1"
#: More machines for a test's own parts (:meth:`Cluster.machine`): 127.0.4.1, ...
_MACHINES = "127.0.4.{}"


@dataclass
class _Running:
    """One daemon's run: cancel :attr:`scope` to stop it; :attr:`done` once it stopped."""

    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    done: trio.Event = field(default_factory=trio.Event)

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(10):
            await self.done.wait()


@dataclass
class Cluster(OrkDriver):
    root: Path
    nursery: trio.Nursery
    internet: MemoryInternet
    backend: InProcessBackend
    client_key: KeyPair = field(default_factory=KeyPair.generate)
    #: The RPC client of wrk-ork's service (app-node's), while wrk-ork runs.
    client: RpcClient | None = None
    ork_key: str = ""
    worker_key: str = ""
    monitor_key: str = ""
    monitor_client: RpcClient | None = None
    monitor: RunningMonitor | None = None
    #: proxy-inference keys: they read wrk-ork's jobs and call the inference agents.
    proxy_keys: tuple[str, ...] = ()
    _ork: _Running | None = None
    _worker: _Running | None = None
    _client_scope: trio.CancelScope | None = None
    _machines: int = 0

    def machine(self) -> tuple[str, MemoryHost]:
        """A new machine on the cluster's network for the test's own parts (a proxy,
        app-node's database): its address and its network."""
        self._machines += 1
        address = _MACHINES.format(self._machines)
        return address, self.internet.host(address)

    @property
    def ork_address(self) -> tuple[str, int]:
        return ORK

    # -- daemons -------------------------------------------------------------------------

    @property
    def telemetry(self) -> dict:
        """The ``telemetry`` section of a daemon's settings: on once wrk-monitor runs."""
        if not self.monitor_key:
            return {}
        return {"monitor": self.monitor_key,
                "monitor_addresses": [f"{MONITOR[0]}:{MONITOR[1]}"]}

    async def _run(self, name: str, host: str, start, settings,
                   task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run one daemon as ``cosmicac run`` would, on its own host, until stopped."""
        set_owner(name)  # its records are its own (see owners.py)
        running = _Running()
        network = self.internet.host(host)
        try:
            with running.scope:
                async with trio.open_nursery() as nursery:
                    daemon = Daemon(name, settings, nursery, ProcessMetrics(),
                                    settings.storage, network=network)
                    await start(daemon)
                    task_status.started(running)
        finally:
            with trio.CancelScope(shield=True):
                await release(name)  # its queues' locks, as its process's end would
                await network.aclose()  # a stopped machine: its address is free again
            running.done.set()

    async def start_monitor(self) -> RunningMonitor:
        storage = self.root / "monitor"
        self.worker_storage.mkdir(parents=True, exist_ok=True)
        # The worker's identity made now (its daemon loads the same file), so that
        # wrk-monitor lists it among its workers (metrics.agents needs that).
        worker = load_or_create_keypair(self.worker_storage)
        settings = MonitorSettings.model_validate({
            "storage": storage, "host": MONITOR[0], "port": MONITOR[1],
            "allow_any_pusher": True, "workers": [worker.hex],
            "followers": [self.client_key.hex],
            "http": {"host": "127.0.0.1", "port": 0, "token": MONITOR_TOKEN}})
        storage.mkdir(parents=True, exist_ok=True)

        async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
            set_owner("wrk-monitor")
            await serve_monitor(settings, metrics=ProcessMetrics(),
                                network=self.internet.host(MONITOR[0]), task_status=task_status)

        self.monitor = await self.nursery.start(run)
        self.monitor_key = self.monitor.swarm.keypair.hex
        self.monitor_client, _ = await self.connect(MONITOR, self.monitor_key,
                                                    MONITOR_PROTOCOL, "test-monitor")
        return self.monitor

    @property
    def monitor_http_port(self) -> int:
        assert self.monitor is not None
        return self.monitor.http_address[1]

    async def logs(self, job_id: str, *, source: str | None = None) -> list[LogRecord]:
        """The job's records wrk-monitor holds (``logs.query``), oldest first."""
        assert self.monitor_client is not None, "wrk-monitor is not running"
        result = await self.monitor_client.call(QUERY, Query(job_id=job_id, source=source),
                                                timeout_s=10.0)
        return decode_batch(result.records)

    async def start_ork(self, *, unknown_after_s: float = 5.0) -> None:
        """Start wrk-ork (same address and storage every time) and connect as app-node."""
        storage = self.root / "ork"
        settings = OrkSettings.model_validate({
            "storage": storage, "host": ORK[0], "port": ORK[1],
            "app_nodes": [self.client_key.hex], "proxies": list(self.proxy_keys),
            "tick_interval_s": 0.2,
            "unknown_after_s": unknown_after_s, "fsync": False, "telemetry": self.telemetry})
        self.ork_key = load_or_create_keypair(storage).hex
        self._ork = await self.nursery.start(self._run, "wrk-ork", ORK[0], start_ork, settings)
        self.client, self._client_scope = await self.connect(ORK, self.ork_key, PROTOCOL,
                                                             "test-app-node")

    async def kill_ork(self) -> None:
        assert self._ork is not None and self._client_scope is not None
        self._client_scope.cancel()
        await self._ork.stop()
        self._ork = self.client = None

    @property
    def worker_storage(self) -> Path:
        return self.root / "worker"

    async def start_worker(self, **changes) -> None:
        config = {
            "storage": self.worker_storage, "ork": self.ork_key,
            "ork_addresses": [f"{ORK[0]}:{ORK[1]}"], "host": WORKER[0], "port": WORKER[1],
            # "local": the worker tells its agents its own address, as with local VMIs.
            "backend": "local",
            "agents": {"heartbeat_interval_s": 0.5, "silent_after_s": 3.0},
            # With proxies, agents announce their jobs on the DHT: wrk-ork's
            # swarm (which has no bootstrap of its own) is the network's bootstrap.
            "interconnect": ({"proxies": list(self.proxy_keys),
                              "bootstrap": [f"{ORK[0]}:{ORK[1]}"]} if self.proxy_keys else {}),
            "report_interval_s": 1.0, "agent_metrics_interval_s": 0.5, "fsync": False,
            "telemetry": self.telemetry,
        }
        config.update(changes)
        settings = WorkerSettings.model_validate(config)
        self.worker_storage.mkdir(parents=True, exist_ok=True)
        self.worker_key = load_or_create_keypair(self.worker_storage).hex
        start = functools.partial(start_worker, backend=self.backend)
        self._worker = await self.nursery.start(self._run, "wrk-server-k8s-nvidia",
                                                WORKER[0], start, settings)

    async def kill_worker(self) -> None:
        assert self._worker is not None
        await self._worker.stop()
        self._worker = None

    # -- clients -------------------------------------------------------------------------

    async def connect(self, address: tuple[str, int], key: str, protocol: str, name: str
                      ) -> tuple[RpcClient, trio.CancelScope]:
        """An RPC client of ``protocol`` on a connection from the test's host to
        ``address``, held in the nursery until the returned scope is cancelled."""
        host: MemoryHost = self.internet.host(CLIENT)
        config = ConnectionConfig()
        with trio.fail_after(config.connect_timeout_s):
            raw = await host.open_stream(address)
        stream = await SecretStream.initiator(raw, self.client_key, bytes.fromhex(key),
                                              config=config.stream)
        connection = Connection(stream, config=config, remote_address=address)
        return await hold_client(self.nursery, connection, protocol, name)

    # -- VMIs ----------------------------------------------------------------------------

    def agent_boot(self, folder: Path) -> int:
        """Which start of an agent the VMI of ``folder`` runs (a new VMI: a new number)."""
        return self.backend.vm_of(folder).boot

    async def kill_agent(self, folder: Path) -> None:
        await self.backend.kill(folder)


@asynccontextmanager
async def cluster(root: Path, *, monitor: bool = False, proxy_keys: tuple[str, ...] = (),
                  workload: Callable[[AgentConfig], Workload | None] = real_workload
                  ) -> AsyncIterator[Cluster]:
    """wrk-ork and one worker (2 nodes of 8 GPUs), its rack registered; ``monitor``:
    wrk-monitor too, with wrk-ork and the worker shipping their logs to it;
    ``proxy_keys`` may read wrk-ork's jobs and call the inference agents;
    ``workload``: what each agent runs (default: as the agent process does)."""
    with owned_shipping():
        async with trio.open_nursery() as nursery:
            internet = MemoryInternet()
            await nursery.start(internet.run)
            backend = InProcessBackend(nursery, internet, root / "worker" / "vmis",
                                       workload=workload)
            path = Cluster(root, nursery, internet, backend, proxy_keys=proxy_keys)
            try:
                if monitor:
                    await path.start_monitor()
                await path.start_ork()
                await path.start_worker()
                await path.call(REGISTER_RACK, RegisterRack(rack=path.worker_key,
                                                            location="default"))
                await path.wait_rack_reported()
                yield path
            finally:
                nursery.cancel_scope.cancel()
