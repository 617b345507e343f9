"""What wrk-ork shows of its jobs and racks: the views its core returns and
its RPC service sends (pydantic, frozen: validated where they are made)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from contracts.model import JobSpec, JobStatus, ReplicaPlacement

from .status import ReplicaStatus

__all__ = ["JobEvent", "JobView", "RackInfo", "ReplicaView"]


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplicaView(_View):
    """One replica as app-node shows it."""

    index: int
    status: ReplicaStatus
    #: Restarts so far; the worker's reports about older generations are ignored.
    generation: int
    placement: ReplicaPlacement | None
    #: The worker's latest System log line about it.
    message: str
    #: Public keys (hex) of its agents by node rank, once they said hello: the
    #: keys proxy-inference accepts for this replica.
    agents: tuple[str, ...] = ()


class JobView(_View):
    """One job as app-node shows it."""

    id: str
    spec: JobSpec
    status: JobStatus
    #: Why it has this status, when that needs saying (Failed, Pending, Unknown).
    reason: str
    created_at: float
    updated_at: float
    #: The rack its replicas run on, once placed.
    rack: str | None
    replicas: tuple[ReplicaView, ...]


class JobEvent(_View):
    """A job's status changed; ``status`` None means the job is gone."""

    job_id: str
    team: str
    status: JobStatus | None
    previous: JobStatus | None
    reason: str
    at: float


class RackInfo(_View):
    """A registered rack with its capacity and whether it is silent."""

    key: str
    location: str
    name: str | None
    registered_at: float
    #: The worker has sent its capacity at least once.
    reported: bool
    #: Nothing heard from it for ``unknown_after_s``: its jobs are Unknown.
    silent: bool
    nodes: int
    gpus: int
    free: int
    overlay_network: bool
    #: Jobs with replicas placed on it.
    jobs: int
    #: When its worker last reported since wrk-ork started (None: not yet).
    last_report_at: float | None = None
