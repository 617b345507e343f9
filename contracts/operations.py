"""What wrk-ork and the worker say to each other over the durable queue.

wrk-ork publishes *operations* (create, restart, delete one replica) on its
queue to a rack's worker; the worker publishes *reports* (a replica's state,
the rack's capacity) on its queue back. Each message is one msgpack map with
a ``kind``; the queue carries it as opaque bytes, in order per ``job_id``,
at least once. A redelivered operation carries the same ``op_id``, and a
worker that has already applied that id does nothing.

Wire form (msgpack map, string keys)::

    {"kind": "create_replica", "op_id": str, "job_id": str, "replica": int,
     "spec": {JobSpec}, "placement": {ReplicaPlacement}, "generation": int}
    {"kind": "restart_replica", "op_id": str, "job_id": str, "replica": int,
     "generation": int}
    {"kind": "delete_replica", "op_id": str, "job_id": str, "replica": int}
    {"kind": "set_shell_keys", "op_id": str,
     "keys": {"team": str, "keys": [key hex, ...], "version": int}}

    {"kind": "replica_report", "job_id": str, "replica": int,
     "state": ReplicaState, "generation": int, "message": str,
     "agents": [key hex, ...], "at": float}
    {"kind": "rack_report", "rack": {RackReport}, "at": float}

``set_shell_keys`` carries a team's shell keys (:mod:`contracts.shell_access`)
to a rack that runs (or is about to run) the team's container jobs; the worker
keeps the newest version per team and ignores older ones, so its ``op_id``
only needs to be unique in wrk-ork's outbox. Its queue key is ``team:<team>``.

``generation`` counts restarts of a replica: a report about an older
generation than wrk-ork's is stale (it describes the VMI a restart replaced)
and is ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgpack
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
)

from ._compat import AddedLater
from .gateway import GatewayView
from .model import (
    JobSpec,
    KeyHex,
    RackReport,
    ReplicaPlacement,
    ReplicaState,
    first_error,
)
from .shell_access import ShellKeys

__all__ = [
    "BadMessage",
    "CreateReplica",
    "DeleteReplica",
    "Operation",
    "RackUpdate",
    "ReplicaReport",
    "Report",
    "RestartReplica",
    "SetShellKeys",
    "decode_operation",
    "decode_report",
    "encode",
]

#: Job ids are wrk-ork's (``j-`` + 16 hex); bounded so a bad peer cannot
#: make us store megabytes under a key.
JobId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9\-]*$")]
OpId = Annotated[str, Field(min_length=1, max_length=64)]
ReplicaIndex = Annotated[int, Field(ge=0, lt=1024)]
Generation = Annotated[int, Field(ge=0)]

#: Longest System log line a report carries; longer ones are cut.
MAX_MESSAGE_CHARS = 1000


class BadMessage(ValueError):
    """Queue bytes that are not a message of the expected side."""


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CreateReplica(_Message):
    """Create one replica's VMIs (one per share) and its storage."""

    kind: Literal["create_replica"] = "create_replica"
    op_id: OpId
    job_id: JobId
    replica: ReplicaIndex
    spec: JobSpec
    placement: ReplicaPlacement
    generation: Generation = 0


class RestartReplica(_Message):
    """Replace the replica's VMIs, keeping its storage (seeds/jobs.txt)."""

    kind: Literal["restart_replica"] = "restart_replica"
    op_id: OpId
    job_id: JobId
    replica: ReplicaIndex
    generation: Generation


class DeleteReplica(_Message):
    """Remove the replica's VMIs, storage and secrets."""

    kind: Literal["delete_replica"] = "delete_replica"
    op_id: OpId
    job_id: JobId
    replica: ReplicaIndex


class SetShellKeys(_Message):
    """The team's shell keys changed: the worker hands them to the team's agents."""

    kind: Literal["set_shell_keys"] = "set_shell_keys"
    op_id: OpId
    keys: ShellKeys

    @property
    def queue_key(self) -> str:
        return f"team:{self.keys.team}"


Operation = Annotated[CreateReplica | RestartReplica | DeleteReplica | SetShellKeys,
                      Field(discriminator="kind")]


class ReplicaReport(AddedLater, _Message):
    """A replica's state changed (or its latest System log line did)."""

    _added_later = ("gateway",)

    kind: Literal["replica_report"] = "replica_report"
    job_id: JobId
    replica: ReplicaIndex
    state: ReplicaState
    generation: Generation = 0
    message: str = Field(default="", max_length=MAX_MESSAGE_CHARS)
    #: The keys of the replica's agents that said hello, by node rank.
    agents: tuple[KeyHex, ...] = Field(default=(), max_length=64)
    at: float
    #: An isolated network's WireGuard gateway, once it is up.
    gateway: GatewayView | None = None


class RackUpdate(_Message):
    """The rack's nodes and GPUs; sent at start and whenever they change."""

    kind: Literal["rack_report"] = "rack_report"
    rack: RackReport
    at: float


Report = Annotated[ReplicaReport | RackUpdate, Field(discriminator="kind")]

_OPERATION: TypeAdapter[CreateReplica | RestartReplica | DeleteReplica | SetShellKeys] = \
    TypeAdapter(Operation)
_REPORT: TypeAdapter[ReplicaReport | RackUpdate] = TypeAdapter(Report)


def encode(message: _Message) -> bytes:
    """The queue payload of one message."""
    return msgpack.packb(message.model_dump(mode="json"), use_bin_type=True)


def _decode(adapter: TypeAdapter, payload: bytes, side: str):
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise BadMessage(f"{side} is not msgpack: {exc}") from None
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        raise BadMessage(f"bad {side}: {first_error(exc, 'message')}") from None


def decode_operation(payload: bytes
                     ) -> CreateReplica | RestartReplica | DeleteReplica | SetShellKeys:
    """Parse an operation from wrk-ork's queue.

    Raises:
        BadMessage: not an operation; the worker counts it and skips it.
    """
    return _decode(_OPERATION, payload, "operation")


def decode_report(payload: bytes) -> ReplicaReport | RackUpdate:
    """Parse a report from a worker's queue.

    Raises:
        BadMessage: not a report; wrk-ork counts it and skips it.
    """
    return _decode(_REPORT, payload, "report")
