"""Telemetry for a platform daemon: its log records shipped to wrk-monitor.

Each daemon (wrk-ork, the worker, proxy-inference, app-node) nests a
:class:`TelemetrySettings` as ``telemetry`` in its settings
(``COSMICAC_ORK__TELEMETRY__MONITOR=<hex>``,
``K8S_COMMON_CONFIG__TELEMETRY__MONITOR=<hex>`` for the worker) and calls
:func:`start_telemetry` once its swarm runs. With no ``monitor`` nothing
happens: telemetry is off, the daemon logs to its stream only.

With a monitor, every record the root logger passes at ``level`` or above is
also offered to a :class:`~runtime.log_shipper.LogShipper` as a System
record (``job_id``/``replica`` from the call's ``extra``: the job steps of
wrk-ork and the worker set them), and the shipper's task keeps a connection to
wrk-monitor and pushes (``cosmicac-monitor/1`` ``logs.push``; wrk-monitor must
list the daemon's key in its ``pushers``). ``offer`` never blocks: while
wrk-monitor is slow or down the oldest records beyond ``max_records`` are
dropped and counted, and the daemon's own work never waits for it. The
first drop of an episode is logged once as a warning (``telemetry.dropping``),
and once more when the queue has drained (``telemetry.caught_up``).

Metrics (on the daemon's one endpoint): ``telemetry_records_sent_total``,
``telemetry_records_dropped_total``, ``telemetry_records_refused_total``,
``telemetry_records_pending`` and ``telemetry_connected``.

Falls short: the handler sits on the *root* logger, so it ships every record
of the process: several daemons served in one process (tests) with telemetry
on would all ship under the first one's ``service``. A record below the
daemon's own ``log_level`` never reaches the handler (the root logger drops
it first), whatever ``level`` says.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import trio
from pydantic import BaseModel, Field

from nodes.kit.metrics import Family, Snapshot, snapshot_registry
from nodes.kit.settings import PeerRef, peer_ref
from p2p.daemon import AddressList, LogLevel, ProcessMetrics, PublicKey
from p2p.keys import format_key
from runtime.log_shipper import DEFAULT_MAX_RECORDS, LogShipper, ShipperHandler

__all__ = ["DROP_CHECK_INTERVAL_S", "ShipperSettings", "TelemetryHost", "TelemetrySettings",
           "shipper_snapshot", "start_telemetry", "telemetry_host"]

log = logging.getLogger(__name__)

#: How often the drop counter is looked at for the one warning per episode.
DROP_CHECK_INTERVAL_S = 1.0


class ShipperSettings(BaseModel):
    """How a daemon ships its records (without where to: app-node's ``monitor`` says it)."""

    model_config = {"extra": "forbid"}

    #: Records held while wrk-monitor is slow or down; beyond it the oldest are
    #: dropped and counted (100,000: ~100 s of a busy daemon, tens of MB at most).
    max_records: int = Field(default=DEFAULT_MAX_RECORDS, ge=1, le=10_000_000)
    #: The lowest level shipped (records below the daemon's ``log_level`` are
    #: never made, whatever this says).
    level: LogLevel = "info"


class TelemetrySettings(ShipperSettings):
    """A daemon's ``telemetry`` section: where its records go and how many wait."""

    #: wrk-monitor's public key; None: telemetry off (nothing is shipped).
    monitor: PublicKey | None = None
    #: Where wrk-monitor listens (``host:port``), tried before the DHT.
    monitor_addresses: AddressList = ()

    @property
    def monitor_peer(self) -> PeerRef | None:
        """wrk-monitor (``monitor`` and ``monitor_addresses``); None: telemetry off."""
        return peer_ref(self, "monitor")


class TelemetryHost(Protocol):
    """What :func:`start_telemetry` needs of a daemon (the kit's ``Daemon`` has it)."""

    @property
    def nursery(self) -> trio.Nursery: ...

    @property
    def metrics(self) -> ProcessMetrics | None: ...


@dataclass
class _Host:
    nursery: trio.Nursery
    metrics: ProcessMetrics | None


def telemetry_host(nursery: trio.Nursery, metrics: ProcessMetrics | None) -> TelemetryHost:
    """A :class:`TelemetryHost` for a daemon served in-process (``serve_proxy`` …)."""
    return _Host(nursery, metrics)


def shipper_snapshot(shipper: LogShipper) -> Snapshot:
    """The shipper's counters as metric families (plain ints: safe to read on a scrape)."""
    return Snapshot({
        "telemetry_records_sent": Family("Log records wrk-monitor acknowledged",
                                         shipper.sent, counter=True),
        "telemetry_records_dropped": Family(
            "Log records dropped (oldest first) while wrk-monitor was slow or down",
            shipper.dropped, counter=True),
        "telemetry_records_refused": Family("Log records wrk-monitor refused (dropped)",
                                            shipper.refused, counter=True),
        "telemetry_records_pending": Family("Log records waiting to be shipped",
                                            shipper.pending),
        "telemetry_connected": Family("1 while pushes to wrk-monitor are acknowledged",
                                      float(shipper.connected)),
    })


async def start_telemetry(daemon: TelemetryHost, swarm: object, telemetry: TelemetrySettings,
                          *, service: str) -> LogShipper | None:
    """Ship the daemon's log records to wrk-monitor, if ``telemetry.monitor`` is set.

    Args:
        daemon: its nursery (the shipper's task runs there until the daemon
            stops; the handler and the metrics are removed then) and metrics
            endpoint (None: no metrics).
        swarm: the daemon's running swarm.
        telemetry: the daemon's ``telemetry`` settings.
        service: the records' ``service`` (``wrk-ork``, ``wrk-server-k8s-nvidia`` …).

    Returns:
        The shipper (``offer`` more records to it, e.g. the agents'), or None
        when telemetry is off.
    """
    if telemetry.monitor is None:
        return None
    shipper = LogShipper(max_records=telemetry.max_records)
    handler = ShipperHandler(shipper, service=service,
                             level=getattr(logging, telemetry.level.upper()))
    await daemon.nursery.start(_ship, swarm, shipper, handler, telemetry.monitor,
                               telemetry.monitor_addresses, daemon.metrics)
    log.info("telemetry.started monitor=%s addresses=%d service=%s level=%s max_records=%d",
             format_key(telemetry.monitor)[:12], len(telemetry.monitor_addresses), service,
             telemetry.level, telemetry.max_records)
    return shipper


async def _ship(swarm: object, shipper: LogShipper, handler: logging.Handler, monitor: bytes,
                addresses: Sequence, metrics: ProcessMetrics | None, *,
                task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Attach ``handler`` and the metrics, ship until cancelled, detach both
    (a record logged after is not shipped)."""
    registry = snapshot_registry(lambda: shipper_snapshot(shipper))
    if metrics is not None:
        metrics.add(registry)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(functools.partial(shipper.run, swarm, monitor,
                                                  addresses=addresses))
            nursery.start_soon(_watch_drops, shipper, format_key(monitor)[:12])
            task_status.started()
    finally:
        root.removeHandler(handler)
        if metrics is not None:
            metrics.remove(registry)


async def _watch_drops(shipper: LogShipper, monitor: str) -> None:
    """Warn once when records start being dropped; say once when that episode ended
    (no new drop since the last look and the queue below half its bound)."""
    seen = shipper.dropped  # drops counted before (none: a new shipper)
    dropping, since = False, seen
    while True:
        await trio.sleep(DROP_CHECK_INTERVAL_S)
        dropped = shipper.dropped
        if not dropping:
            if dropped > seen:
                dropping, since = True, seen
                log.warning("telemetry.dropping monitor=%s dropped=%d pending=%d "
                            "reason=wrk-monitor is slow or unreachable; the oldest records "
                            "beyond %d are dropped", monitor, dropped - since, shipper.pending,
                            shipper.max_records)
        elif dropped == seen and shipper.pending < shipper.max_records // 2:
            dropping = False
            log.info("telemetry.caught_up monitor=%s dropped=%d pending=%d", monitor,
                     dropped - since, shipper.pending)
        seen = dropped
