"""The records of the API keys app-node created in the shared database (the keys
themselves live there; here: who made them, for which team, and revocation)."""

from __future__ import annotations

from ..errors import Conflict, NotFound
from ..model import ApiKeyRecord
from ..model import check_id as _ident
from ..model import check_text as _text
from ._connection import Connection
from ._rows import _API_KEY, _api_key, team_row

__all__ = ["ApiKeys"]


class ApiKeys:
    """API key records (``store.api_keys``). Blocking, thread-safe, each change atomic."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    def add(self, *, id: str, team: str, name: str, prefix: str, created_by: str,
            now: float) -> ApiKeyRecord:
        """Record a key app-node created in the shared database (under the same ``id``).

        Raises: NotFound (team), Conflict (id reused), Invalid.
        """
        record = ApiKeyRecord(id=_ident("id", id), team=team, name=_text("name", name, 100),
                              prefix=_text("prefix", prefix, 32), created_by=created_by,
                              created_at=now)
        with self._db.write() as db:
            team_row(self._db, team)
            if self._db.one("SELECT 1 FROM api_keys WHERE id = ?", (id,)) is not None:
                raise Conflict(f"an API key {id} exists already")
            db.execute(f"INSERT INTO api_keys ({_API_KEY}) VALUES (?,?,?,?,?,?,?)",
                       (record.id, team, record.name, record.prefix, created_by, now, None))
        return record

    def get(self, key_id: str) -> ApiKeyRecord:
        """Raises: NotFound."""
        with self._db.read():
            row = self._db.one(f"SELECT {_API_KEY} FROM api_keys WHERE id = ?", (key_id,))
        if row is None:
            raise NotFound(f"no API key {key_id}")
        return _api_key(row)

    def of_team(self, team: str, *, include_revoked: bool = True) -> list[ApiKeyRecord]:
        """The team's keys, oldest first."""
        where = "" if include_revoked else " AND revoked_at IS NULL"
        with self._db.read() as db:
            return [_api_key(row) for row in db.execute(
                f"SELECT {_API_KEY} FROM api_keys WHERE team = ?{where} "
                "ORDER BY created_at, id", (team,))]

    def revoke(self, key_id: str, *, now: float) -> ApiKeyRecord:
        """Mark it revoked (again: unchanged). Raises: NotFound."""
        with self._db.write() as db:
            if self._db.one("SELECT 1 FROM api_keys WHERE id = ?", (key_id,)) is None:
                raise NotFound(f"no API key {key_id}")
            db.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                       (now, key_id))
        return self.get(key_id)
