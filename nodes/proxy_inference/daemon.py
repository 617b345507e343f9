"""proxy-inference as a daemon: one peer hosting the shared database, an HTTP front beside it.

One swarm, one identity (``<storage>/identity``):

- the shared database's replica (``cosmicac-db/1``, opened with
  ``PROXY_AUTOBASE_KEY``): API keys read, usage and last-used times written
  once an admin admitted the proxy (``task autobase-connect``);
- a connection to wrk-ork (``cosmicac-ork/1``: ``jobs.list``, ``jobs.watch``)
  for the routing table;
- connections to the routed jobs' agents (``cosmicac-inference/1``), found on
  the jobs' DHT topics and by key;
- the OpenAI-compatible HTTP front (:mod:`.app`) on ``http.host:http.port``;
- with ``telemetry.monitor`` set, its log records shipped to wrk-monitor
  (:mod:`nodes.kit.telemetry`; no line per request), and its per-job window of
  requests, errors and latency (:mod:`.health`) pushed there every few seconds
  (:mod:`.reporter`, ``metrics.push``) for wrk-monitor's model health.

:func:`serve_proxy` starts all of it in-process (tests, benchmarks);
:func:`start_proxy` is the ``cosmicac run proxy-inference`` entry on the
daemon kit. Stopping (cancellation, SIGTERM) flushes the usage book last.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import trio

from crdt import Database, FsyncPolicy, run_database_service
from nodes.kit.metrics import Snapshot
from nodes.kit.peer import HttpBindError, RunningDaemon, in_process, start_peer, start_served
from nodes.kit.ready import print_ready
from nodes.kit.telemetry import start_telemetry
from p2p.daemon import Daemon, DaemonError, ProcessMetrics
from p2p.host import Reserved
from p2p.http import serve_asgi
from p2p.keys import format_key, load_or_create_keypair
from p2p.net import Network
from p2p.swarm import Swarm

from .app import Front, create_app
from .health import HealthWindow
from .jobs import JobSource, OrkJobSource
from .keys import KeyCache
from .metrics import ProxyMetrics, state_snapshot
from .replicas import Balancer
from .reporter import HealthReporter, health_snapshot
from .router import RoutingTable
from .settings import ProxySettings
from .upstream import AgentPool
from .usage import UsageRecorder

__all__ = ["RunningProxy", "reserved_peers", "serve_proxy", "start_proxy"]

log = logging.getLogger(__name__)


@dataclass
class RunningProxy(RunningDaemon):
    """A proxy serving in-process: where (``url``: the OpenAI base URL), and its
    parts (for tests and benchmarks)."""

    url_path = "/v1"
    front: Front
    pool: AgentPool
    recorder: UsageRecorder
    metrics: ProxyMetrics
    job_source: JobSource
    #: With ``telemetry.monitor``: the per-job window and its reporter.
    reporter: HealthReporter | None = None

    @property
    def table(self) -> RoutingTable:
        return self.pool.table


def reserved_peers(settings: ProxySettings,
                   routed: Callable[[], Collection[bytes]]) -> Reserved:
    """The keys that keep connection slots under a flood of strangers: wrk-ork,
    the shared database's bootstrap (app-node; the database's other writers
    while it runs: :func:`crdt.run_database_service`) and ``routed()``, the
    agents of the jobs routed to now."""
    fixed = frozenset(key for key in (settings.ork, settings.database) if key is not None)
    return lambda key: key in fixed or key in routed()


async def serve_proxy(settings: ProxySettings, *, job_source: JobSource | None = None,
                      metrics: ProcessMetrics | None = None, network: Network | None = None,
                      task_status: trio.TaskStatus[RunningProxy] = trio.TASK_STATUS_IGNORED
                      ) -> None:
    """Run the whole proxy until cancelled; report a :class:`RunningProxy` once serving.

    Args:
        settings: the daemon's settings (``storage`` must exist and be this
            proxy's alone; the daemon kit locks it, an in-process caller must
            not share it).
        job_source: where jobs come from; None: wrk-ork (``settings.ork``).
        metrics: the process's endpoint, to which the proxy adds its registries.
        network: sockets (real by default).

    Raises:
        DaemonError: no wrk-ork and no job source; no database key; the
            swarm's port cannot be bound.
        nodes.kit.peer.HttpBindError: the HTTP port cannot be bound.
    """
    storage = settings.storage
    if job_source is None and settings.ork is None:
        raise DaemonError("set ork (COSMICAC_PROXY__ORK): wrk-ork's public key, whose jobs "
                          "the proxy routes to", exit_code=2)
    if settings.database is None and not (storage / "db" / "database.json").exists():
        raise DaemonError("set PROXY_AUTOBASE_KEY (or COSMICAC_PROXY__DATABASE): the shared "
                          "database's bootstrap key", exit_code=2)
    keypair = await trio.to_thread.run_sync(load_or_create_keypair, storage)
    if settings.ork is not None and settings.ork == keypair.public_key:
        raise DaemonError("ork is this proxy's own key: give wrk-ork's public key")
    balancer = Balancer(backoff_s=settings.replica_backoff_s,
                        backoff_max_s=max(settings.replica_backoff_s,
                                          settings.replica_backoff_max_s))
    proxy_metrics = ProxyMetrics()
    pool: AgentPool | None = None

    def add_pool(swarm: Swarm) -> None:
        # The agents it routes to are the only strangers it lets in, and keep their room.
        nonlocal pool
        pool = agents = AgentPool(swarm, balancer, on_retry=lambda route:
                                  proxy_metrics.retries.labels(route.served_name).inc(),
                                  connect_wait_s=settings.replica_connect_wait_s)
        swarm.add_firewall(agents.allows)
        swarm.add_reserved(reserved_peers(settings, lambda: agents.table.connect_keys()))

    # The database closes last: on a stop the usage recorder's final flush
    # must still find it open (its scope is shielded and cancelled only once
    # everything else has ended, below).
    db_scope = trio.CancelScope(shield=True)

    async def run_database(task_status: trio.TaskStatus = trio.TASK_STATUS_IGNORED) -> None:
        with db_scope:
            await run_database_service(
                storage, swarm=swarm, bootstrap=settings.database,
                fsync=FsyncPolicy.ALWAYS if settings.fsync else FsyncPolicy.NEVER,
                task_status=task_status)

    async with trio.open_nursery() as nursery:
        daemon = in_process(nursery, metrics, network)
        swarm, swarm_address = await start_peer(daemon, keypair, settings, setup=add_pool)
        assert pool is not None
        await start_telemetry(daemon, swarm, settings.telemetry, service="proxy-inference")
        service = await nursery.start(run_database)
        try:
            await _serve(settings, swarm, swarm_address, service.db, pool, balancer,
                         proxy_metrics, job_source, metrics, task_status)
        finally:
            db_scope.cancel()


async def _serve(settings: ProxySettings, swarm: Swarm, swarm_address: tuple[str, int],
                 db: Database, pool: AgentPool, balancer: Balancer,
                 proxy_metrics: ProxyMetrics, job_source: JobSource | None,
                 metrics: ProcessMetrics | None,
                 task_status: trio.TaskStatus[RunningProxy]) -> None:
    """Everything that needs the database, until cancelled; the recorder stops last."""
    storage = settings.storage
    keypair = swarm.keypair
    if db.bootstrap == db.key:
        log.warning("proxy.own_database db=%s reason=the proxy created the database it "
                    "opened; app-node's keys are not in it", format_key(db.bootstrap)[:16])
    keys = KeyCache(db)
    usage = settings.usage
    recorder = UsageRecorder(db, storage=storage, flush_interval_s=usage.flush_interval_s,
                             flush_ops=usage.flush_ops, ops_per_entry=usage.ops_per_entry,
                             max_buckets=usage.max_buckets)
    # The recorder stops last (its nursery is the outermost): requests
    # still finishing may count usage until the very end.
    async with trio.open_nursery() as serving:
        await serving.start(recorder.run)
        async with trio.open_nursery() as inner:
            await inner.start(keys.run)
            await inner.start(pool.run)
            front = Front(keys=keys, table=lambda: pool.table, pool=pool,
                          recorder=recorder, metrics=proxy_metrics,
                          bodies=settings.http.body_budget(),
                          body_timeout_s=settings.http.body_timeout_s)
            reporter = None
            if (monitor := settings.telemetry.monitor_peer) is not None:
                front.health = HealthWindow()
                reporter = HealthReporter(front.health, routed=lambda: pool.table.jobs.keys())
                inner.start_soon(functools.partial(
                    reporter.run, swarm, monitor.key, monitor.addresses))

            def publish(jobs) -> None:
                pool.apply(RoutingTable.from_jobs(jobs))

            source = job_source
            if source is None:
                ork = settings.ork_peer
                assert ork is not None  # serve_proxy refuses to start without either
                source = OrkJobSource(swarm, ork.key, addresses=ork.addresses,
                                      refresh_s=settings.jobs_refresh_s)
            await inner.start(source.run, publish)

            def snapshot() -> Snapshot:
                now = trio.current_time()
                replicas: dict[str, float] = {}
                for job_id, route in pool.table.jobs.items():  # a name may serve many teams
                    replicas[route.served_name] = (replicas.get(route.served_name, 0.0)
                                                   + balancer.healthy(job_id, now))
                snap = state_snapshot(
                    replicas=replicas,
                    pending_ops=len(recorder.book), written_ops=recorder.ops_written,
                    dropped=recorder.book.dropped, keys_cached=len(keys),
                    bodies_held=front.bodies.held, bodies_reading=front.bodies.reading,
                    bodies_refused=front.bodies.refused)
                if reporter is not None:
                    snap.families.update(health_snapshot(reporter).families)
                return snap

            proxy_metrics.set_snapshot(snapshot)
            if metrics is not None:
                metrics.add(proxy_metrics.registry, proxy_metrics.state_registry,
                            db.metrics.registry)
            # The OpenAI API on the lean HTTP/1.1 server (p2p.httpserver): its own
            # cost per request is a fraction of hypercorn's, which the hot path feels.
            http_address = await inner.start(functools.partial(
                serve_asgi, create_app(front), host=settings.http.host,
                port=settings.http.port, bind_error=HttpBindError, lean=True))
            log.info("proxy.serving http=%s:%d swarm=%s:%d key=%s db=%s writer=%s",
                     *http_address, *swarm_address, format_key(keypair.public_key)[:12],
                     format_key(db.bootstrap)[:12], db.is_writer)
            task_status.started(RunningProxy(
                http_address=http_address, swarm_address=swarm_address, swarm=swarm,
                front=front, pool=pool, recorder=recorder, metrics=proxy_metrics,
                job_source=source, reporter=reporter))
            await trio.sleep_forever()


async def start_proxy(daemon: Daemon[ProxySettings]) -> None:
    """``cosmicac run proxy-inference``: start in ``daemon.nursery``; return once serving.

    A failure to start (a port, a missing key) ends it with one line:
    ``run_daemon`` reads it out of the nurseries.
    """
    running: RunningProxy = await start_served(daemon, serve_proxy)
    host, port = running.http_address
    print_ready("proxy-inference", key=running.swarm.keypair.hex,
                addresses={"swarm": running.swarm_address, "http": running.http_address},
                note=f"the API at http://{host}:{port}/v1")
