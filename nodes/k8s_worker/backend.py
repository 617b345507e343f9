"""The one interface behind which the worker runs VMIs: ``kubevirt`` or ``local``.

The worker turns each queue operation into calls on a :class:`Backend` and
turns the backend's :class:`VmiEvent` stream (plus the agents' reports) into
replica states. A backend owns nothing the worker must remember: after a
restart, the worker hands it the replicas it knows (:meth:`Backend.run` is
given them through :meth:`Backend.adopt`), and the backend reports what each
VMI is doing now.

Every method is idempotent, because the queue delivers at least once:
creating what exists, deleting what is gone, are successes.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from contracts.agent_config import AgentConfig
from contracts.gateway import GatewayView
from contracts.model import JobSpec, RackReport, ReplicaPlacement
from contracts.runtime_settings import HUB_TOKEN_KEY, merged_runtime_settings

__all__ = [
    "NO_TOKEN",
    "Backend",
    "BackendError",
    "ReplicaUnit",
    "VmiEvent",
    "VmiPhase",
    "VmiSpec",
    "disk_name",
    "hub_token_secret",
    "read_hub_token",
    "refuse_isolated_network",
    "replica_unit",
    "token_digest",
    "vmi_name",
]

#: The ``report_token`` of a unit built only to watch or expect existing VMIs
#: (the worker keeps no token, only its digest): no token hashes to a stored
#: digest of 32 random bytes, so it proves nothing, and no backend writes it
#: into a VMI (create and restart get units with fresh tokens).
NO_TOKEN = "0" * 64


def token_digest(token: str) -> str:
    """What the worker keeps of a report token: its SHA-256, hex. The token is 32
    random bytes, so a fast hash is enough (nothing to guess); a digest read from
    the worker's files does not pass hello."""
    return hashlib.sha256(token.encode()).hexdigest()


class BackendError(Exception):
    """A backend call failed; ``retryable`` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def _short(job_id: str) -> str:
    return job_id.removeprefix("j-")[:16]


def vmi_name(job_id: str, replica: int, node_rank: int) -> str:
    """The VMI's object name: stable across restarts, DNS-1123, ≤ 63 characters."""
    return f"cac-{_short(job_id)}-r{replica}-n{node_rank}"


def disk_name(job_id: str, replica: int, node_rank: int) -> str:
    """The root disk's name (DataVolume, or the local storage folder); kept on restart."""
    return f"cac-{_short(job_id)}-r{replica}-n{node_rank}-root"


@dataclass(frozen=True)
class VmiSpec:
    """One VMI of a replica: where it runs, with what, and its agent's config."""

    name: str
    disk: str
    node: str
    gpus: int
    node_rank: int
    agent: AgentConfig
    #: Part of a multi-node replica: joins the overlay network and claims
    #: InfiniBand.
    multi_node: bool = False
    #: The digest (:func:`token_digest`) of the VMI's report token, when the unit
    #: was built from the worker's state (whose ``agent.report_token`` is then
    #: :data:`NO_TOKEN`); None: the digest of ``agent.report_token``.
    token_sha256: str | None = None
    #: The Secret holding the model hub's token the VMI's model server gets
    #: (its model master's ``hub_token_secret``); None: none.
    hub_token_secret: str | None = None

    @property
    def expected_token(self) -> str:
        """The digest a hello's token must have to prove this VMI."""
        if self.token_sha256 is not None:
            return self.token_sha256
        if self.agent.report_token == NO_TOKEN:
            return "-"  # no digest is this: a unit without tokens proves nothing
        return token_digest(self.agent.report_token)


@dataclass(frozen=True)
class ReplicaUnit:
    """Everything the backend needs to run one replica (one VMI per node share)."""

    job_id: str
    replica: int
    generation: int
    spec: JobSpec
    vmis: tuple[VmiSpec, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(vmi.name for vmi in self.vmis)


class VmiPhase(enum.StrEnum):
    """What one VMI (or local agent process) is doing, backend-neutral."""

    #: Root disk importing (CDI DataVolume) or storage being prepared.
    PROVISIONING = "provisioning"
    #: Waiting for a node (KubeVirt ``Pending``/``Scheduling``).
    SCHEDULING = "scheduling"
    #: Scheduled; the guest is booting (``Scheduled``).
    BOOTING = "booting"
    #: The VMI (process) runs; the agent decides when it is ready.
    RUNNING = "running"
    #: Stopped by itself with success (``Succeeded``, exit status 0).
    SUCCEEDED = "succeeded"
    #: Crashed, failed to start, exited non-zero (``Failed``).
    FAILED = "failed"
    #: The object no longer exists.
    GONE = "gone"
    #: The backend cannot tell (``Unknown``).
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class VmiEvent:
    """A VMI's phase changed, or a step worth a System log line happened."""

    name: str
    phase: VmiPhase
    #: A System log line ("DataVolume importing 40%", "VMI scheduled on
    #: gpu-node-3"), or "" when only the phase changed.
    message: str = ""
    #: Where it runs, once known.
    node: str | None = None
    #: The replica generation of the VMI this is about (a restart starts a new
    #: one); events of an older generation are stale and ignored. None: the
    #: backend cannot tell.
    generation: int | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False)
    #: An isolated network's WireGuard gateway came up (or moved): the event is
    #: about the job's network, not the VMI's phase (which it does not change).
    gateway: GatewayView | None = None


def refuse_isolated_network(unit: ReplicaUnit, backend: str) -> None:
    """Raise for an isolated job on a backend without isolated networks (wrk-ork
    places none there: its rack does not report them; this is the last guard).

    Raises:
        BackendError: (not retryable) naming the backend that has them.
    """
    if unit.spec.isolated_network:
        raise BackendError(f"job {unit.job_id} asks for an isolated network: the {backend} "
                           "backend has none (the kubevirt backend with "
                           "kubevirt.wireguard_endpoint does)", retryable=False)


#: A hub token is a line of text; more than this is not one.
HUB_TOKEN_MAX = 64 * 1024


def read_hub_token(secrets_dir: Path, vmi: VmiSpec, logger: logging.Logger,
                   backend: str) -> bytes | None:
    """The token of ``vmi``'s hub token Secret from ``secrets_dir`` (``<name>/token``,
    a mounted Secret's layout), or None, said in the log as
    ``<backend>.hub_token_missing``: the agent then reports the file it lacks.
    Blocking (a file read)."""
    assert vmi.hub_token_secret is not None
    path = secrets_dir / vmi.hub_token_secret / HUB_TOKEN_KEY
    try:
        with open(path, "rb") as file:
            return file.read(HUB_TOKEN_MAX)
    except OSError as exc:
        logger.warning("%s.hub_token_missing vmi=%s secret=%s path=%s error=%s", backend,
                       vmi.name, vmi.hub_token_secret, path, exc.strerror or exc)
        return None


def hub_token_secret(spec: JobSpec) -> str | None:
    """The Secret naming the model hub's token this job's model server gets, if any."""
    return spec.model_settings.hub_token_secret if spec.model_settings is not None else None


def replica_unit(job_id: str, replica: int, spec: JobSpec, placement: ReplicaPlacement, *,
                 generation: int = 0, agent: Mapping[str, Any],
                 tokens: Sequence[str] | None = None,
                 token_hashes: Sequence[str] | None = None,
                 telemetry: bool = False) -> ReplicaUnit:
    """The :class:`ReplicaUnit` of one placed replica: one VMI per node share.

    Args:
        agent: the :class:`AgentConfig` fields the worker supplies (``worker``,
            ``report_token``, ``worker_addresses``, ``bootstrap``, ``relays``,
            ``authorized_keys``…); the job's own fields (ids, rank, type,
            runtime, model, GPUs) are filled in here.
        tokens: a report token per VMI (node rank), overriding
            ``agent["report_token"]``: each agent proves its own VMI.
        token_hashes: instead of ``tokens``, their digests (the worker's state):
            a unit to watch or expect VMIs with, whose configs carry
            :data:`NO_TOKEN`; never one to create or restart with.
        telemetry: the agents ship their logs to the worker (``agent.logs``):
            the worker's own telemetry is on. An ``agent["telemetry"]`` wins.

    Raises:
        pydantic.ValidationError: an ``agent`` field is invalid.
    """
    count = len(placement.shares)
    runtime_args, runtime_env = merged_runtime_settings(spec.model_settings,
                                                        spec.runtime_settings)
    vmis = tuple(
        VmiSpec(
            name=vmi_name(job_id, replica, rank),
            disk=disk_name(job_id, replica, rank),
            node=share.node,
            gpus=share.gpus,
            node_rank=rank,
            multi_node=placement.multi_node,
            agent=AgentConfig(job_id=job_id, replica=replica, generation=generation,
                              node_rank=rank, node_count=count, job_type=spec.type,
                              runtime=spec.runtime, model=spec.model, gpus=share.gpus,
                              served_name=spec.serves_as,
                              runtime_args=runtime_args, runtime_env=runtime_env,
                              head_address=(vmi_name(job_id, replica, 0)
                                            if placement.multi_node else None),
                              **{"telemetry": telemetry, **agent,
                                 **({"report_token": tokens[rank]} if tokens else
                                    {"report_token": NO_TOKEN} if token_hashes else {})}),
            token_sha256=token_hashes[rank] if token_hashes and not tokens else None,
            hub_token_secret=hub_token_secret(spec),
        )
        for rank, share in enumerate(placement.shares))
    return ReplicaUnit(job_id=job_id, replica=replica, generation=generation, spec=spec,
                      vmis=vmis)


class Backend(Protocol):
    """Runs VMIs. Implementations: ``kubevirt`` (real) and ``local`` (processes)."""

    #: ``kubevirt`` or ``local``.
    name: str

    async def run(self, events: trio.MemorySendChannel[VmiEvent], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch every VMI this backend runs; send a :class:`VmiEvent` per change.

        Calls ``task_status.started()`` once watching; runs until cancelled.
        """
        ...

    def adopt(self, units: Sequence[ReplicaUnit]) -> None:
        """After a worker restart: these replicas exist (or should); watch them."""
        ...

    async def capacity(self) -> RackReport:
        """The cluster's nodes and their GPUs."""
        ...

    async def create(self, unit: ReplicaUnit) -> None:
        """Create the replica's disks, secrets and VMIs; existing ones are kept."""
        ...

    async def restart(self, unit: ReplicaUnit) -> None:
        """Replace the replica's VMIs (delete, wait until gone, create), keeping disks.

        ``unit`` carries the new generation and agent configs.
        """
        ...

    async def delete(self, unit: ReplicaUnit) -> None:
        """Remove the replica's VMIs, disks and secrets; what is gone already is fine."""
        ...
