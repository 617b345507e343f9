"""Rows to records, the lookups every repository needs, and the paging helpers."""

from __future__ import annotations

import uuid

from contracts.model import JobSpec

from ..errors import Invalid, NotFound
from ..model import (
    ApiKeyRecord,
    Invitation,
    JobRecord,
    Page,
    Role,
    Team,
    Token,
    TokenKind,
    User,
)
from ._connection import Connection

#: The longest page a listing returns.
MAX_PAGE = 500


def _limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise Invalid("limit", f"limit must be between 1 and {MAX_PAGE}")
    return limit


def _cursor(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    try:
        return int(cursor)
    except ValueError:
        raise Invalid("cursor", "cursor is not one this listing returned; "
                      "start again without it") from None


def _new_id() -> str:
    return uuid.uuid4().hex


# -- rows -> records ------------------------------------------------------------------

_USER = "id, email, name, password_hash, created_at, disabled, cli_public_key, active_team"
_INVITATION = ("id, team, email, role, token_hash, invited_by, created_at, expires_at, "
               "accepted_at, accepted_by")
_TOKEN = "token_hash, user, kind, created_at, expires_at, revoked_at"
_API_KEY = "id, team, name, prefix, created_by, created_at, revoked_at"
_JOB = "id, team, created_by, name, spec, created_at, deleted_at"


def _user(row: tuple) -> User:
    (id_, email, name, password_hash, created_at, disabled, cli_key, active) = row
    return User(id=id_, email=email, name=name, password_hash=password_hash,
                created_at=created_at, disabled=bool(disabled), cli_public_key=cli_key,
                active_team=active)


def _invitation(row: tuple) -> Invitation:
    (id_, team, email, role, token_hash, invited_by, created_at, expires_at,
     accepted_at, accepted_by) = row
    return Invitation(id=id_, team=team, email=email, role=Role(role), token_hash=token_hash,
                      invited_by=invited_by, created_at=created_at, expires_at=expires_at,
                      accepted_at=accepted_at, accepted_by=accepted_by)


def _token(row: tuple) -> Token:
    token_hash, user, kind, created_at, expires_at, revoked_at = row
    return Token(token_hash=token_hash, user=user, kind=TokenKind(kind),
                 created_at=created_at, expires_at=expires_at, revoked_at=revoked_at)


def _api_key(row: tuple) -> ApiKeyRecord:
    id_, team, name, prefix, created_by, created_at, revoked_at = row
    return ApiKeyRecord(id=id_, team=team, name=name, prefix=prefix, created_by=created_by,
                        created_at=created_at, revoked_at=revoked_at)


#: Specs parsed lately, by their stored JSON (a job's spec never changes): a page of
#: 50 jobs parsed 50 specs per listing, a tenth of its CPU. Bounded: cleared when full.
_SPECS: dict[str, JobSpec] = {}
MAX_CACHED_SPECS = 4096


def _spec(text: str) -> JobSpec:
    spec = _SPECS.get(text)
    if spec is None:
        spec = JobSpec.model_validate_json(text)
        if len(_SPECS) >= MAX_CACHED_SPECS:
            _SPECS.clear()
        _SPECS[text] = spec
    return spec


def _job(row: tuple) -> JobRecord:
    id_, team, created_by, name, spec, created_at, deleted_at = row
    return JobRecord(id=id_, team=team, created_by=created_by, name=name,
                     spec=_spec(spec), created_at=created_at, deleted_at=deleted_at)


def _page(rows: list, limit: int, make) -> Page:
    """Rows are (position, *columns), one more than ``limit`` if another page follows."""
    items = tuple(make(row[1:]) for row in rows[:limit])
    more = len(rows) > limit
    return Page(items=items, next=str(rows[limit - 1][0]) if more else None)


# -- lookups inside a read or a write ---------------------------------------------------


def user_row(db: Connection, user_id: str) -> User:
    """Raises: NotFound."""
    row = db.one(f"SELECT {_USER} FROM users WHERE id = ?", (user_id,))
    if row is None:
        raise NotFound(f"no user {user_id}")
    return _user(row)


def team_row(db: Connection, team_id: str) -> Team:
    """Raises: NotFound."""
    row = db.one("SELECT id, name, created_at FROM teams WHERE id = ?", (team_id,))
    if row is None:
        raise NotFound(f"no team {team_id}")
    return Team(*row)
