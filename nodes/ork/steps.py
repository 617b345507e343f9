"""The System log line of each job status change: what a user reads in the job's logs.

wrk-ork logs one line per :class:`~contracts.ork.JobEvent` (in
:meth:`~nodes.ork.service.OrkService.pump`), with ``extra={"job_id": ...}`` so
that, with telemetry on, wrk-monitor files it under the job. The line reads
as a sentence first and ends in the machine fields bench/job_start.py looks
for (``ork.job_status job=<id> status=<s> previous=<p> at=<seconds>``: ``at``
last)::

    pending: no free GPUs: ... | ork.job_status job=j-1 status=pending previous=queued at=...

Pure: :func:`step_line` takes the event and the job as it is now (for where
it was placed) and returns the level and the text.
"""

from __future__ import annotations

import logging

from contracts.model import JobStatus, ReplicaPlacement
from contracts.ork import JobEvent, JobView

__all__ = ["nodes_text", "placement_text", "step_line"]

#: Statuses a user must look at: their lines are warnings (Failed: an error).
_LEVELS = {JobStatus.FAILED: logging.ERROR, JobStatus.UNKNOWN: logging.WARNING,
           JobStatus.DEGRADED: logging.WARNING}


def nodes_text(placement: ReplicaPlacement) -> str:
    """``node n1 (2 GPUs)``; every node of a multi-node replica, comma-separated."""
    return ", ".join(f"node {share.node} ({share.gpus} GPU{'s' if share.gpus != 1 else ''})"
                     for share in placement.shares)


def placement_text(placement: ReplicaPlacement) -> str:
    """``rack 1a2b3c4d5e6f… node n1 (2 GPUs)``."""
    return f"rack {placement.rack[:12]}… {nodes_text(placement)}"


def _created(job: JobView | None) -> str:
    if job is None:
        return "created"
    spec = job.spec
    return (f"created: {spec.type.value} job {spec.name!r} of team {spec.team}, "
            f"{spec.replicas} replica(s) of {spec.gpus} GPU(s) in location {spec.location}; "
            "spec validated")


def _placed(job: JobView | None) -> str:
    if job is None:
        return "starting: GPUs claimed"
    placed = [f"replica {replica.index} placed on {placement_text(replica.placement)}"
              for replica in job.replicas if replica.placement is not None]
    return "starting: " + ("; ".join(placed) if placed else "GPUs claimed") + \
        "; creating its VMIs"


def _detail(event: JobEvent, job: JobView | None) -> str:
    status, previous, reason = event.status, event.previous, event.reason
    if status is None:
        return "deleted" + (f" ({reason})" if reason and reason != "deleted" else "")
    if status is JobStatus.CREATING and previous is None:
        return _created(job)
    if status is JobStatus.QUEUED:
        if previous is JobStatus.PENDING:
            return f"queued again: {reason or 'capacity freed'}; placing it"
        return "queued: looking for free GPUs"
    if status is JobStatus.PENDING:
        return f"pending: {reason}" if reason else "pending: no free GPUs; placed when some are"
    if status is JobStatus.STARTING and previous in (JobStatus.QUEUED, JobStatus.PENDING):
        return _placed(job)
    text = status.value
    if status is JobStatus.ACTIVE:
        text = "active: every replica's agent is ready"
    elif status is JobStatus.RESTARTING:
        text = "restarting: replacing its VMIs, keeping storage"
    elif status is JobStatus.DELETING:
        text = "deleting: waiting for the worker to remove every replica"
    if reason and status is not JobStatus.ACTIVE:
        text += f": {reason}" if ":" not in text else f" ({reason})"
    return text


def step_line(event: JobEvent, job: JobView | None) -> tuple[int, str]:
    """The level and text of ``event``'s System line; ``job`` is the job now (None: gone)."""
    level = logging.INFO if event.status is None else _LEVELS.get(event.status, logging.INFO)
    text = (f"{_detail(event, job)} | ork.job_status job={event.job_id} status={event.status} "
            f"previous={event.previous} at={event.at:.6f}")
    return level, text
