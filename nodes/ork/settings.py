"""wrk-ork's settings: ``COSMICAC_ORK__<KEY>`` in the environment, or a config file."""

from __future__ import annotations

from pydantic import BaseModel, Field
from pydantic_settings import SettingsConfigDict

from nodes.kit.settings import PeerSettings
from nodes.kit.telemetry import TelemetrySettings
from p2p.daemon import Port, PublicKey, PublicKeyList

__all__ = ["ORK_PORT", "OrkSettings", "RackSetting"]

#: Default port of wrk-ork's swarm (TCP and UDP).
ORK_PORT = 49740


class RackSetting(BaseModel):
    """A rack registered at start (what ``task bootstrap`` does for a default deployment)."""

    model_config = {"extra": "forbid"}

    #: The worker's public key.
    key: PublicKey
    location: str = Field(default="default", min_length=1, max_length=64)
    name: str | None = None


class OrkSettings(PeerSettings):
    """Everything wrk-ork reads at start.

    Its peer (``storage``: identity, ``ork.sqlite`` with jobs, racks and the
    outbox, the queues; ``host``, ``port``, ``bootstrap``, ``relays``,
    ``announce_addresses``) is the kit's :class:`~nodes.kit.settings.PeerSettings`.
    """

    model_config = SettingsConfigDict(env_prefix="COSMICAC_ORK__")

    port: Port = ORK_PORT
    #: app-node's key(s): may call every method of ``cosmicac-ork/1``.
    app_nodes: PublicKeyList = ()
    #: proxy-inference's key(s): may read and follow jobs (``jobs.get``,
    #: ``jobs.list``, ``jobs.watch``), nothing else.
    proxies: PublicKeyList = ()
    #: Deprecated (the single allow-list before roles): its keys get the
    #: app-node role, with a warning at start. Use ``app_nodes`` and ``proxies``.
    #: With no key in any of the three, every call is refused (never: anyone).
    clients: PublicKeyList = ()
    #: Racks registered at start, in addition to those registered over RPC.
    racks: tuple[RackSetting, ...] = ()
    #: A rack that sent no report for this long makes its jobs Unknown.
    unknown_after_s: float = Field(default=60.0, gt=0, le=86400)
    #: The least time between two ticks (a tick marks silent racks' jobs Unknown
    #: and tries Pending jobs again). Ticks are armed from the next rack's silence
    #: deadline and run sooner only after a change, so an idle wrk-ork does not poll.
    tick_interval_s: float = Field(default=1.0, gt=0, le=60)
    #: fsync the queues and the state file on every write (False: tests only).
    fsync: bool = True
    #: Ship wrk-ork's log records (the jobs' System steps) to wrk-monitor
    #: (``COSMICAC_ORK__TELEMETRY__MONITOR=<hex>``); off without a monitor.
    telemetry: TelemetrySettings = TelemetrySettings()
