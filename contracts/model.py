"""The platform's shared vocabulary: jobs, racks, nodes, placements, statuses.

Everything here is plain data, validated once where it enters (a user's job,
a worker's capacity report) and trusted after. wrk-ork, the worker, its
backends, ``cosmicac k8s render`` and the agents all speak these types, so a
field means the same thing everywhere (seeds/jobs.txt, seeds/architecture.txt).

Words, as the seeds use them:

- a **rack** is the GPU capacity behind one worker, listed under one
  location; it is identified by the worker's public key;
- a **node** is a machine of that cluster with a pool of whole GPUs;
- a job has ``replicas`` copies, each needing ``gpus`` GPUs; a replica runs as
  one VMI on one node, except a vLLM replica larger than a node, which takes
  several nodes of one rack, each giving the same number of GPUs.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from ._compat import AddedLater
from .runtime_settings import ModelRuntimeSettings, RuntimeSettings, managed_flag_problem

__all__ = [
    "IMAGE_PATTERN",
    "MAX_GPUS_PER_REPLICA",
    "MAX_REPLICAS",
    "JobSpec",
    "JobStatus",
    "JobType",
    "KeyHex",
    "NodeInfo",
    "NodeShare",
    "RackReport",
    "ReplicaPlacement",
    "ReplicaState",
    "Runtime",
    "api_status",
    "first_error",
    "job_type_problem",
    "key_hex",
]

#: A replica of more GPUs than this is a typo, not a request: 8 nodes of 8.
MAX_GPUS_PER_REPLICA = 64
#: Replicas of one job; each is a VMI (or several), so the bound keeps one
#: request from flooding the queue.
MAX_REPLICAS = 64

#: CDI's registry source form (``docker://host[:port]/repo[:tag|@digest]``),
#: see reference/kubevirt-cdi-vllm.md §2.
IMAGE_PATTERN = re.compile(r"^docker://[A-Za-z0-9][A-Za-z0-9.\-]*(:[0-9]+)?(/[a-z0-9._\-]+)+"
                           r"(:[A-Za-z0-9_][A-Za-z0-9._\-]{0,127}|@sha256:[0-9a-f]{64})?$")

_KEY_HEX = re.compile(r"^[0-9a-f]{64}$")


def key_hex(value: str) -> str:
    """``value`` as a canonical public key: 64 lowercase hex characters.

    Raises:
        ValueError: it is not one.
    """
    value = value.strip().lower()
    if not _KEY_HEX.match(value):
        raise ValueError("must be a public key: 64 hex characters")
    return value


#: A public key as the platform shows it: 64 lowercase hex characters.
KeyHex = Annotated[str, AfterValidator(key_hex)]


class JobType(enum.StrEnum):
    """The two job types of seeds/jobs.txt."""

    #: GPU Container Job: shell access to the VMI; always one replica.
    CONTAINER = "container"
    #: Managed Inference Job: a model behind the OpenAI-compatible API.
    INFERENCE = "inference"


class Runtime(enum.StrEnum):
    """The model server a Managed Inference Job runs."""

    #: vLLM; the only runtime whose replica may span several nodes.
    VLLM = "vllm"
    #: NVIDIA Parakeet speech-to-text; single node.
    PARAKEET = "parakeet"
    #: The embedded CPU runtime of the ``local`` deployment; single node.
    LOCAL = "local"


def job_type_problem(type_: JobType, *, runtime: Runtime | None, model: str | None,
                     served_name: str | None, replicas: int = 1,
                     authorized_keys: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """What a job of each type may hold, written once.

    A GPU Container Job takes no model (nor runtime or served name: only
    inference jobs run one) and has exactly one replica; a Managed Inference
    Job needs a runtime and a model and takes no shell keys (it is reached
    through proxy-inference).

    Returns:
        ``(field, message)`` for the first field that breaks the rule, else None.
        :class:`JobSpec` refuses the message; app-node's API answers 422 naming
        the field before it builds a spec.
    """
    if type_ is JobType.CONTAINER:
        for field, value in (("runtime", runtime), ("model", model),
                             ("served_name", served_name)):
            if value is not None:
                return field, (f"a GPU Container Job takes no {field} "
                               "(only inference jobs run a model)")
        if replicas != 1:
            return "replicas", "a GPU Container Job has exactly one replica"
        return None
    if runtime is None:
        return "runtime", "a Managed Inference Job needs a runtime (vllm, parakeet or local)"
    if model is None:
        return "model", "a Managed Inference Job needs a model"
    if authorized_keys:
        return "authorized_keys", ("a Managed Inference Job takes no shell keys "
                                   "(it is reached through proxy-inference)")
    return None


class JobSpec(AddedLater):
    """What a user asks for (the JOB.json of ``cosmicac k8s render``).

    ``gpus`` is per replica. Validation covers what can be known without a
    cluster: whether a job *fits* is placement's question.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    _added_later = ("runtime_settings", "model_settings", "isolated_network")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")
    team: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    type: JobType
    image: str = Field(max_length=512)
    gpus: int = Field(ge=1, le=MAX_GPUS_PER_REPLICA)
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    runtime: Runtime | None = None
    model: str | None = Field(default=None, min_length=1, max_length=200)
    #: The name clients put in a request's ``model`` (``/v1/models`` lists it);
    #: None: the model. Two live inference jobs of one team cannot share one.
    served_name: str | None = Field(default=None, min_length=1, max_length=200,
                                    pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/\-]*$")
    #: Users' public keys allowed to open shells (a GPU Container Job): the team
    #: members' CLI keys, as app-node resolves them when the job is created; the
    #: team's newer sets follow while it runs (contracts/shell_access.py).
    authorized_keys: tuple[KeyHex, ...] = Field(default=(), max_length=1024)
    location: str = Field(default="default", min_length=1, max_length=64,
                          pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    #: The job's own model server arguments and environment (inference jobs).
    runtime_settings: RuntimeSettings | None = None
    #: Its model master's settings, copied when the job was created (a later
    #: change of the master leaves running jobs as they are, like its defaults).
    model_settings: ModelRuntimeSettings | None = None
    #: A GPU Container Job on a network of its own, reached by its team's
    #: members through a WireGuard gateway (contracts/gateway.py); placed only
    #: on a rack whose worker offers isolated networks.
    isolated_network: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if not IMAGE_PATTERN.match(self.image):
            raise ValueError(f"image {self.image!r} is not a registry image "
                             "(docker://host[:port]/repo[:tag])")
        problem = job_type_problem(self.type, runtime=self.runtime, model=self.model,
                                   served_name=self.served_name, replicas=self.replicas,
                                   authorized_keys=self.authorized_keys)
        if problem is not None:
            raise ValueError(problem[1])
        if self.isolated_network and self.type is not JobType.CONTAINER:
            raise ValueError("only a GPU Container Job takes an isolated network (an "
                             "inference job is reached through proxy-inference)")
        for settings in (self.runtime_settings, self.model_settings):
            if settings is None:
                continue
            if self.type is not JobType.INFERENCE:
                raise ValueError("a GPU Container Job takes no runtime settings "
                                 "(only inference jobs run a model server)")
            flag = managed_flag_problem(str(self.runtime), settings.args)
            if flag is not None:
                raise ValueError(flag)
        return self

    @property
    def serves_as(self) -> str | None:
        """The name requests use for this job's model (inference jobs only)."""
        if self.type is not JobType.INFERENCE:
            return None
        return self.served_name or self.model

    @property
    def may_span_nodes(self) -> bool:
        """Only a vLLM replica may take several nodes (seeds/architecture.txt)."""
        return self.type is JobType.INFERENCE and self.runtime is Runtime.VLLM


class NodeInfo(BaseModel):
    """One node of a rack, as its worker reports it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=253)
    #: Whole GPUs the node offers (allocatable of the GPU resource).
    gpus: int = Field(ge=0, le=1024)
    #: The device-plugin resource the GPUs are claimed by
    #: (``nvidia.com/GH100_H100_SXM5_80GB``); None on the ``local`` backend.
    gpu_resource: str | None = None
    #: The node has the InfiniBand resource a multi-node replica claims.
    infiniband: bool = False
    #: False: cordoned or not Ready; nothing new is placed on it.
    schedulable: bool = True


class RackReport(AddedLater):
    """A worker's view of its cluster: the rack's capacity."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _added_later = ("isolated_networks",)

    nodes: tuple[NodeInfo, ...] = Field(max_length=10_000)
    #: The overlay network (Multus attachment) multi-node replicas join is
    #: configured on this worker.
    overlay_network: bool = False
    #: The worker runs isolated job networks with a WireGuard gateway.
    isolated_networks: bool = False

    @model_validator(mode="after")
    def _unique(self) -> RackReport:
        names = [node.name for node in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        return self


class NodeShare(BaseModel):
    """The GPUs one replica takes on one node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    gpus: int = Field(ge=1)


class ReplicaPlacement(BaseModel):
    """Where one replica runs: one share per VMI, all on one rack."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rack: KeyHex
    shares: tuple[NodeShare, ...] = Field(min_length=1)

    @property
    def multi_node(self) -> bool:
        return len(self.shares) > 1


class ReplicaState(enum.StrEnum):
    """A replica's state as the worker reports it back to wrk-ork."""

    #: Provisioning: disk importing, VMI scheduling or booting, agent not ready.
    STARTING = "starting"
    #: The VMI (or process) runs and its agent said it is ready.
    ACTIVE = "active"
    #: The VMI failed, the process exited non-zero, or the agent gave up.
    FAILED = "failed"
    #: Being replaced; storage is kept.
    RESTARTING = "restarting"
    #: Everything of the replica is gone; its GPUs are free again.
    DELETED = "deleted"
    #: The agent's heartbeats stopped.
    UNKNOWN = "unknown"


class JobStatus(enum.StrEnum):
    """The job statuses of seeds/jobs.txt, plus ``deleting`` while a delete runs."""

    #: Validating the job's configuration and GPU requirements.
    CREATING = "creating"
    #: Allocating the GPUs the job needs.
    QUEUED = "queued"
    #: No capacity yet; holds nothing; placed when capacity frees, oldest first.
    PENDING = "pending"
    #: VMIs are being created, disks imported, agents booting.
    STARTING = "starting"
    #: Up and accessible (``running`` in the API).
    ACTIVE = "active"
    #: Some replicas failed, at least one running or starting.
    DEGRADED = "degraded"
    #: VMIs being replaced, storage kept.
    RESTARTING = "restarting"
    #: Failed to start or crashed.
    FAILED = "failed"
    #: No report from the worker for longer than the configured time.
    UNKNOWN = "unknown"
    #: A delete was asked for and is being carried out.
    DELETING = "deleting"


def first_error(exc: ValidationError, whole: str) -> str:
    """``field.path: what is wrong`` of a validation error's first problem, one line.

    ``whole`` names the thing when the problem is not one field's.
    """
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or whole
    return f"{where}: {first['msg']}"


def api_status(status: JobStatus) -> str:
    """The name the HTTP API and the CLI's JSON show: Active is reported as ``running``."""
    return "running" if status is JobStatus.ACTIVE else status.value
