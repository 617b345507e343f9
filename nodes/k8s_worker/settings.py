"""wrk-server-k8s-nvidia's settings: the worker's *common config* of the seeds.

The environment form is the seeds' own (seeds/relay.txt)::

    K8S_COMMON_CONFIG__interconnect__relays='["<relay-key>"]'

so the prefix is ``K8S_COMMON_CONFIG__`` and ``__`` descends into nested keys
(any case). ``cosmicac apply-config wrk-server-k8s-nvidia FILE`` validates a
file against this model and installs it; ``cosmicac run
wrk-server-k8s-nvidia`` reads the installed one (or ``--config FILE``).
Relay keys are read when the worker starts and frozen into each job it
creates: only jobs created after a restart get new ones.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasPath, BaseModel, Field
from pydantic_settings import SettingsConfigDict

from nodes.kit.settings import PeerRef, PeerSettings, peer_ref
from nodes.kit.telemetry import TelemetrySettings
from p2p.daemon import AddressList, Port, PublicKey, PublicKeyList

from .kubevirt.settings import KubevirtSettings
from .local import LocalClusterSettings
from .log_limit import DEFAULT_LOG_BURST, DEFAULT_LOG_RATE_PER_S, LogLimit
from .qemu.settings import QemuSettings

__all__ = ["AgentsSettings", "InterconnectSettings", "WorkerSettings"]

#: Default port of the worker's swarm (TCP and UDP).
WORKER_PORT = 49739


class InterconnectSettings(BaseModel):
    """How the worker and its jobs' agents reach the rest of the network."""

    model_config = {"extra": "forbid"}

    #: Blind relay keys: the worker reserves on them, and they are passed to every
    #: job created from now on (JSON array).
    relays: PublicKeyList = ()
    #: Where those relays listen (``{key: ["host:port"]}``): reached with no DHT.
    relay_addresses: dict[PublicKey, AddressList] = {}
    #: DHT bootstrap nodes (``host:port``) for the worker and its agents.
    bootstrap: AddressList = ()
    #: proxy-inference keys that Managed Inference agents accept requests from
    #: (JSON array); read when a replica starts or restarts.
    proxies: PublicKeyList = ()


class AgentsSettings(BaseModel):
    """How the worker treats its jobs' agents."""

    model_config = {"extra": "forbid"}

    #: How often an agent reports that it is alive.
    heartbeat_interval_s: float = Field(default=5.0, gt=0, le=600)
    #: A replica whose agent sent nothing for this long is Unknown.
    silent_after_s: float = Field(default=20.0, gt=0, le=3600)
    #: Addresses (``host:port``) agents dial before asking the DHT; empty:
    #: the worker's listening address on the local backend, none on kubevirt.
    worker_addresses: AddressList = ()
    #: Log records a second each agent may send through ``agent.logs`` on
    #: average; beyond it and ``log_burst`` they are dropped at the worker and
    #: counted (``worker_agent_log_records_limited_total{job}``), so one chatty
    #: model server cannot push the worker's own System records and the other
    #: agents' out of its shipper's queue. 200/s: a replica answering ~100
    #: requests a second with a line or two each (see ``log_limit.py``).
    log_rate_per_s: float = Field(default=DEFAULT_LOG_RATE_PER_S, gt=0, le=1_000_000)
    #: Records an agent may send at once after a quiet spell: a start-up or a
    #: traceback, and one whole ``agent.logs`` batch (at most 1,000 records).
    log_burst: int = Field(default=DEFAULT_LOG_BURST, ge=1, le=10_000_000)

    def log_limit(self) -> LogLimit:
        """The budget of each agent's log records (:mod:`.log_limit`)."""
        return LogLimit(rate=self.log_rate_per_s, burst=self.log_burst)


class WorkerSettings(PeerSettings):
    """Everything ``wrk-server-k8s-nvidia`` reads at start.

    Its peer is the kit's :class:`~nodes.kit.settings.PeerSettings`
    (``storage``: identity, queue, replica state, local VMIs; ``host``,
    ``port``, ``announce_addresses``), in the seeds' shape:
    ``bootstrap`` and ``relays`` are ``interconnect.bootstrap`` and
    ``interconnect.relays``, read there through aliases
    (``K8S_COMMON_CONFIG__interconnect__relays``); a top-level ``bootstrap`` or
    ``relays`` key is no setting of the worker's, as before. The worker reserves
    on the relays like every daemon (agents whose network cannot reach it come
    through them) and passes them to its jobs (seeds/relay.txt).
    """

    model_config = SettingsConfigDict(env_prefix="K8S_COMMON_CONFIG__")

    port: Port = WORKER_PORT
    #: The DHT bootstrap of the worker and its jobs' agents:
    #: ``interconnect.bootstrap`` (not dumped: ``interconnect`` holds it).
    bootstrap: AddressList = Field(
        default=(), validation_alias=AliasPath("interconnect", "bootstrap"), exclude=True)
    #: The blind relays it reserves on and passes to its jobs: ``interconnect.relays``.
    relays: PublicKeyList = Field(
        default=(), validation_alias=AliasPath("interconnect", "relays"), exclude=True)
    #: Where they listen: ``interconnect.relay_addresses``.
    relay_addresses: dict[PublicKey, AddressList] = Field(
        default={}, validation_alias=AliasPath("interconnect", "relay_addresses"),
        exclude=True)
    #: The wrk-ork this worker takes operations from (its public key).
    ork: PublicKey
    #: Where wrk-ork listens (``host:port``), tried before the DHT.
    ork_addresses: AddressList = ()
    interconnect: InterconnectSettings = InterconnectSettings()
    agents: AgentsSettings = AgentsSettings()
    #: ``local``: agents as processes on this machine (the embedded default);
    #: ``kubevirt``: VMIs on the cluster behind ``kubevirt``; ``qemu``: each VMI
    #: a KVM virtual machine on this host (``qemu``: the guest image, the GPUs).
    backend: Literal["local", "kubevirt", "qemu"] = "local"
    local: LocalClusterSettings = LocalClusterSettings()
    kubevirt: KubevirtSettings = KubevirtSettings()
    qemu: QemuSettings = QemuSettings()
    #: How often the rack's capacity is sent to wrk-ork (its heartbeat).
    report_interval_s: float = Field(default=15.0, gt=0, le=3600)
    #: How often the agents' figures (from their heartbeats) go to wrk-monitor.
    agent_metrics_interval_s: float = Field(default=5.0, gt=0, le=3600)
    #: fsync the queue and the state file on every write (False: tests only).
    fsync: bool = True
    #: Ship the worker's log records (the jobs' System steps) to wrk-monitor
    #: (``K8S_COMMON_CONFIG__TELEMETRY__MONITOR=<hex>``); off without a monitor.
    telemetry: TelemetrySettings = TelemetrySettings()

    @property
    def ork_peer(self) -> PeerRef:
        """wrk-ork: ``ork`` and ``ork_addresses``."""
        ref = peer_ref(self, "ork")
        assert ref is not None  # ork is required
        return ref


def relays_hex(settings: WorkerSettings) -> tuple[str, ...]:
    return tuple(key.hex() for key in settings.interconnect.relays)


__all__ += ["WORKER_PORT", "relays_hex"]
