"""Records of app-node's own SQLite file (:mod:`nodes.app_node.store`).

They are frozen: the store returns a fresh record after every change, so a
caller never holds a half-updated one. Times are POSIX seconds (floats) that
the caller passes in as ``now``, which keeps the store free of clocks.

Secrets never appear here: ``password_hash`` is the opaque string auth makes,
tokens and invitations are kept by the hash of their secret, and an API key
record has only the ``prefix`` shown in listings (the hashed secret lives in
the shared database that proxy-inference reads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from contracts.model import JobSpec

from .errors import Invalid

__all__ = ["ApiKeyRecord", "Invitation", "JobRecord", "Membership", "Page", "Role", "Team",
           "TeamQuota", "Token", "TokenKind", "User", "check_id", "check_text",
           "normal_email", "parse_role"]


class Role(StrEnum):
    """A member's role in a team; owners ⊇ admins ⊇ members in what they may do."""

    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"


class TokenKind(StrEnum):
    """A login session's bearer token, or a one-time password-reset token."""

    SESSION = "session"
    RESET = "reset"


@dataclass(frozen=True, slots=True)
class User:
    id: str
    #: Stored lowercased; unique.
    email: str
    name: str
    password_hash: str
    created_at: float
    disabled: bool = False
    #: The public key (64 hex) the user's CLI registered at login; shells use it.
    cli_public_key: str | None = None
    #: The team new jobs and keys belong to; None until the user joins one.
    active_team: str | None = None


@dataclass(frozen=True, slots=True)
class Team:
    id: str
    #: Unique, case-insensitively.
    name: str
    created_at: float


@dataclass(frozen=True, slots=True)
class TeamQuota:
    """A team's GPU quotas (operators set them); None: unlimited."""

    #: GPUs the team's jobs may hold or wait for, every replica counted.
    gpus: int | None = None
    #: The same for the jobs each member created in the team.
    per_user_gpus: int | None = None
    #: When an operator last set them (None: never; the team's creation default).
    updated_at: float | None = None


@dataclass(frozen=True, slots=True)
class Membership:
    user: str
    team: str
    role: Role


@dataclass(frozen=True, slots=True)
class Invitation:
    id: str
    team: str
    #: Stored lowercased; whoever accepts with the token joins (the email is
    #: where the token was sent).
    email: str
    role: Role
    token_hash: str
    invited_by: str
    created_at: float
    expires_at: float
    accepted_at: float | None = None
    #: The user who accepted it.
    accepted_by: str | None = None


@dataclass(frozen=True, slots=True)
class Token:
    token_hash: str
    user: str
    kind: TokenKind
    created_at: float
    expires_at: float
    revoked_at: float | None = None

    def valid_at(self, now: float) -> bool:
        return self.revoked_at is None and now < self.expires_at


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """app-node's listing entry for a key whose hashed secret is in the shared database."""

    id: str
    team: str
    name: str
    #: The first characters of the secret, shown so users can tell keys apart.
    prefix: str
    created_by: str
    created_at: float
    revoked_at: float | None = None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What app-node remembers of a job: enough to list a team's jobs and to duplicate one
    without asking wrk-ork (the live status comes from wrk-ork)."""

    #: wrk-ork's job id.
    id: str
    team: str
    created_by: str
    name: str
    spec: JobSpec
    created_at: float
    deleted_at: float | None = None


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing; pass ``next`` back as ``cursor`` for the following one
    (None: this was the last page)."""

    items: tuple[T, ...]
    next: str | None


# -- validation (the store's, and the API's before it hashes or emails anything) -------

_EMAIL = re.compile(r"^[^@\s]{1,64}@[^@\s]{1,253}$")
_TEXT = re.compile(r"^[^\x00-\x1f\x7f]+$")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def normal_email(value: str) -> str:
    """``value`` trimmed and lowercased. Raises: Invalid (field ``email``)."""
    value = value.strip().lower()
    if len(value) > 254 or not _EMAIL.match(value):
        raise Invalid("email", f"email {value!r} is not an address like name@example.com")
    return value


def check_text(field: str, value: str, limit: int) -> str:
    """A trimmed name of 1 to ``limit`` printable characters. Raises: Invalid (``field``)."""
    value = value.strip()
    if not 1 <= len(value) <= limit or not _TEXT.match(value):
        raise Invalid(field, f"{field} must be 1 to {limit} printable characters")
    return value


def parse_role(value: Role | str) -> Role:
    """Raises: Invalid (field ``role``)."""
    try:
        return Role(value)
    except ValueError:
        raise Invalid("role", f"role {value!r} is not one of owner, admin, member") from None


def check_id(field: str, value: str) -> str:
    """An id from elsewhere (wrk-ork's job id, a key id). Raises: Invalid (``field``)."""
    if not _ID.match(value):
        raise Invalid(field, f"{field} {value!r} must be 1 to 64 letters, digits, '_', '.', '-'")
    return value
