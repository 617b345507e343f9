"""app-node as a daemon: one peer creating and administering the shared database,
holding a connection to wrk-ork, and serving the HTTP API under ``/api``.

One swarm, one identity (``<storage>/identity``):

- the shared database (``cosmicac-db/1``): app-node creates it on first start
  (its bootstrap key is app-node's key: what ``task wire`` writes to
  ``PROXY_AUTOBASE_KEY``) and is its admin; ``database_writers`` (the proxy's
  key) are admitted at start;
- :class:`~nodes.kit.ork_client.OrkClient` to wrk-ork (``cosmicac-ork/1``) for
  job, replica, rack and node operations, and one ``jobs.watch`` on it
  (:func:`~.job_events.follow_ork`) whose status changes a
  :class:`~.job_events.JobHub` fans out to the API's event streams, and
  which keeps app-node's copy of the jobs
  (:class:`~.job_projection.JobProjection`) that job listings and pages read;
- :class:`~nodes.kit.monitor_client.MonitorClient` to wrk-monitor
  (``cosmicac-monitor/1``) when ``monitor`` is set, for the jobs' logs, and
  telling wrk-monitor the operator's Loki and Prometheus (``observability``)
  each time it connects, or to forget the ones it sent before when none is
  set; and
  app-node's own log records shipped to the same wrk-monitor
  (:mod:`nodes.kit.telemetry`, unless ``telemetry.ship`` is false);
- its own SQLite file (``<storage>/app-node.sqlite``: users, teams, tokens,
  job records), called through worker threads;
- the health prober (:mod:`.health`): wrk-ork, wrk-monitor, the database, itself
  and its email every ``health.interval_s``, into ``<storage>/health.sqlite``
  or Redis (``redis_url``);
- the HTTP API (:func:`nodes.app_node.api.create_app`) on ``http.host:http.port``,
  behind the entry point's ``/api``.

:func:`serve_app_node` runs it in-process (tests); :func:`start_app_node` is
``cosmicac run app-node`` on the daemon kit.
"""

from __future__ import annotations

import functools
import gc
import logging
from dataclasses import dataclass

import trio

from crdt import FsyncPolicy, WriteRefused, run_database_service
from nodes.kit.metrics import snapshot_registry
from nodes.kit.peer import RunningDaemon, in_process, serve_http, start_peer, start_served
from nodes.kit.ready import print_ready
from nodes.kit.telemetry import start_telemetry
from p2p.daemon import Daemon, DaemonError, ProcessMetrics
from p2p.keys import load_or_create_keypair
from p2p.net import Network

from .auth import DEFAULT_PARAMS
from .email import make_sender
from .health import HealthProber, build_prober
from .job_events import JobHub, follow_ork
from .job_projection import JobProjection
from .ratelimit import make_limiter
from .services import AppServices
from .settings import AppNodeSettings
from .store import Store

__all__ = ["RunningAppNode", "reserved_peers", "serve_app_node", "start_app_node"]

log = logging.getLogger(__name__)


@dataclass
class RunningAppNode(RunningDaemon):
    """app-node serving in-process: where (``url``: the API's base), and its
    parts (for tests)."""

    url_path = "/api"
    services: AppServices


def reserved_peers(settings: AppNodeSettings) -> frozenset[bytes]:
    """The keys that keep connection slots under a flood of strangers: the
    shared database's writers and readers (and, while it runs, every writer
    admitted since: :func:`crdt.run_database_service`), wrk-ork and wrk-monitor."""
    return frozenset({*settings.database_writers, *settings.database_readers,
                      *(key for key in (settings.ork, settings.monitor) if key is not None)})


async def serve_app_node(settings: AppNodeSettings, *, metrics: ProcessMetrics | None = None,
                         network: Network | None = None,
                         task_status: trio.TaskStatus[RunningAppNode] = trio.TASK_STATUS_IGNORED
                         ) -> None:
    """Run app-node until cancelled; report a :class:`RunningAppNode` once serving."""
    from nodes.kit.monitor_client import MonitorClient
    from nodes.kit.ork_client import OrkClient

    from .api import create_app
    from .api._swarm import swarm_advert
    from .shell_keys import ShellKeySync

    storage = settings.storage
    keypair = await trio.to_thread.run_sync(load_or_create_keypair, storage)
    store = await trio.to_thread.run_sync(Store.open, storage / "app-node.sqlite")
    limiter = make_limiter(settings.limits, settings.redis_url)
    health: HealthProber | None = None
    try:
        async with trio.open_nursery() as nursery:
            daemon = in_process(nursery, metrics, network)
            swarm, swarm_address = await start_peer(daemon, keypair, settings,
                                                    reserved=reserved_peers(settings))
            await start_telemetry(daemon, swarm, settings.telemetry_settings(),
                                  service="app-node")
            service = await nursery.start(functools.partial(
                run_database_service, storage / "db", swarm=swarm,
                allow=frozenset(settings.database_writers),
                readers=frozenset(settings.database_readers),
                fsync=FsyncPolicy.ALWAYS if settings.fsync else FsyncPolicy.NEVER))
            db = service.db
            for writer in settings.database_writers:  # again at each start: a no-op then
                try:
                    await db.change_writer("add_writer", writer)
                except WriteRefused as exc:
                    raise DaemonError(f"cannot admit {writer.hex()[:16]} as a writer of the "
                                      f"shared database: {exc}") from None
            if settings.password_hash.below_floor:
                log.warning("app_node.weak_password_hash: password_hash %s costs less than "
                            "OWASP's floor (%s): for tests only",
                            settings.password_hash.params().encode(), DEFAULT_PARAMS.encode())
            if settings.monitor is None and settings.observability.configured:
                log.warning("app_node.observability_unused: observability is set but monitor "
                            "is not; no wrk-monitor gets the Loki and Prometheus URLs")
            ork, events, jobs = None, None, None
            if (ork_peer := settings.ork_peer) is not None:
                ork = OrkClient(swarm, ork_peer.key, addresses=ork_peer.addresses)
                await nursery.start(ork.run)
                events, jobs = JobHub(), JobProjection()
                await nursery.start(follow_ork, ork, events, jobs)
                # Shell access follows team membership on running jobs.
                await nursery.start(ShellKeySync(store, ork).run)
            monitor = None
            if (monitor_peer := settings.monitor_peer) is not None:
                monitor = MonitorClient(swarm, monitor_peer.key, addresses=monitor_peer.addresses,
                                        observability=settings.observability.to_send())
                await nursery.start(monitor.run)
            email = make_sender(settings.email, storage)
            # The health history: its own store, one task.
            health = await trio.to_thread.run_sync(functools.partial(
                build_prober, settings.health, storage, settings.redis_url, ork=ork,
                monitor=monitor, database=service, email=email, limiter=limiter))
            if health is not None:
                await nursery.start(health.run)
            services = AppServices(store=store, database=db, ork=ork, email=email,
                                   limiter=limiter, limits=settings.limits,
                                   public_url=settings.public_url,
                                   default_image=settings.default_image,
                                   swarm=swarm_advert(settings), events=events, jobs=jobs,
                                   monitor=monitor, health=health,
                                   teams=settings.teams)
            if metrics is not None:
                metrics.add(db.metrics.registry)
                if jobs is not None:
                    metrics.add(snapshot_registry(jobs.metrics))
            # On the lean server: hypercorn's h11 was two fifths of a listing's CPU.
            http_address = await nursery.start(functools.partial(
                serve_http, create_app(services, password_params=settings.password_hash.params(),
                                       body_limits=settings.http.body),
                settings.http, "the API", lean=True))
            log.info("app_node.serving http=%s:%d swarm=%s:%d key=%s db=%s", *http_address,
                     *swarm_address, keypair.hex[:12], db.bootstrap.hex()[:16])
            task_status.started(RunningAppNode(http_address, swarm_address, swarm, services))
    finally:
        store.close()
        if health is not None:
            with trio.CancelScope(shield=True):
                await health.store.aclose()


#: Longest :func:`freeze_startup_heap` waits for the copy of the jobs before freezing.
FREEZE_WAIT_S = 60.0


async def freeze_startup_heap(jobs: JobProjection | None) -> None:
    """``gc.freeze()`` once app-node serves and its copy of the jobs is synced (or
    after :data:`FREEZE_WAIT_S`): what start-up built (modules, settings, the
    copy) lives as long as the process, yet every full collection walked it
    again, stopping every request for 40-180 ms under ``bench/api.py``'s load
    (the listing's p99). Frozen objects are still freed by their reference
    counts; only a cycle among them would stay. Only in app-node's own process
    (``cosmicac run``): the in-process runs of tests share their heap."""
    if jobs is not None:
        with trio.move_on_after(FREEZE_WAIT_S):
            await jobs.wait_synced()
    gc.collect()  # start-up's garbage goes first: frozen, it would never be collected
    gc.freeze()
    log.info("app_node.heap_frozen objects=%d", gc.get_freeze_count())


async def start_app_node(daemon: Daemon[AppNodeSettings]) -> None:
    """``cosmicac run app-node``: start in ``daemon.nursery``; return once serving.

    A failure to start (a port, the database) ends it with one line:
    ``run_daemon`` reads it out of the nurseries.
    """
    running: RunningAppNode = await start_served(daemon, serve_app_node)
    daemon.nursery.start_soon(freeze_startup_heap, running.services.jobs)
    host, port = running.http_address
    print_ready("app-node", key=running.swarm.keypair.hex,
                addresses={"swarm": running.swarm_address, "http": running.http_address},
                facts={"database": running.services.database.bootstrap.hex()},
                note=f"the API at http://{host}:{port}/api")
