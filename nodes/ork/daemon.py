"""``wrk-ork`` as a daemon: one peer hosting the job RPC service and the racks' queues.

One swarm, one identity (``<storage>/identity``), two services:

- ``cosmicac-ork/1``: jobs, replicas, racks, nodes and ``jobs.watch``, each
  method open to the roles :data:`~.service.ACCESS` names: app-node
  (``app_nodes``) every method, proxy-inference (``proxies``) reading and
  following jobs; nobody else (an empty allow-list refuses every call);
- ``cosmicac-mq/1``: one durable queue per registered rack (operations out,
  reports in); a worker dials wrk-ork and the queue replicates over that
  connection.

With ``telemetry.monitor`` set, its log records (every job's System steps:
created, queued, pending and why, placed, restart, delete, Unknown, Failed and
why) are shipped to wrk-monitor (:mod:`nodes.kit.telemetry`).

Files under ``--storage``: ``identity``, ``ork.sqlite`` (jobs, racks,
reservations, the outbox, applied report positions), ``queues/<rack-key>/``.
"""

from __future__ import annotations

import logging
import time

import trio

from nodes.kit.metrics import snapshot_registry
from nodes.kit.peer import start_peer
from nodes.kit.ready import print_ready
from nodes.kit.telemetry import start_telemetry
from p2p.daemon import Daemon, DaemonError
from p2p.host import Reserved
from p2p.keys import load_or_create_keypair
from p2p.queue import QueueService

from .access import OrkAccess
from .driver import OrkDriver
from .errors import OrkError
from .orchestrator import Orchestrator
from .service import OrkService
from .settings import OrkSettings

__all__ = ["reserved_peers", "start_ork"]

log = logging.getLogger(__name__)


def reserved_peers(access: OrkAccess) -> Reserved:
    """The keys that keep connection slots under a flood of strangers: every
    key with a role (app-node, the proxies, the deprecated clients) and every
    registered rack's worker, those registered at run time too."""
    return lambda key: bool(access.roles_of(key))


async def start_ork(daemon: Daemon[OrkSettings]) -> None:
    """Start wrk-ork's parts in ``daemon.nursery``; return once serving."""
    settings = daemon.settings
    storage = daemon.storage
    assert storage is not None
    keypair = load_or_create_keypair(storage)
    try:
        orchestrator = await trio.to_thread.run_sync(
            lambda: Orchestrator.open(storage / "ork.sqlite",
                                      unknown_after_s=settings.unknown_after_s))
    except OrkError as exc:
        raise DaemonError(f"cannot open {storage / 'ork.sqlite'}: {exc}") from None
    known = {info.key for info in orchestrator.racks()}
    for rack in settings.racks:
        if rack.key.hex() not in known:
            try:
                orchestrator.register_rack(rack.key.hex(), rack.location, time.time(),
                                           name=rack.name)
            except OrkError as exc:
                raise DaemonError(f"cannot register rack {rack.key.hex()[:16]}…: {exc}") \
                    from None
    queues = QueueService()
    driver = OrkDriver(orchestrator, queues, keypair, storage, fsync=settings.fsync,
                       tick_interval_s=settings.tick_interval_s)
    access = OrkAccess.from_settings(app_nodes=settings.app_nodes, proxies=settings.proxies,
                                     clients=settings.clients,
                                     is_rack=lambda key: queues.queue(key) is not None)
    if settings.clients:
        log.warning("ork.clients_deprecated keys=%d: 'clients' gives every key in it the "
                    "app-node role (every method); list app-node's key in app_nodes and "
                    "proxy-inference's in proxies instead (cosmicac bootstrap "
                    "--rewrite-configs writes them)", len(settings.clients))
    if access.empty:
        log.warning("ork.no_callers: app_nodes and proxies are empty, so every call to "
                    "cosmicac-ork/1 is refused (FORBIDDEN); set app_nodes to app-node's key")
    service = OrkService(orchestrator, roles=access.roles_of,
                         on_change=driver.changed, limiter=driver.limiter)
    driver.set_pump(service.pump)
    # Its callers and its racks keep their room under a flood of strangers.
    swarm, address = await start_peer(daemon, keypair, settings, [queues, service],
                                      reserved=reserved_peers(access))
    daemon.metrics.add(snapshot_registry(lambda: driver.snapshot),
                       snapshot_registry(service.metrics))
    # Before the driver: the System steps of jobs it resumes are shipped too.
    await start_telemetry(daemon, swarm, settings.telemetry, service="wrk-ork")
    await daemon.nursery.start(driver.run)
    print_ready("wrk-ork", key=keypair.hex, addresses={"swarm": address},
                note=f"{len(orchestrator.racks())} racks")
