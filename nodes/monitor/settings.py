"""wrk-monitor's settings: ``COSMICAC_MONITOR__<KEY>`` in the environment, or a config file.

Ports: the swarm on 49743 and the HTTP side on 49752 (after app-node's 49742
and 49751; 49737 relay … 49741 proxy, 49750 proxy HTTP, 5173 entry).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from contracts.telemetry import MAX_TENANT_CHARS, TENANT_PATTERN, check_base_url
from p2p.daemon import AddressList, DaemonSettings, Port, PublicKeyList

from ._buffer import DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, DEFAULT_QUEUE_RECORDS

__all__ = ["MONITOR_HTTP_PORT", "MONITOR_PORT", "BufferSettings", "HealthSettings",
           "HttpSettings", "LokiSettings", "MonitorSettings"]

#: Default port of wrk-monitor's swarm (TCP and UDP).
MONITOR_PORT = 49743
#: Default port of its HTTP side (``/metrics``, ``/jobs/{id}/logs``).
MONITOR_HTTP_PORT = 49752


class HttpSettings(BaseModel):
    """Where the HTTP side listens and who may read logs there."""

    model_config = {"extra": "forbid"}

    host: str = "127.0.0.1"
    #: 0: any free port (tests).
    port: Port = MONITOR_HTTP_PORT
    #: When set, the logs routes want ``Authorization: Bearer <token>`` (401
    #: otherwise). ``/metrics`` stays open: keep ``host`` private.
    token: str | None = Field(default=None, min_length=16)


class BufferSettings(BaseModel):
    """The in-memory ring of recent records (nodes/monitor/_buffer.py)."""

    model_config = {"extra": "forbid"}

    max_records: int = Field(default=DEFAULT_MAX_RECORDS, ge=1, le=10_000_000)
    max_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1, le=16 << 30)
    #: Live records queued per follower before it is cut off (``LAGGED``).
    queue_records: int = Field(default=DEFAULT_QUEUE_RECORDS, ge=1, le=10_000_000)


class LokiSettings(BaseModel):
    """The operator's Loki: every accepted record is pushed there, history read back.

    ``url`` and ``tenant`` are the start value only: what app-node sends
    (``observability.set``, kept in ``<storage>/observability.json``) replaces
    them. The bounds below apply to every Loki in force.
    """

    model_config = {"extra": "forbid"}

    #: Loki's base URL (``http://loki:3100``); None: no Loki (the ring only)
    #: until app-node sends one.
    url: str | None = None
    #: ``X-Scope-OrgID`` for a multi-tenant Loki.
    tenant: str | None = Field(default=None, min_length=1, max_length=MAX_TENANT_CHARS,
                               pattern=TENANT_PATTERN)
    #: Records waiting for Loki; beyond it the oldest are dropped (counted).
    max_buffered: int = Field(default=100_000, ge=1, le=10_000_000)
    flush_interval_s: float = Field(default=0.5, ge=0, le=60)
    #: How long a replaced Loki's pusher may finish its batch (or flush, when
    #: Loki is cleared) before it is cut (nodes/monitor/observability.py).
    grace_s: float = Field(default=5.0, ge=0, le=300)

    @field_validator("url")
    @classmethod
    def _base_url(cls, url: str | None) -> str | None:
        return None if url is None else check_base_url(url)


class HealthSettings(BaseModel):
    """When a job's model health is Degraded or Unhealthy (nodes/monitor/health.py).

    Judged on the proxies' sliding window (60 s): the error rate (5xx answers,
    broken streams, no replica; a client's 4xx is not an error) and the p95 of
    request start to the model server's first byte. Defaults: 5% errors is
    where an SLO of 95% success is burnt (Degraded), 25% means one request in
    four fails (Unhealthy); a first byte past 5 s is slow even for a CPU
    model's prefill (Degraded), past 20 s most clients have given up
    (Unhealthy). Under ``min_requests`` in the window a job is Healthy: too
    few requests to judge. ``COSMICAC_MONITOR__HEALTH__<KEY>``.
    """

    model_config = {"extra": "forbid"}

    degraded_error_rate: float = Field(default=0.05, gt=0, le=1)
    unhealthy_error_rate: float = Field(default=0.25, gt=0, le=1)
    degraded_p95_ms: float = Field(default=5_000.0, gt=0)
    unhealthy_p95_ms: float = Field(default=20_000.0, gt=0)
    min_requests: int = Field(default=5, ge=1)
    #: A proxy silent this long no longer counts (it reports every 5 s).
    stale_after_s: float = Field(default=30.0, gt=0, le=3600)
    #: Proxies whose latest report is kept at once.
    max_senders: int = Field(default=64, ge=1, le=10_000)

    @model_validator(mode="after")
    def _ordered(self) -> HealthSettings:
        if self.degraded_error_rate > self.unhealthy_error_rate:
            raise ValueError("degraded_error_rate must not exceed unhealthy_error_rate")
        if self.degraded_p95_ms > self.unhealthy_p95_ms:
            raise ValueError("degraded_p95_ms must not exceed unhealthy_p95_ms")
        return self


class MonitorSettings(DaemonSettings):
    """Everything wrk-monitor reads at start."""

    model_config = SettingsConfigDict(env_prefix="COSMICAC_MONITOR__")

    #: wrk-monitor's folder: its identity.
    storage: Path
    #: Address and port of its swarm (TCP and UDP).
    host: str = "0.0.0.0"
    port: Port = MONITOR_PORT
    #: Addresses to announce instead of the listener's.
    announce_addresses: AddressList | None = None
    #: DHT bootstrap nodes (``host:port``).
    bootstrap: AddressList = ()
    #: Blind relays to stay reachable through.
    relays: PublicKeyList = ()
    #: Keys allowed to push records (the platform's daemons).
    pushers: PublicKeyList = ()
    #: Anyone may push (config ``telemetry.open``): agents' keys are not known
    #: in advance. Off by default.
    allow_any_pusher: bool = False
    #: Keys allowed to follow over RPC (app-node's).
    followers: PublicKeyList = ()
    buffer: BufferSettings = BufferSettings()
    http: HttpSettings = HttpSettings()
    loki: LokiSettings = LokiSettings()
    health: HealthSettings = HealthSettings()
