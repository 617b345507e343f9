"""The request and response bodies of ``/api`` (pydantic; the OpenAPI schema is built from them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.model import (
    IMAGE_PATTERN,
    MAX_GPUS_PER_REPLICA,
    MAX_REPLICAS,
    JobSpec,
    JobType,
    Runtime,
)
from contracts.ork import NodeEntry, RackInfo
from contracts.runtime_settings import ModelRuntimeSettings, RuntimeSettings

from ..model import Role, User


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class SignupIn(_In):
    email: str = Field(min_length=3, max_length=254)
    name: str = Field(min_length=1, max_length=100)
    password: str = Field(min_length=1, max_length=1024)
    team_name: str = Field(min_length=1, max_length=64)


class LoginIn(_In):
    email: str = Field(min_length=3, max_length=254)
    password: str = Field(min_length=1, max_length=1024)
    #: The CLI's Ed25519 public key (64 hex) to register on the user.
    cli_public_key: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")


class ActiveTeamIn(_In):
    team_id: str = Field(min_length=1, max_length=64)


class TeamIn(_In):
    name: str = Field(min_length=1, max_length=64)


class RoleIn(_In):
    role: Role


class InvitationIn(_In):
    email: str = Field(min_length=3, max_length=254)
    role: Role = Role.MEMBER


class AcceptIn(_In):
    token: str = Field(min_length=1, max_length=200)
    #: Without a bearer session: the new account's email, name and password.
    email: str | None = Field(default=None, max_length=254)
    name: str | None = Field(default=None, max_length=100)
    password: str | None = Field(default=None, max_length=1024)


class ApiKeyIn(_In):
    name: str = Field(min_length=1, max_length=100)
    #: The team the key bills to; the caller's active team if absent.
    team_id: str | None = Field(default=None, max_length=64)
    scopes: list[str] = Field(default_factory=list, max_length=64)


class UserOut(BaseModel):
    id: str
    email: str
    name: str
    cli_public_key: str | None = None
    active_team: str | None = None


class TeamOut(BaseModel):
    id: str
    name: str
    role: Role


class QuotaIn(_In):
    """Fields left out keep their value; ``null`` removes that quota (unlimited)."""

    #: GPUs the team's jobs may hold or wait for, every replica counted.
    gpus: int | None = Field(default=None, ge=0, le=1_000_000)
    #: The same for the jobs each member created in the team.
    per_user_gpus: int | None = Field(default=None, ge=0, le=1_000_000)


class QuotaOut(BaseModel):
    """A team's GPU quotas; ``null``: unlimited."""

    team: str
    gpus: int | None = None
    per_user_gpus: int | None = None
    #: When an operator last set them (POSIX seconds); null: never.
    updated_at: float | None = None


class TeamInfoOut(TeamOut):
    """A team with its GPU quotas (``GET /api/teams``, ``GET /api/teams/{team}``)."""

    quota: QuotaOut


class MemberOut(BaseModel):
    user: UserOut
    role: Role


class MembersOut(BaseModel):
    members: list[MemberOut]


class TeamsOut(BaseModel):
    teams: list[TeamInfoOut]


class SessionOut(BaseModel):
    token: str
    #: POSIX seconds.
    expires_at: float
    user: UserOut


class SignupOut(SessionOut):
    team: TeamOut


class MeOut(BaseModel):
    user: UserOut
    teams: list[TeamOut]
    active_team: str | None
    #: A platform operator (an owner or admin of the first admin's team): racks,
    #: nodes, users and the control plane's health are theirs.
    operator: bool = False


class MembershipOut(BaseModel):
    user: str
    team: str
    role: Role


class MeIn(_In):
    name: str = Field(min_length=1, max_length=100)


class PasswordChangeIn(_In):
    current_password: str = Field(min_length=1, max_length=1024)
    password: str = Field(min_length=1, max_length=1024)


class PasswordResetIn(_In):
    email: str = Field(min_length=3, max_length=254)


class PasswordResetConfirmIn(_In):
    token: str = Field(min_length=1, max_length=200)
    password: str = Field(min_length=1, max_length=1024)


class UserListedOut(BaseModel):
    user: UserOut
    created_at: float
    disabled: bool
    teams: list[TeamOut]


class UsersOut(BaseModel):
    users: list[UserListedOut]
    #: Pass as ``cursor`` for the next page; None: the last page.
    next: str | None = None


class InvitationOut(BaseModel):
    id: str
    team: str
    email: str
    role: Role
    expires_at: float


class AcceptOut(BaseModel):
    membership: MembershipOut
    #: A session for the account created by accepting (absent when a session was sent).
    session: SessionOut | None = None


class InvitationListedOut(InvitationOut):
    invited_by: str
    created_at: float


class InvitationsOut(BaseModel):
    #: Pending ones only (neither accepted nor expired), oldest first.
    invitations: list[InvitationListedOut]


class ApiKeyCreatedOut(BaseModel):
    id: str
    #: The secret: shown this once, never again.
    key: str
    prefix: str
    team: str
    name: str


class ApiKeyOut(BaseModel):
    id: str
    team: str
    name: str
    prefix: str
    created_by: str
    created_at: float
    revoked_at: float | None
    #: ms since the epoch, the latest any replica reported; None if never used.
    last_used_ms: int | None


class ApiKeysOut(BaseModel):
    keys: list[ApiKeyOut]


class UsageRowOut(BaseModel):
    day: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    requests: int
    audio_seconds: float


class UsageOut(BaseModel):
    key: str
    rows: list[UsageRowOut]


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorOut(BaseModel):
    error: ErrorBody


def user_out(user: User) -> UserOut:
    return UserOut(id=user.id, email=user.email, name=user.name,
                   cli_public_key=user.cli_public_key, active_team=user.active_team)


# -- jobs, replicas, racks, nodes (wrk-ork's, through app-node) -------------------------


class JobIn(_In):
    """A job to create.

    What an inference job leaves out comes from its model's master (``runtime``,
    ``gpus``, ``replicas``, ``image``, ``served_name``, ``location``), then: the
    deployment's ``default_image``, 1 GPU, 1 replica, location ``default``.
    """

    name: str = Field(min_length=1, max_length=100)
    type: JobType
    image: str | None = Field(default=None, max_length=512)
    gpus: int | None = None
    replicas: int | None = None
    runtime: Runtime | None = None
    model: str | None = None
    served_name: str | None = None
    location: str | None = None
    #: The model server's arguments and environment of this job, laid over its
    #: model master's (inference jobs).
    runtime_settings: RuntimeSettings | None = None
    #: A GPU Container Job on a network of its own, reached through a WireGuard
    #: gateway (``GET /api/jobs/{job}/wireguard``).
    isolated_network: bool | None = None
    #: The team the job runs for; the caller's active team if absent.
    team_id: str | None = Field(default=None, max_length=64)


class ReplicaOut(BaseModel):
    index: int
    #: ``running`` for an active replica (as the CLI shows it).
    status: str
    generation: int
    message: str
    #: The replica's agents' public keys (hex), by node rank.
    agents: list[str]
    #: Nodes it runs on (empty until placed).
    nodes: list[str]


class JobOut(BaseModel):
    id: str
    team: str
    name: str
    type: str
    #: ``running`` for Active (``contracts.model.api_status``).
    status: str
    reason: str
    created_by: str | None
    created_at: float
    deleted_at: float | None = None
    rack: str | None
    replicas: list[ReplicaOut]
    #: What the job was created with (the web UI's Duplicate sends it back).
    spec: JobSpec
    #: An inference job's model health, apart from its status: ``Healthy``,
    #: ``Degraded`` or ``Unhealthy`` (wrk-monitor's, from the proxies' latency
    #: and errors); None when unknown (not an inference job, no wrk-monitor or
    #: not reachable, no proxy reporting it). Only ``GET /api/jobs`` and
    #: ``GET /api/jobs/{job}`` fill it in.
    model_health: str | None = None
    #: When the worker last heard from the job's least recently heard agent (POSIX
    #: seconds, wrk-monitor's clock); None: unknown (no agent yet, or no wrk-monitor).
    #: Minutes old while the job stays Starting or Active: its agents cannot reach
    #: their worker (seeds/relay.txt).
    agents_heard_at: float | None = None


class ReplicaPreviewOut(BaseModel):
    """Where one replica of a dry-run job would run."""

    index: int
    #: What it would be once placement was tried (``starting``, ``pending``,
    #: ``failed``), or ``unknown`` when wrk-ork could not say.
    status: str
    #: The nodes it would run on (more than one: a vLLM replica split over
    #: InfiniBand nodes); empty when it would wait, fail or is unknown.
    nodes: list[str]
    #: The GPUs it would take on each of ``nodes``, in the same order.
    gpus: list[int]


class JobPreviewOut(BaseModel):
    """``POST /api/jobs?dry_run=true``: the job as it would be created, and what
    wrk-ork would do with it now; nothing was created. Its fields are a subset of
    :class:`JobOut`'s (no id: there is no job), so ``cosmicac jobs create -f`` takes
    this document back as it takes a job's."""

    team: str
    name: str
    type: str
    #: ``starting`` (it would be placed now), ``pending`` (it would wait for GPUs),
    #: ``failed`` (it could never run as the location is registered), or null:
    #: unknown (a wrk-ork older than ``jobs.preview``; ``reason`` says so).
    status: str | None
    #: Why it would wait or fail, or why the placement is unknown.
    reason: str
    #: The rack every replica would run on (``starting`` only).
    rack: str | None
    replicas: list[ReplicaPreviewOut]
    #: The spec it would be created with (defaults filled in, as ``JobOut.spec``).
    spec: JobSpec


class JobsOut(BaseModel):
    jobs: list[JobOut]
    #: Pass as ``cursor`` for the next page; None: the last page.
    next: str | None = None


class WireGuardOut(BaseModel):
    """What the caller's WireGuard needs to reach an isolated job's network: the
    gateway, and the caller's own tunnel address (their private key never leaves
    their CLI: it is the X25519 key of the CLI identity)."""

    job: str
    #: The CLI key the address is for (the caller's account's): a CLI holding
    #: another identity must log in again first.
    cli_public_key: str
    gateway_public_key: str
    endpoint: str
    #: The caller's tunnel address (a /32 in ``tunnel_subnet``).
    address: str
    tunnel_subnet: str
    #: The job's networks, routed through the gateway.
    networks: list[str]


class DeletedJobOut(BaseModel):
    #: True: wrk-ork says the job is gone (the record is marked deleted).
    gone: bool
    #: While wrk-ork still removes it: the job, ``deleting``.
    job: JobOut | None


class RackIn(_In):
    rack: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    location: str = "default"
    name: str | None = None


class RacksOut(BaseModel):
    racks: list[RackInfo]


class NodesOut(BaseModel):
    nodes: list[NodeEntry]


class ReserveIn(_In):
    rack: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    nodes: list[str] = Field(min_length=1, max_length=1000)
    #: The app-node team id the nodes are kept for.
    team: str = Field(min_length=1, max_length=64)


class ReleaseIn(_In):
    rack: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    nodes: list[str] = Field(min_length=1, max_length=1000)


# -- model masters (the shared database's, through app-node) ----------------------------

#: A model master's name is what jobs and requests call the model, so it looks like a
#: served name (``JobSpec.served_name``): ``meta-llama/Llama-3.1-8B``, ``demo``.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/\-]*$"


class ModelDefaultsIn(_In):
    """What a job of this model gets when its request leaves the field out: the
    fields of :class:`~contracts.model.JobSpec` that belong to a model, checked as
    JobSpec checks them. Nothing else is accepted (a typo is an error, not a no-op)."""

    gpus: int | None = Field(default=None, ge=1, le=MAX_GPUS_PER_REPLICA)
    replicas: int | None = Field(default=None, ge=1, le=MAX_REPLICAS)
    image: str | None = Field(default=None, max_length=512)
    served_name: str | None = Field(default=None, min_length=1, max_length=200,
                                    pattern=MODEL_NAME_PATTERN)
    location: str | None = Field(default=None, min_length=1, max_length=64,
                                 pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    #: The model server's arguments, environment and hub token Secret for every
    #: job of this model (a job's own ``runtime_settings`` are laid over them).
    model_settings: ModelRuntimeSettings | None = None

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not IMAGE_PATTERN.match(value):
            raise ValueError(f"image {value!r} is not a registry image "
                             "(docker://host[:port]/repo[:tag])")
        return value


class ModelNameIn(_In):
    name: str = Field(min_length=1, max_length=200, pattern=MODEL_NAME_PATTERN)


class ModelMasterIn(ModelNameIn):
    runtime: Runtime
    defaults: ModelDefaultsIn = Field(default_factory=ModelDefaultsIn)


class ModelMasterOut(BaseModel):
    name: str
    runtime: str
    #: The defaults it was put with (only the fields set).
    defaults: dict[str, Any]


class ModelMastersOut(BaseModel):
    models: list[ModelMasterOut]
