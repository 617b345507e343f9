"""A job as the API shows it (:func:`job_out`), and the listing's JSON of each job
kept between requests while nothing it shows changed (:class:`JobDocuments`).

A page of 50 jobs built 50 ``JobOut`` models and serialised them on every
``GET /api/jobs``: about half of the listing's CPU once its live statuses came
from app-node's copy of wrk-ork's jobs. Those copies change rarely (a view is
replaced, never mutated, when wrk-ork reports a change), so each job's JSON is
kept with what it was made of and made again only when any part differs: the
view (the same object: compared by identity), the record's fields (its spec is
the same object while the store's spec cache holds it) and wrk-monitor's facts.
"""

from __future__ import annotations

from typing import Any

from contracts.model import api_status
from contracts.ork import JobView

from ..model import JobRecord
from ._models import JobOut, ReplicaOut

__all__ = ["MAX_DOCUMENTS", "JobDocuments", "job_out"]

#: Jobs whose JSON is kept; past it the cache starts again empty (a listing then
#: costs what it did without one, once).
MAX_DOCUMENTS = 10_000


def job_out(record: JobRecord, view: JobView, model_health: str | None = None,
            agents_heard_at: float | None = None) -> JobOut:
    """A job as the API shows it: the record's who/when with wrk-ork's live status
    (and, where known, wrk-monitor's model health and when its agents were heard)."""
    # Built without validation: every part was validated where it came from (the
    # record by the store, the view by the RPC layer), and validating a page of
    # JobSpecs again was a sixth of a listing's CPU.
    replicas = [ReplicaOut.model_construct(
        index=r.index, status=r.status.value.replace("active", "running"),
        generation=r.generation, message=r.message, agents=list(r.agents),
        nodes=[s.node for s in r.placement.shares] if r.placement else [])
        for r in view.replicas]
    return JobOut.model_construct(
        id=view.id, team=record.team, name=record.name, type=view.spec.type.value,
        status=api_status(view.status), reason=view.reason, created_by=record.created_by,
        created_at=record.created_at, deleted_at=record.deleted_at, rack=view.rack,
        replicas=replicas, spec=record.spec, model_health=model_health,
        agents_heard_at=agents_heard_at)


class JobDocuments:
    """Each job's JSON (``JobOut``) by id, with what it was made of (module doc).

    Not thread-safe: the routes call it from trio's thread only.
    """

    def __init__(self, max_documents: int = MAX_DOCUMENTS) -> None:
        self.max_documents = max_documents
        self._documents: dict[str, tuple[tuple[Any, ...], bytes]] = {}
        #: Counters (tests): documents served from the cache, and made.
        self.hits = self.made = 0

    def json(self, record: JobRecord, view: JobView, model_health: str | None = None,
             agents_heard_at: float | None = None) -> bytes:
        """``job_out(...)`` as JSON bytes, the kept ones while nothing changed."""
        parts = (view, record.spec, record.team, record.name, record.created_by,
                 record.created_at, record.deleted_at, model_health, agents_heard_at)
        kept = self._documents.get(record.id)
        if kept is not None:
            was, document = kept
            if was[0] is view and was[1] is record.spec and was[2:] == parts[2:]:
                self.hits += 1
                return document
        document = job_out(record, view, model_health, agents_heard_at).model_dump_json(
            ).encode()
        if len(self._documents) >= self.max_documents:
            self._documents.clear()
        self._documents[record.id] = (parts, document)
        self.made += 1
        return document
