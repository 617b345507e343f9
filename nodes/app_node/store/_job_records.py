"""The records of the jobs wrk-ork accepted for app-node's teams (kept for history
after the job is deleted; wrk-ork holds their state)."""

from __future__ import annotations

from contracts.model import JobSpec

from ..errors import Conflict, Invalid, NotFound
from ..model import JobRecord, Page
from ..model import check_id as _ident
from ._connection import Connection
from ._read_cache import MISS
from ._rows import _JOB, _cursor, _job, _limit, _page, team_row

__all__ = ["KEPT_PAGE", "JobRecords"]

#: The page :meth:`JobRecords.page` keeps (``GET /api/jobs``' default ``limit``).
KEPT_PAGE = 50


class JobRecords:
    """Job records (``store.jobs``). Blocking, thread-safe, each change atomic."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    def add(self, *, id: str, team: str, created_by: str, spec: JobSpec,
            now: float) -> JobRecord:
        """Record a job wrk-ork accepted under ``id``.

        Raises: NotFound (team), Conflict (id reused), Invalid (``spec.team`` is another team).
        """
        _ident("id", id)
        if spec.team != team:
            raise Invalid("team", f"the spec's team {spec.team} is not the job's team {team}")
        record = JobRecord(id=id, team=team, created_by=created_by, name=spec.name, spec=spec,
                           created_at=now)
        with self._db.write() as db:
            team_row(self._db, team)
            if self._db.one("SELECT 1 FROM jobs WHERE id = ?", (id,)) is not None:
                raise Conflict(f"a job {id} exists already")
            db.execute(f"INSERT INTO jobs ({_JOB}) VALUES (?,?,?,?,?,?,?)",
                       (id, team, created_by, spec.name, spec.model_dump_json(), now, None))
        return record

    def get(self, job_id: str) -> JobRecord:
        """The record, deleted or not. Raises: NotFound."""
        with self._db.read():
            row = self._db.one(f"SELECT {_JOB} FROM jobs WHERE id = ?", (job_id,))
            if row is None:
                raise NotFound(f"no job {job_id}")
            return _job(row)

    def page(self, team: str, *, limit: int = 50, cursor: str | None = None,
             include_deleted: bool = False) -> Page[JobRecord]:
        """The team's jobs, newest first, ``limit`` at a time. (The first page of
        :data:`KEPT_PAGE` is kept: ``_read_cache.py``.)"""
        limit, before = _limit(limit), _cursor(cursor)
        # Only the page every listing starts with: a page per cursor and limit would let
        # one member fill the memory with copies of the same records.
        key = ("jobs", team, include_deleted) if before is None and limit == KEPT_PAGE else None
        page = MISS if key is None else self._db.cache.get(key)
        if page is not MISS:
            return page
        where = "" if include_deleted else " AND deleted_at IS NULL"
        with self._db.read() as db:
            rows = db.execute(
                f"SELECT seq, {_JOB} FROM jobs WHERE team = ? AND seq < ?{where} "
                "ORDER BY seq DESC LIMIT ?",
                (team, before if before is not None else 2**62, limit + 1)).fetchall()
            page = _page(rows, limit, _job)
            if key is not None:
                self._db.cache.put(key, page)
        return page

    def mark_deleted(self, job_id: str, *, now: float) -> JobRecord:
        """Mark the record deleted (again: unchanged); it stays for history. Raises: NotFound."""
        with self._db.write() as db:
            if self._db.one("SELECT 1 FROM jobs WHERE id = ?", (job_id,)) is None:
                raise NotFound(f"no job {job_id}")
            db.execute("UPDATE jobs SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL",
                       (now, job_id))
        return self.get(job_id)
