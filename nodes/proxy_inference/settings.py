"""proxy-inference's settings: ``COSMICAC_PROXY__<KEY>`` in the environment, or a config file.

The shared database's bootstrap key also comes as ``PROXY_AUTOBASE_KEY``, the
name the platform gives it (seeds/architecture.txt, "task wire"), through the
daemon kit's ``legacy_env`` as ``cosmicac db serve`` reads it; the prefixed
``COSMICAC_PROXY__DATABASE`` wins over it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from pydantic_settings import SettingsConfigDict

from contracts.inference import MAX_BODY
from nodes.kit.settings import HttpSettings, PeerRef, PeerSettings, peer_ref
from nodes.kit.telemetry import TelemetrySettings
from p2p.bodies import BodyBudget
from p2p.daemon import AddressList, DaemonSettings, Port, PublicKey

__all__ = ["HTTP_PORT", "PROXY_PORT", "ProxyHttpSettings", "ProxySettings", "UsageSettings"]

#: Default port of the proxy's swarm (TCP and UDP); 49737 relay, 49739
#: worker, 49740 wrk-ork.
PROXY_PORT = 49741
#: Default port of the OpenAI-compatible HTTP front.
HTTP_PORT = 49750


class ProxyHttpSettings(HttpSettings):
    """Where the OpenAI-compatible API listens (the kit's ``host``, ``port``), and its
    request bodies' bounds."""

    port: Port = HTTP_PORT
    #: Bytes of request bodies held at once (read, or being read, for requests
    #: not yet answered), all keys together; beyond it a 503 ``server_busy``.
    bodies_held_bytes: int = Field(default=512 << 20, ge=MAX_BODY, le=1 << 40)
    #: Request bodies being received at once; beyond it a 503 ``server_busy``.
    bodies_reading: int = Field(default=256, ge=1, le=1_000_000)
    #: The same for one API key (429 ``too_many_bodies`` beyond): no key takes
    #: the room of all the others.
    key_bodies_held_bytes: int = Field(default=128 << 20, ge=MAX_BODY, le=1 << 40)
    key_bodies_reading: int = Field(default=64, ge=1, le=1_000_000)
    #: A request body must arrive whole within this long (408 ``body_timeout``).
    body_timeout_s: float = Field(default=60.0, gt=0, le=3600)

    def body_budget(self) -> BodyBudget:
        """A fresh :class:`~p2p.bodies.BodyBudget` with these bounds."""
        return BodyBudget(max_bytes=self.bodies_held_bytes, max_reads=self.bodies_reading,
                          owner_bytes=self.key_bodies_held_bytes,
                          owner_reads=self.key_bodies_reading)


class UsageSettings(BaseModel):
    """How usage is batched into the shared database."""

    model_config = {"extra": "forbid"}

    #: Usage counted in memory is appended at least this often.
    flush_interval_s: float = Field(default=0.2, gt=0, le=3600)
    #: ... or as soon as this many operations are waiting (one entry each
    #: ``ops_per_entry``; all of one flush in one durable write).
    flush_ops: int = Field(default=256, ge=1, le=100_000)
    ops_per_entry: int = Field(default=256, ge=1, le=1024)
    #: (key, model, day) buckets kept while not admitted as a writer; usage
    #: of a new bucket beyond it is dropped, counted and logged.
    max_buckets: int = Field(default=100_000, ge=1, le=10_000_000)


class ProxySettings(PeerSettings):
    """Everything proxy-inference reads at start.

    Its peer (``storage``: identity, its replica of the shared database, usage
    not yet written, ``usage-pending.json``; ``host``, ``port``, ``bootstrap``,
    ``relays``, ``announce_addresses``) is the kit's
    :class:`~nodes.kit.settings.PeerSettings`.
    """

    model_config = SettingsConfigDict(env_prefix="COSMICAC_PROXY__")

    legacy_env = {**DaemonSettings.legacy_env, "PROXY_AUTOBASE_KEY": "database"}

    port: Port = PROXY_PORT
    #: The shared database's bootstrap key (``PROXY_AUTOBASE_KEY``); None:
    #: the one already in ``storage``.
    database: PublicKey | None = None
    #: The wrk-ork whose inference jobs are routed (its public key).
    ork: PublicKey | None = None
    #: Where wrk-ork listens (``host:port``), tried before the DHT.
    ork_addresses: AddressList = ()
    http: ProxyHttpSettings = ProxyHttpSettings()
    usage: UsageSettings = UsageSettings()
    #: A replica that failed before answering is skipped for this long
    #: (doubling on repeated failures, up to ``replica_backoff_max_s``).
    replica_backoff_s: float = Field(default=1.0, gt=0, le=600)
    replica_backoff_max_s: float = Field(default=30.0, gt=0, le=3600)
    #: How long a request waits for the proxy to reach a job's replica that wrk-ork
    #: lists but the proxy is still connecting to (a job that has just become Active,
    #: its agent behind a relay): the request is answered then, not refused with 503.
    replica_connect_wait_s: float = Field(default=10.0, ge=0, le=120)
    #: How often the job table is read again even without a change (wrk-ork's
    #: watch reports status changes; agent keys may change without one).
    jobs_refresh_s: float = Field(default=10.0, gt=0, le=3600)
    #: fsync the database's log on every append (False: tests and benchmarks only).
    fsync: bool = True
    #: Ship the proxy's log records to wrk-monitor
    #: (``COSMICAC_PROXY__TELEMETRY__MONITOR=<hex>``); off without a monitor.
    telemetry: TelemetrySettings = TelemetrySettings()

    @property
    def ork_peer(self) -> PeerRef | None:
        """wrk-ork (``ork`` and ``ork_addresses``); None without one."""
        return peer_ref(self, "ork")
