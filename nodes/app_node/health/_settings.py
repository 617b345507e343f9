"""app-node's ``health`` settings (``COSMICAC_APP_NODE__HEALTH__<KEY>``) and the store they pick."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from ._model import (
    DEFAULT_INTERVAL_S,
    DEFAULT_TIMEOUT_S,
    PROXY_FORGET_S,
    PROXY_FRESH_S,
    RETENTION_S,
)
from ._store import HealthStore, SqliteHealthStore

__all__ = ["HEALTH_FILE", "HealthSettings", "open_health_store"]

#: The SQLite history under app-node's storage (when no Redis is configured).
HEALTH_FILE = "health.sqlite"


class HealthSettings(BaseModel):
    """The control plane's health history."""

    model_config = {"extra": "forbid"}

    #: False: no prober, and ``/api/health`` answers 503 ``HEALTH_UNAVAILABLE``.
    enabled: bool = True
    #: Seconds between two rounds of probes.
    interval_s: float = Field(default=DEFAULT_INTERVAL_S, ge=1.0, le=3600.0)
    #: A probe's bound (connection plus answer); at most ``interval_s``.
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0.0)
    #: Rows older than this are pruned (at most 7 days).
    retention_s: float = Field(default=RETENTION_S, ge=60.0, le=7 * 24 * 3600.0)
    #: Keys of the Redis history (with ``redis_url``), so platforms can share a Redis.
    redis_prefix: str = "cac:health:"
    #: A proxy (a ``proxy-inference <key>`` row, from wrk-monitor's metrics
    #: senders) is up while its last report is at most this old: three of its
    #: reports (one every 5 s).
    proxy_fresh_s: float = Field(default=PROXY_FRESH_S, gt=0.0, le=3600.0)
    #: A proxy silent for longer gets no more rows (its old ones stay history
    #: until ``retention_s``); at least ``proxy_fresh_s``.
    proxy_forget_s: float = Field(default=PROXY_FORGET_S, ge=60.0, le=7 * 24 * 3600.0)

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> HealthSettings:
        if self.timeout_s > self.interval_s:
            raise ValueError(f"health.timeout_s ({self.timeout_s:g}) must be at most "
                             f"health.interval_s ({self.interval_s:g})")
        if self.proxy_forget_s < self.proxy_fresh_s:
            raise ValueError(f"health.proxy_forget_s ({self.proxy_forget_s:g}) must be at "
                             f"least health.proxy_fresh_s ({self.proxy_fresh_s:g})")
        return self


def open_health_store(settings: HealthSettings, storage: Path,
                      redis_url: str | None) -> HealthStore:
    """Redis at ``redis_url`` (the rate limiter's) when set, else ``<storage>/health.sqlite``.

    Blocking (opens a file): call it in a thread.

    Raises:
        HealthStoreError: the SQLite file cannot be opened.
    """
    if redis_url:
        from ._redis import RedisHealthStore

        return RedisHealthStore(redis_url, key_prefix=settings.redis_prefix)
    return SqliteHealthStore.open(storage / HEALTH_FILE)
