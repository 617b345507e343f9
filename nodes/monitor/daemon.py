"""wrk-monitor as a daemon: one swarm serving ``cosmicac-monitor/1``, an HTTP side beside it.

One swarm, one identity (``<storage>/identity``), serving
:class:`~nodes.monitor.service.MonitorService` over one
:class:`~nodes.monitor._buffer.LogBuffer`. The Loki in force is held by an
:class:`~nodes.monitor.observability.ObservabilityHolder`: at start what
app-node last sent (``<storage>/observability.json``), else ``loki.url``;
app-node's ``observability.set`` swaps it at runtime and ``observability.clear``
forgets it (back to ``loki.url``, or none). With a Loki, every
accepted record is also offered to its :class:`~nodes.monitor.loki.LokiPusher`
(the service's ``on_records`` hook: a sync, bounded append, so Loki being
slow or down never slows a push; its own task sends batches), and
``logs.query`` and the HTTP side read history older than the buffer with its
:class:`~nodes.monitor.loki.LokiReader`. The HTTP side (:mod:`._http`) serves
``/metrics`` (its own counters, the process's, and what the proxies forward:
:mod:`._health_metrics`) and ``/jobs/{id}/logs``. The proxies' ``metrics.push``
reports go to a :class:`~nodes.monitor.health.HealthBook` judged with
``settings.health``.

:func:`serve_monitor` runs it in-process (tests); :func:`start_monitor` is
``cosmicac run wrk-monitor`` on the daemon kit.
"""

from __future__ import annotations

import functools
import gc
import logging
from dataclasses import dataclass

import trio
from prometheus_client import CollectorRegistry, ProcessCollector

from nodes.kit.metrics import snapshot_registry
from nodes.kit.peer import RunningDaemon, in_process, serve_http, start_peer, start_served
from nodes.kit.ready import print_ready
from p2p.daemon import Daemon, ProcessMetrics
from p2p.keys import format_key, load_or_create_keypair
from p2p.net import Network

from ._buffer import LogBuffer
from ._health_metrics import health_registry
from ._http import LogsFront, create_app
from ._metrics import monitor_snapshot
from .agent_metrics import AgentMetricsBook, agent_metrics_registry, install
from .health import HealthBook, Thresholds
from .observability import ObservabilityHolder, to_loki
from .service import ROLES, MonitorService
from .settings import MonitorSettings

__all__ = ["RunningMonitor", "reserved_peers", "serve_monitor", "start_monitor",
           "to_loki", "tune_gc"]

log = logging.getLogger(__name__)

#: Allocations between young collections in the wrk-monitor process (see start_monitor).
GC_YOUNG_THRESHOLD = 10_000


@dataclass
class RunningMonitor(RunningDaemon):
    """A monitor serving in-process: where, and its parts (for tests)."""

    service: MonitorService
    front: LogsFront
    observability: ObservabilityHolder


async def serve_monitor(settings: MonitorSettings, *, metrics: ProcessMetrics | None = None,
                        network: Network | None = None,
                        task_status: trio.TaskStatus[RunningMonitor] = trio.TASK_STATUS_IGNORED
                        ) -> None:
    """Run wrk-monitor until cancelled; report a :class:`RunningMonitor` once serving.

    Args:
        settings: the daemon's settings (``storage`` must exist and be this
            monitor's alone).
        metrics: the process's endpoint (the kit's), to which the monitor adds
            its registries; ``/metrics`` then shows all of the process.
        network: sockets (real by default).

    Raises:
        HttpTokenError: ``http.token_file`` is unreadable or holds no token.
        DaemonError: the swarm's port cannot be bound.
        nodes.kit.peer.HttpBindError: the HTTP port cannot be bound.
    """
    token = await trio.to_thread.run_sync(settings.http.resolved_token)  # HttpTokenError
    keypair = await trio.to_thread.run_sync(load_or_create_keypair, settings.storage)
    b = settings.buffer
    buffer = LogBuffer(max_records=b.max_records, max_bytes=b.max_bytes,
                       queue_records=b.queue_records)
    observability = await trio.to_thread.run_sync(functools.partial(
        ObservabilityHolder.from_storage, settings.storage, settings_url=settings.loki.url,
        settings_tenant=settings.loki.tenant,
        pusher_options={"max_buffered": settings.loki.max_buffered,
                        "flush_interval_s": settings.loki.flush_interval_s},
        grace_s=settings.loki.grace_s))
    book = HealthBook(Thresholds(**settings.health.model_dump()))
    service = MonitorService(buffer, pushers=settings.pushers,
                             allow_any_pusher=settings.allow_any_pusher,
                             proxies=settings.proxies, workers=settings.workers,
                             followers=settings.followers,
                             on_records=observability.offer,
                             health=book, observability=observability)
    agent_book = AgentMetricsBook(stale_after_s=settings.health.stale_after_s)
    install(service, agent_book)  # metrics.agents from the workers (agent_metrics.py)
    process = CollectorRegistry()
    ProcessCollector(registry=process)  # process_cpu_seconds_total, memory, open fds
    # /metrics shows the process's endpoint: its own when run in-process.
    metrics = metrics if metrics is not None else ProcessMetrics()
    metrics.add(snapshot_registry(functools.partial(monitor_snapshot, service, observability)),
                health_registry(book, service.clock),
                agent_metrics_registry(agent_book, service.clock), process)
    front = LogsFront(buffer=buffer, registry=metrics.registry,
                      readers=lambda: observability.reader,
                      prometheus=lambda: observability.prometheus, token=token,
                      max_followers=settings.http.max_followers,
                      max_followers_per_client=settings.http.max_followers_per_client,
                      trusted_proxies=settings.http.trusted_proxies)
    _log_access(settings, token)
    async with trio.open_nursery() as nursery:
        await nursery.start(observability.run)
        swarm, swarm_address = await start_peer(
            in_process(nursery, metrics, network), keypair, settings, [service],
            reserved=reserved_peers(settings))
        http_address = await nursery.start(serve_http, create_app(front), settings.http)
        state = observability.state()
        log.info("monitor.serving http=%s:%d swarm=%s:%d key=%s loki=%s from=%s",
                 *http_address, *swarm_address, format_key(keypair.public_key)[:12],
                 state.loki_url or "off", state.origin)
        task_status.started(RunningMonitor(
            http_address=http_address, swarm_address=swarm_address, swarm=swarm,
            service=service, front=front, observability=observability))
        await trio.sleep_forever()


def reserved_peers(settings: MonitorSettings) -> frozenset[bytes]:
    """The keys that keep connection slots under a flood of strangers: every
    key a role names (pushers, proxies, workers, followers), so a role added
    to :data:`~.service.ROLES` is kept room for too. Agents pushing through
    ``allow_any_pusher`` are strangers: any key may be one."""
    return frozenset(key for role in ROLES for key in getattr(settings, role))


def _log_access(settings: MonitorSettings, token: str | None) -> None:
    """Say at start who may call what, and what is closed for want of a setting."""
    empty = [role for role in ROLES if not getattr(settings, role)
             and not (role == "pushers" and settings.allow_any_pusher)]
    log.info("monitor.access pushers=%s proxies=%d workers=%d followers=%d http_token=%s",
             "any" if settings.allow_any_pusher else len(settings.pushers),
             len(settings.proxies), len(settings.workers), len(settings.followers),
             "set" if token else "unset")
    if empty:
        log.warning("monitor.access.empty lists=%s: their methods are refused to every key "
                    "(service.py METHOD_ROLES); add the peers' keys to these settings",
                    ",".join(empty))
    if token is None:
        log.warning("monitor.http.closed: no http.token or http.token_file, so every HTTP "
                    "route (/metrics and the logs) answers 403 HTTP_TOKEN_NOT_SET")


def tune_gc() -> None:
    """The wrk-monitor process's garbage collector, set for its allocation rate.

    wrk-monitor allocates a few tuples per record, tens of thousands a second:
    at CPython's default (700) a young collection runs every few pushes and the
    full ones pause the event loop for 100+ ms (bench/monitor.py with Loki on).
    What exists at start-up (modules, settings) is frozen out of collections.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


async def start_monitor(daemon: Daemon[MonitorSettings]) -> None:
    """``cosmicac run wrk-monitor``: start in ``daemon.nursery``; return once serving.

    A failure to start (a port, the token file) ends it with one line:
    ``run_daemon`` reads it out of the nurseries.
    """
    tune_gc()
    running: RunningMonitor = await start_served(daemon, serve_monitor)
    print_ready("wrk-monitor", key=running.swarm.keypair.hex,
                addresses={"swarm": running.swarm_address, "http": running.http_address},
                facts={"loki": running.observability.state().loki_url or "off"})
