"""Teams' GPU quotas.

A team without a row has no quota (unlimited). Operators set them
(``PUT /api/teams/{team}/quota``); app-node sends them with every job it asks
wrk-ork to create, and wrk-ork checks them against the team's jobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import Invalid
from ..model import TeamQuota
from ._connection import Connection
from ._rows import team_row

__all__ = ["MAX_QUOTA_GPUS", "QUOTAS_SCHEMA", "Quotas", "put_quota"]

#: Table added in schema version 2 (the store creates or migrates it).
QUOTAS_SCHEMA = """
CREATE TABLE team_quotas (
    team TEXT PRIMARY KEY REFERENCES teams(id) ON DELETE CASCADE,
    gpus INTEGER,
    per_user_gpus INTEGER,
    updated_at REAL
);
"""

#: The largest quota accepted: far beyond any cluster, small enough for any integer.
MAX_QUOTA_GPUS = 1_000_000


def _checked(quota: TeamQuota) -> TeamQuota:
    for field in ("gpus", "per_user_gpus"):
        value = getattr(quota, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= MAX_QUOTA_GPUS):
            raise Invalid(field, f"{field}: a whole number of GPUs from 0 to "
                          f"{MAX_QUOTA_GPUS}, or null for no quota")
    return quota


def put_quota(db: Connection, team_id: str, quota: TeamQuota) -> None:
    """Set the team's quota row, inside a write (also used when a team is created)."""
    quota = _checked(quota)
    db.execute(
        "INSERT OR REPLACE INTO team_quotas (team, gpus, per_user_gpus, updated_at) "
        "VALUES (?,?,?,?)", (team_id, quota.gpus, quota.per_user_gpus, quota.updated_at))


class Quotas:
    """Teams' GPU quotas (``store.quotas``). Blocking, thread-safe, each change atomic."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    def get(self, team_id: str) -> TeamQuota:
        """The team's quotas (no row: unlimited). Raises: NotFound (team)."""
        with self._db.read():
            team_row(self._db, team_id)
            row = self._db.one(
                "SELECT gpus, per_user_gpus, updated_at FROM team_quotas WHERE team = ?",
                (team_id,))
        return TeamQuota() if row is None else TeamQuota(*row)

    def of_teams(self, team_ids: list[str]) -> dict[str, TeamQuota]:
        """The quotas of those of ``team_ids`` that have any (the others: unlimited)."""
        if not team_ids:
            return {}
        marks = ",".join("?" * len(team_ids))
        with self._db.read() as db:
            rows = db.execute("SELECT team, gpus, per_user_gpus, updated_at FROM team_quotas "
                              f"WHERE team IN ({marks})", tuple(team_ids)).fetchall()
        return {row[0]: TeamQuota(*row[1:]) for row in rows}

    def set(self, team_id: str, changes: Mapping[str, int | None], *,
            now: float) -> TeamQuota:
        """Change the team's quotas named in ``changes`` (``gpus``, ``per_user_gpus``;
        None: unlimited); the others keep their value. One transaction: two
        operators' changes to different fields do not lose each other's.

        Raises: NotFound (team), Invalid (an unknown field, or not a whole number
        0..MAX_QUOTA_GPUS).
        """
        unknown = set(changes) - {"gpus", "per_user_gpus"}
        if unknown:
            raise Invalid(min(unknown), f"{min(unknown)}: not a quota (gpus, per_user_gpus)")
        with self._db.write():
            team_row(self._db, team_id)
            row = self._db.one("SELECT gpus, per_user_gpus FROM team_quotas WHERE team = ?",
                               (team_id,))
            gpus, per_user_gpus = (None, None) if row is None else row
            quota = TeamQuota(gpus=changes.get("gpus", gpus),
                              per_user_gpus=changes.get("per_user_gpus", per_user_gpus),
                              updated_at=now)
            put_quota(self._db, team_id, quota)
        return quota
