"""GPU quotas: what a team's (or one member's) jobs count against them, and the check.

Theory of operation
-------------------
app-node keeps each team's quotas (operators set them) and sends them with
every ``jobs.create``, with the id of the user who asks; wrk-ork checks them in
:meth:`~nodes.ork.orchestrator.Orchestrator.create_job`, in the same
synchronous call that adds the job. Calls into the orchestrator run one at a
time, so two creates racing at the edge of a quota cannot both pass: the
second one counts the first.

A job counts ``spec.gpus`` for each replica that holds GPUs now or may take
them without a new create:

- a replica whose GPUs are claimed (placed, running, failed on its rack,
  being deleted: claimed until its worker reports it deleted);
- any other replica of a job that is neither being deleted nor unplaceable:
  a Queued or Pending one is placed as soon as GPUs free, and one its worker
  removed on its own is created again by a restart.

So a Pending job counts (it takes GPUs the moment they free), a Failed job
counts until it is deleted (its GPUs are still claimed, or a restart claims
them again), a job being deleted counts until its GPUs are released, and a
job that can never fit (Failed, unplaceable) counts nothing.

Nothing here reads a clock, a file or a socket.
"""

from __future__ import annotations

from collections.abc import Iterable

from contracts.model import JobSpec

from .errors import QuotaExceeded
from .store import JobRecord

__all__ = ["check_gpu_quota", "gpus_counted", "gpus_requested"]


def gpus_requested(spec: JobSpec) -> int:
    """What a new job asks for: its GPUs per replica times its replicas."""
    return spec.gpus * spec.replicas


def gpus_counted(job: JobRecord) -> int:
    """The GPUs ``job`` holds or may hold (see the module's rules)."""
    may_place = not (job.deleting or job.unplaceable)
    return sum(job.spec.gpus for replica in job.replicas.values()
               if replica.claimed or may_place)


def check_gpu_quota(jobs: Iterable[JobRecord], spec: JobSpec, *, owner: str | None,
                    team_gpus: int | None, user_gpus: int | None) -> None:
    """Refuse ``spec`` if it takes its team past ``team_gpus``, or ``owner`` past
    ``user_gpus`` (their jobs in that team); None: no such quota.

    Raises:
        QuotaExceeded: naming the quota, the GPUs counted against it and the request.
    """
    if team_gpus is None and (user_gpus is None or owner is None):
        return
    requested = gpus_requested(spec)
    team_use = user_use = 0
    for job in jobs:
        if job.spec.team != spec.team:
            continue
        counted = gpus_counted(job)
        team_use += counted
        if owner is not None and job.owner == owner:
            user_use += counted
    if team_gpus is not None and team_use + requested > team_gpus:
        raise QuotaExceeded(
            f"team {spec.team}'s GPU quota is {team_gpus}: its jobs hold or may hold "
            f"{team_use} GPUs and this job asks for {requested}; delete a job (Pending "
            "and Failed ones count until deleted) or ask a platform operator to raise "
            "the quota", scope="team", quota=team_gpus, in_use=team_use,
            requested=requested)
    if user_gpus is not None and owner is not None and user_use + requested > user_gpus:
        raise QuotaExceeded(
            f"each member of team {spec.team} may have jobs of at most {user_gpus} GPUs; "
            f"yours hold or may hold {user_use} and this job asks for {requested}; delete "
            "one of your jobs or ask a platform operator to raise the per-user quota",
            scope="user", quota=user_gpus, in_use=user_use, requested=requested)
