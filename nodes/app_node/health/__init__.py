"""app-node's control-plane health history: every service's health on an
interval, kept in SQLite or Redis, read by ``GET /api/health`` and ``cosmicac status``.

A sans-IO core (:mod:`._model`: rows, states, uptime over a window), one store
interface with two backends (:mod:`._store` SQLite, :mod:`._redis` Redis) and
the trio prober (:mod:`._prober`). See README.md.
"""

from ._build import build_prober
from ._model import (
    DEFAULT_INTERVAL_S,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WINDOW_S,
    MAX_ROWS,
    PROXY_FORGET_S,
    PROXY_FRESH_S,
    RETENTION_S,
    HealthRow,
    Overall,
    ServiceState,
    WindowSummary,
    answered,
    clamp_window,
    newest_by_service,
    not_answered,
    ordered_services,
    overall,
    service_state,
    summarise,
)
from ._prober import (
    MAX_PROXY_ROWS,
    MAX_WORKER_ROWS,
    HealthProber,
    ProberStatistics,
    RowSource,
    Target,
    app_node_target,
    database_status,
    database_target,
    email_target,
    listed_source,
    peer_target,
    probe,
    proxies_source,
    proxy_row,
    worker_row,
    workers_source,
)
from ._redis import RedisHealthStore
from ._settings import HEALTH_FILE, HealthSettings, open_health_store
from ._store import HealthStore, HealthStoreError, SqliteHealthStore

__all__ = [
    "DEFAULT_INTERVAL_S",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_WINDOW_S",
    "HEALTH_FILE",
    "MAX_PROXY_ROWS",
    "MAX_ROWS",
    "MAX_WORKER_ROWS",
    "PROXY_FORGET_S",
    "PROXY_FRESH_S",
    "RETENTION_S",
    "HealthProber",
    "HealthRow",
    "HealthSettings",
    "HealthStore",
    "HealthStoreError",
    "Overall",
    "ProberStatistics",
    "RedisHealthStore",
    "RowSource",
    "ServiceState",
    "SqliteHealthStore",
    "Target",
    "WindowSummary",
    "answered",
    "app_node_target",
    "build_prober",
    "clamp_window",
    "database_status",
    "database_target",
    "email_target",
    "listed_source",
    "newest_by_service",
    "not_answered",
    "open_health_store",
    "ordered_services",
    "overall",
    "peer_target",
    "probe",
    "proxies_source",
    "proxy_row",
    "service_state",
    "summarise",
    "worker_row",
    "workers_source",
]
