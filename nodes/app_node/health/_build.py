"""The prober app-node's daemon runs: its store and targets from the settings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._prober import (
    HealthProber,
    Target,
    app_node_target,
    database_target,
    email_target,
    peer_target,
    proxies_source,
    workers_source,
)
from ._settings import HealthSettings, open_health_store
from ._store import HealthStoreError

if TYPE_CHECKING:
    from crdt import DatabaseService
    from nodes.kit.peer_client import PeerClient

__all__ = ["build_prober"]

log = logging.getLogger(__name__)


def build_prober(settings: HealthSettings, storage: Path, redis_url: str | None, *,
                 ork: PeerClient | None, monitor: PeerClient | None,
                 database: DatabaseService, email: object, limiter: Any = None
                 ) -> HealthProber | None:
    """The prober of wrk-ork and wrk-monitor (when configured), each worker (as
    wrk-ork hears it), each proxy (as wrk-monitor hears it), the database
    replica, app-node itself and its email; None
    when disabled or its store cannot be opened (logged: app-node serves on,
    ``/api/health`` answers 503). Blocking: call it in
    a thread (it opens the SQLite file)."""
    if not settings.enabled:
        return None
    try:
        store = open_health_store(settings, storage, redis_url)
    except HealthStoreError as exc:
        log.error("health.disabled reason=%s", exc)
        return None
    backend = "redis" if redis_url else "sqlite"

    def details() -> dict:
        out: dict = {"ork": ork is not None, "monitor": monitor is not None,
                     "health_store": backend}
        available = getattr(limiter, "redis_available", None)
        out["rate_limits"] = "embedded" if available is None else \
            "redis" if available else "redis-fallback"
        return out

    targets: list[Target] = [peer_target(c) for c in (ork, monitor) if c is not None]
    targets += [database_target(database.db, database.replicator), app_node_target(details),
                email_target(email)]
    sources = [workers_source(ork)] if ork is not None else []
    if monitor is not None:
        sources.append(proxies_source(monitor, fresh_s=settings.proxy_fresh_s,
                                      forget_s=settings.proxy_forget_s))
    return HealthProber(store, targets, sources=sources, interval_s=settings.interval_s,
                        timeout_s=settings.timeout_s, retention_s=settings.retention_s)
