"""The request and response bodies of ``/api`` (pydantic; the OpenAPI schema is built from them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..model import Role, User


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class SignupIn(_In):
    email: str = Field(min_length=3, max_length=254)
    name: str = Field(min_length=1, max_length=100)
    password: str = Field(min_length=1, max_length=1024)
    team_name: str = Field(min_length=1, max_length=64)


class LoginIn(_In):
    email: str = Field(min_length=3, max_length=254)
    password: str = Field(min_length=1, max_length=1024)
    #: The CLI's Ed25519 public key (64 hex) to register on the user.
    cli_public_key: str | None = Field(default=None, pattern=r"^[0-9a-fA-F]{64}$")


class ActiveTeamIn(_In):
    team_id: str = Field(min_length=1, max_length=64)


class TeamIn(_In):
    name: str = Field(min_length=1, max_length=64)


class RoleIn(_In):
    role: Role


class InvitationIn(_In):
    email: str = Field(min_length=3, max_length=254)
    role: Role = Role.MEMBER


class AcceptIn(_In):
    token: str = Field(min_length=1, max_length=200)
    #: Without a bearer session: the new account's email, name and password.
    email: str | None = Field(default=None, max_length=254)
    name: str | None = Field(default=None, max_length=100)
    password: str | None = Field(default=None, max_length=1024)


class ApiKeyIn(_In):
    name: str = Field(min_length=1, max_length=100)
    #: The team the key bills to; the caller's active team if absent.
    team_id: str | None = Field(default=None, max_length=64)
    scopes: list[str] = Field(default_factory=list, max_length=64)


class UserOut(BaseModel):
    id: str
    email: str
    name: str
    cli_public_key: str | None = None
    active_team: str | None = None


class TeamOut(BaseModel):
    id: str
    name: str
    role: Role


class MemberOut(BaseModel):
    user: UserOut
    role: Role


class MembersOut(BaseModel):
    members: list[MemberOut]


class TeamsOut(BaseModel):
    teams: list[TeamOut]


class SessionOut(BaseModel):
    token: str
    #: POSIX seconds.
    expires_at: float
    user: UserOut


class SignupOut(SessionOut):
    team: TeamOut


class MeOut(BaseModel):
    user: UserOut
    teams: list[TeamOut]
    active_team: str | None


class MembershipOut(BaseModel):
    user: str
    team: str
    role: Role


class InvitationOut(BaseModel):
    id: str
    team: str
    email: str
    role: Role
    expires_at: float


class AcceptOut(BaseModel):
    membership: MembershipOut
    #: A session for the account created by accepting (absent when a session was sent).
    session: SessionOut | None = None


class ApiKeyCreatedOut(BaseModel):
    id: str
    #: The secret: shown this once, never again.
    key: str
    prefix: str
    team: str
    name: str


class ApiKeyOut(BaseModel):
    id: str
    team: str
    name: str
    prefix: str
    created_by: str
    created_at: float
    revoked_at: float | None
    #: ms since the epoch, the latest any replica reported; None if never used.
    last_used_ms: int | None


class ApiKeysOut(BaseModel):
    keys: list[ApiKeyOut]


class UsageRowOut(BaseModel):
    day: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    requests: int
    audio_seconds: float


class UsageOut(BaseModel):
    key: str
    rows: list[UsageRowOut]


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorOut(BaseModel):
    error: ErrorBody


def user_out(user: User) -> UserOut:
    return UserOut(id=user.id, email=user.email, name=user.name,
                   cli_public_key=user.cli_public_key, active_team=user.active_team)
