"""wrk-monitor's settings: ``COSMICAC_MONITOR__<KEY>`` in the environment, or a config file.

Ports: the swarm on 49743 and the HTTP side on 49752 (after app-node's 49742
and 49751; 49737 relay … 49741 proxy, 49750 proxy HTTP, 5173 entry).
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from contracts.monitor import MAX_TENANT_CHARS, TENANT_PATTERN, check_base_url
from nodes.kit.forwarded import ProxyList
from nodes.kit.settings import HttpSettings, PeerSettings
from p2p.daemon import DaemonError, Port, PublicKeyList

from ._buffer import DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, DEFAULT_QUEUE_RECORDS

__all__ = ["MONITOR_HTTP_PORT", "MONITOR_PORT", "BufferSettings", "HealthSettings",
           "HttpTokenError", "LokiSettings", "MonitorHttpSettings", "MonitorSettings"]

#: Default port of wrk-monitor's swarm (TCP and UDP).
MONITOR_PORT = 49743
#: Default port of its HTTP side (``/metrics``, ``/jobs/{id}/logs``).
MONITOR_HTTP_PORT = 49752


class HttpTokenError(DaemonError):
    """``http.token_file`` cannot be read, or holds no usable token (one line, exit 1)."""


#: What a bearer token may hold: visible ASCII (it travels in a header).
TOKEN_PATTERN = r"^[\x21-\x7e]+$"
MIN_TOKEN_CHARS = 16


class MonitorHttpSettings(HttpSettings):
    """Where the HTTP side listens (the kit's ``host``, ``port``) and who may read there.

    Every route (``/metrics`` included: its labels name every team's jobs)
    wants ``Authorization: Bearer <token>``, the token being ``token`` or the
    content of ``token_file``. With neither set, every route answers 403
    ``HTTP_TOKEN_NOT_SET``: the HTTP side is closed, not open.
    """

    port: Port = MONITOR_HTTP_PORT
    #: The bearer token (at least 16 visible ASCII characters).
    token: str | None = Field(default=None, min_length=MIN_TOKEN_CHARS, max_length=4096,
                              pattern=TOKEN_PATTERN)
    #: A file holding the token (``cosmicac up``/``bootstrap`` write
    #: ``<storage>/http-token``, 0600); read at start. Not with ``token``.
    token_file: Path | None = None
    #: Addresses (or networks) of the reverse proxies in front (the entry point,
    #: Caddy): from their connections the client is the ``X-Forwarded-For``
    #: address they set; from anyone else it is the TCP peer.
    trusted_proxies: ProxyList = ()
    #: Follow streams over HTTP at once, and per client (its address): one
    #: client cannot take them all.
    max_followers: int = Field(default=256, ge=1, le=100_000)
    max_followers_per_client: int = Field(default=16, ge=1, le=100_000)

    @model_validator(mode="after")
    def _one_token(self) -> MonitorHttpSettings:
        if self.token is not None and self.token_file is not None:
            raise ValueError("set http.token or http.token_file, not both")
        return self

    def resolved_token(self) -> str | None:
        """``token``, or the content of ``token_file`` (surrounding blanks stripped).

        Raises:
            HttpTokenError: the file cannot be read or holds no usable token.
        """
        if self.token_file is None:
            return self.token
        try:
            text = self.token_file.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise HttpTokenError(f"cannot read http.token_file {self.token_file}: "
                                 f"{reason}") from None
        if len(text) < MIN_TOKEN_CHARS or len(text) > 4096 or not re.match(TOKEN_PATTERN, text):
            raise HttpTokenError(f"http.token_file {self.token_file} must hold one token of "
                                 f"{MIN_TOKEN_CHARS}-4096 visible ASCII characters")
        return text


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


class MonitorSettings(PeerSettings):
    """Everything wrk-monitor reads at start.

    Its peer (``storage``: its identity, ``observability.json``; ``host``,
    ``port``, ``bootstrap``, ``relays``, ``announce_addresses``) is the kit's
    :class:`~nodes.kit.settings.PeerSettings`.
    """

    model_config = SettingsConfigDict(env_prefix="COSMICAC_MONITOR__")

    port: Port = MONITOR_PORT
    # Who may call what (service.py, METHOD_ROLES); each empty list admits nobody.
    #: Keys allowed to push log records, ``logs.push`` (the platform's daemons).
    pushers: PublicKeyList = ()
    #: Anyone may push log records (never metrics): agents' keys are not known
    #: in advance. Off by default.
    allow_any_pusher: bool = False
    #: Keys allowed to push the proxies' metrics, ``metrics.push`` (proxy-inference's).
    proxies: PublicKeyList = ()
    #: Keys allowed to push the agents' metrics, ``metrics.agents`` (the workers').
    workers: PublicKeyList = ()
    #: Keys allowed to read logs, health and status and to set the Loki and
    #: Prometheus in force (app-node's).
    followers: PublicKeyList = ()
    buffer: BufferSettings = BufferSettings()
    http: MonitorHttpSettings = MonitorHttpSettings()
    loki: LokiSettings = LokiSettings()
    health: HealthSettings = HealthSettings()
