"""app-node's settings: ``COSMICAC_APP_NODE__<KEY>`` in the environment, or a config file.

``REDIS_URL`` (the platform's name for it) is read through the daemon kit's
``legacy_env``; the prefixed ``COSMICAC_APP_NODE__REDIS_URL`` wins over it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import SettingsConfigDict

from contracts.monitor import Observability
from nodes.kit.settings import HttpSettings, PeerRef, PeerSettings, peer_ref
from nodes.kit.telemetry import ShipperSettings, TelemetrySettings
from p2p.daemon import AddressList, DaemonSettings, Port, PublicKey, PublicKeyList

from .api._body import BodyLimits
from .auth import DEFAULT_PARAMS, ScryptParams
from .email import EmailSettings
from .health import HealthSettings
from .ratelimit import Limits
from .team_rules import TeamsSettings

__all__ = ["APP_NODE_HTTP_PORT", "APP_NODE_PORT", "ApiHttpSettings", "AppNodeSettings",
           "AppTelemetrySettings", "ObservabilitySettings", "PasswordHashSettings"]

#: Default port of app-node's swarm (TCP and UDP); 49737 relay, 49739 worker,
#: 49740 wrk-ork, 49741 proxy-inference.
APP_NODE_PORT = 49742
#: Default port of the HTTP API (the entry point's ``api_url``).
APP_NODE_HTTP_PORT = 49751


class ApiHttpSettings(HttpSettings):
    """Where the HTTP API listens (the kit's ``host``, ``port``; behind the entry
    point on :5173), and its request bodies' limits."""

    port: Port = APP_NODE_HTTP_PORT
    #: Request bodies: ``max_body_bytes`` (1 MiB), ``max_bodies_in_flight`` (64),
    #: ``body_timeout_s`` (30), ``max_json_depth`` (64) (``COSMICAC_APP_NODE__HTTP__BODY__…``).
    body: BodyLimits = BodyLimits()


class AppTelemetrySettings(ShipperSettings):
    """app-node's ``telemetry``: it ships to the wrk-monitor it reads logs from.

    There is no second monitor key: ``monitor``/``monitor_addresses`` (above)
    name wrk-monitor for both, so the two cannot disagree. wrk-monitor must
    list app-node's key among its pushers as well as its followers.
    """

    #: False: read logs from wrk-monitor but ship none of app-node's own.
    ship: bool = True


class ObservabilitySettings(Observability):
    """The operator's Loki and Prometheus, which app-node sends to wrk-monitor
    (seeds/architecture.txt: "cosmicac-app-node sends cosmicac-wrk-monitor the
    URLs of your Loki and Prometheus") each time it connects to it.

    ``COSMICAC_APP_NODE__OBSERVABILITY__LOKI_URL``, ``…__LOKI_TENANT``,
    ``…__PROMETHEUS_URL``. A URL may hold ``user:password@`` (sent to Loki as
    basic auth; never logged). Some set: wrk-monitor uses them
    (``observability.set``), over its own ``loki`` settings. All unset:
    app-node clears what it sent before (``observability.clear``), and
    wrk-monitor goes back to its own ``loki`` settings, else no Loki. To stop
    wrk-monitor pushing to a Loki app-node gave it, remove
    ``observability.loki_url`` (or the whole ``observability`` section) and
    restart app-node; to keep a Prometheus but drop Loki, leave only
    ``prometheus_url`` (a ``set`` without Loki: no Loki at all, whatever
    wrk-monitor's settings say). A wrk-monitor older than ``observability.clear``
    keeps the old value: delete its ``<storage>/observability.json``.
    """

    model_config = {"extra": "forbid", "frozen": True}

    def to_send(self) -> Observability:
        """What to send to wrk-monitor on each connection: empty (all None) when
        nothing is configured, which makes app-node's client clear it."""
        return Observability(loki_url=self.loki_url, loki_tenant=self.loki_tenant,
                             prometheus_url=self.prometheus_url)

    @property
    def configured(self) -> bool:
        """Some URL is set (app-node then replaces wrk-monitor's own settings)."""
        return self.to_send() != Observability()


class PasswordHashSettings(BaseModel):
    """scrypt's cost for the password hashes app-node stores (``password_hash.ln``...).

    The default is OWASP's floor (N = 2^17, r = 8, p = 1: 128 MiB and 0.1 to 0.5 s
    of CPU a login). Raise ``ln`` where logins can afford more; a stored hash keeps
    its own parameters and is replaced by one at the new cost at its owner's next
    login. Below the floor is for tests only (app-node warns at start).
    """

    model_config = {"extra": "forbid", "frozen": True}

    ln: int = Field(default=DEFAULT_PARAMS.ln, ge=1, le=22)
    r: int = Field(default=DEFAULT_PARAMS.r, ge=1, le=64)
    p: int = Field(default=DEFAULT_PARAMS.p, ge=1, le=16)

    def params(self) -> ScryptParams:
        return ScryptParams(ln=self.ln, r=self.r, p=self.p)

    @property
    def below_floor(self) -> bool:
        return self.params().memory_bytes < DEFAULT_PARAMS.memory_bytes


class AppNodeSettings(PeerSettings):
    """Everything app-node reads at start.

    Its peer (``storage``: identity, ``app-node.sqlite``, the shared database,
    which it creates and administers, the email outbox; ``host``, ``port``,
    ``bootstrap``, ``relays``, ``announce_addresses``) is the kit's
    :class:`~nodes.kit.settings.PeerSettings`.
    """

    model_config = SettingsConfigDict(env_prefix="COSMICAC_APP_NODE__")
    legacy_env = {**DaemonSettings.legacy_env, "REDIS_URL": "redis_url"}

    port: Port = APP_NODE_PORT
    #: The DHT bootstrap advertised to users' CLIs (``GET /api/swarm``, for
    #: ``cosmicac shell``) when app-node itself reaches the DHT on an address
    #: users cannot (an internal network); None: advertise ``bootstrap``.
    cli_bootstrap: AddressList | None = None
    #: wrk-ork (its public key) and where it listens, tried before the DHT;
    #: without it the job, rack and node routes answer 503.
    ork: PublicKey | None = None
    ork_addresses: AddressList = ()
    #: wrk-monitor (its public key) and where it listens, tried before the DHT;
    #: without it ``GET /api/jobs/{job}/logs`` answers 503 ``MONITOR_UNAVAILABLE``.
    #: wrk-monitor must list app-node's key among its followers. app-node also
    #: ships its own log records there (``telemetry``; its key among the pushers).
    monitor: PublicKey | None = None
    monitor_addresses: AddressList = ()
    #: How app-node's records are shipped to ``monitor``
    #: (``COSMICAC_APP_NODE__TELEMETRY__SHIP=false``: not at all).
    telemetry: AppTelemetrySettings = AppTelemetrySettings()
    #: Loki and Prometheus, sent to ``monitor`` on each connection (ignored without it);
    #: all unset: app-node clears what it sent before (see ObservabilitySettings).
    observability: ObservabilitySettings = ObservabilitySettings()
    #: Writers admitted to the shared database at start (proxy-inference's key;
    #: ``cosmicac autobase-connect`` admits more later).
    database_writers: PublicKeyList = ()
    #: Read-only replicas of the shared database app-node serves (e.g. a
    #: backup's ``cosmicac db serve``). Only they, the writers and the keys
    #: above may read it: the logs hold every team's keys and usage.
    database_readers: PublicKeyList = ()
    http: ApiHttpSettings = ApiHttpSettings()
    #: Shared rate limits when set (``REDIS_URL``); in-process limits otherwise.
    redis_url: str | None = None
    limits: Limits = Limits()
    email: EmailSettings = EmailSettings()
    #: The control plane's health history (``/api/health``, ``cosmicac status``):
    #: ``health.interval_s`` (15), ``timeout_s`` (5), ``retention_s`` (86400),
    #: ``proxy_fresh_s`` (15), ``proxy_forget_s`` (3600), kept in Redis at
    #: ``redis_url`` when set, else ``<storage>/health.sqlite``.
    health: HealthSettings = HealthSettings()
    #: Who may create teams and the GPU quotas a new team gets:
    #: ``teams.creators`` (``operators``, the default, or ``everyone``),
    #: ``teams.default_gpus`` and ``teams.default_per_user_gpus`` (unset: unlimited).
    teams: TeamsSettings = TeamsSettings()
    #: The URL users reach (the entry point), for links in emails.
    public_url: str = "http://127.0.0.1:5173"
    #: The image a job gets when it names none (docker://host[:port]/repo[:tag]):
    #: your cluster's base image. None: every job must name its image.
    default_image: str | None = None

    @field_validator("default_image")
    @classmethod
    def _registry_image(cls, image: str | None) -> str | None:
        from contracts.model import IMAGE_PATTERN

        if image is not None and not IMAGE_PATTERN.match(image):
            raise ValueError(f"{image!r} is not a registry image "
                             "(docker://host[:port]/repo[:tag])")
        return image
    #: scrypt's cost for new password hashes (see PasswordHashSettings).
    password_hash: PasswordHashSettings = PasswordHashSettings()
    #: fsync the store and the database on every write (False: tests only).
    fsync: bool = True

    @property
    def ork_peer(self) -> PeerRef | None:
        """wrk-ork (``ork`` and ``ork_addresses``); None without one."""
        return peer_ref(self, "ork")

    @property
    def monitor_peer(self) -> PeerRef | None:
        """wrk-monitor (``monitor`` and ``monitor_addresses``); None without one."""
        return peer_ref(self, "monitor")

    def telemetry_settings(self) -> TelemetrySettings:
        """The shipper's settings: ``monitor`` unless ``telemetry.ship`` is off."""
        shipping = self.telemetry
        return TelemetrySettings(
            monitor=self.monitor if shipping.ship else None,
            monitor_addresses=self.monitor_addresses, max_records=shipping.max_records,
            level=shipping.level)
