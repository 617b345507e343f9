"""app-node's store, second half: invitations, tokens, API key records, job
records (the first half, users, teams and memberships, and the file itself,
is store.py; the transaction rules in its docstring hold here too)."""

from __future__ import annotations

from contracts.model import JobSpec

from ._rows import (
    _API_KEY,
    _INVITATION,
    _JOB,
    _TOKEN,
    _api_key,
    _cursor,
    _invitation,
    _job,
    _limit,
    _new_id,
    _page,
    _token,
)
from .errors import Conflict, Expired, Invalid, NotFound, WrongAccount
from .model import ApiKeyRecord, Invitation, JobRecord, Membership, Page, Role, Token, TokenKind
from .model import check_id as _ident
from .model import check_text as _text
from .model import normal_email as _email
from .model import parse_role as _role


class RecordsMixin:
    """The methods of :class:`~nodes.app_node.store.Store` for the records below."""

    # -- invitations ------------------------------------------------------------------

    def create_invitation(self, *, team: str, email: str, role: Role | str, token_hash: str,
                          invited_by: str, now: float, expires_at: float) -> Invitation:
        """Record an invitation whose secret token (hashed here) is emailed to ``email``.

        Raises: NotFound (team), Conflict (token hash reused), Invalid.
        """
        role, email = _role(role), _email(email)
        if not token_hash:
            raise Invalid("token_hash", "token_hash is empty")
        if expires_at <= now:
            raise Invalid("expires_at", "expires_at must be after now")
        invitation = Invitation(id=_new_id(), team=team, email=email, role=role,
                                token_hash=token_hash, invited_by=invited_by,
                                created_at=now, expires_at=expires_at)
        with self._write() as db:
            self._team_row(team)
            if self._one("SELECT 1 FROM invitations WHERE token_hash = ?",
                         (token_hash,)) is not None:
                raise Conflict("that invitation token is in use already; make a new one")
            db.execute(f"INSERT INTO invitations ({_INVITATION}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (invitation.id, team, email, role.value, token_hash, invited_by, now,
                        expires_at, None, None))
        return invitation

    def accept_invitation(self, token_hash: str, user_id: str, *, now: float,
                          email: str | None = None) -> Membership:
        """Join the invitation's team with its role and mark it used, atomically.

        ``email``: the accepting account's address; if given it must be the invited
        one (checked after expiry and use, so a used link says so whoever holds it).

        Raises:
            NotFound: no such invitation (or revoked), or no such user.
            Expired: it is past ``expires_at`` or was accepted already.
            Conflict: the user is a member of that team already.
            WrongAccount: ``email`` is not the address the invitation was sent to.
        """
        with self._write() as db:
            invitation = self._pending(token_hash, now)
            if email is not None and email.strip().lower() != invitation.email:
                raise WrongAccount("this invitation was sent to another email address; "
                                   "accept it as the account with that address (or create "
                                   "the account with that address)")
            membership = self._insert_member(invitation.team, user_id, invitation.role)
            db.execute("UPDATE invitations SET accepted_at = ?, accepted_by = ? WHERE id = ?",
                       (now, user_id, invitation.id))
        return membership

    def get_invitation(self, invitation_id: str) -> Invitation:
        """Raises: NotFound."""
        with self._read():
            row = self._one(f"SELECT {_INVITATION} FROM invitations WHERE id = ?",
                            (invitation_id,))
        if row is None:
            raise NotFound(f"no invitation {invitation_id}")
        return _invitation(row)

    def pending_invitation(self, token_hash: str, *, now: float) -> Invitation:
        """The invitation of ``token_hash`` if it may still be accepted (nothing changed).

        Raises: NotFound (no such token, or revoked); Expired (used, or past its time):
        the checks :meth:`accept_invitation` makes first.
        """
        with self._read():
            return self._pending(token_hash, now)

    def _pending(self, token_hash: str, now: float) -> Invitation:
        row = self._one(f"SELECT {_INVITATION} FROM invitations WHERE token_hash = ?",
                        (token_hash,))
        if row is None:
            raise NotFound("no such invitation; it may have been revoked, ask for a new one")
        invitation = _invitation(row)
        if invitation.accepted_at is not None:
            raise Expired("this invitation was used already; ask for a new one")
        if now >= invitation.expires_at:
            raise Expired("this invitation has expired; ask for a new one")
        return invitation

    def list_invitations(self, team: str, *, pending_at: float | None = None) -> list[Invitation]:
        """The team's invitations, oldest first; with ``pending_at``, only those neither
        accepted nor expired at that time."""
        with self._read() as db:
            rows = db.execute(f"SELECT {_INVITATION} FROM invitations WHERE team = ? "
                              "ORDER BY created_at, id", (team,)).fetchall()
            invitations = [_invitation(row) for row in rows]
        if pending_at is not None:
            invitations = [i for i in invitations
                           if i.accepted_at is None and pending_at < i.expires_at]
        return invitations

    def revoke_invitation(self, invitation_id: str) -> None:
        """Withdraw a pending invitation (its token stops working).

        Raises: NotFound; Conflict (it was accepted already: remove the member instead).
        """
        with self._write() as db:
            row = self._one("SELECT accepted_at FROM invitations WHERE id = ?",
                            (invitation_id,))
            if row is None:
                raise NotFound(f"no invitation {invitation_id}")
            if row[0] is not None:
                raise Conflict("the invitation was accepted already; remove the member instead")
            db.execute("DELETE FROM invitations WHERE id = ?", (invitation_id,))

    # -- tokens -----------------------------------------------------------------------

    def add_token(self, *, token_hash: str, user: str, kind: TokenKind | str,
                  now: float, expires_at: float) -> Token:
        """Raises: NotFound (user), Conflict (hash reused), Invalid."""
        try:
            kind = TokenKind(kind)
        except ValueError:
            raise Invalid("kind", f"kind {kind!r} is not session or reset") from None
        if not token_hash:
            raise Invalid("token_hash", "token_hash is empty")
        if expires_at <= now:
            raise Invalid("expires_at", "expires_at must be after now")
        token = Token(token_hash=token_hash, user=user, kind=kind, created_at=now,
                      expires_at=expires_at)
        with self._write() as db:
            self._user_row(user)
            if self._one("SELECT 1 FROM tokens WHERE token_hash = ?", (token_hash,)):
                raise Conflict("that token is in use already; make a new one")
            db.execute(f"INSERT INTO tokens ({_TOKEN}) VALUES (?,?,?,?,?,?)",
                       (token_hash, user, kind.value, now, expires_at, None))
        return token

    def valid_token(self, token_hash: str, *, now: float,
                    kind: TokenKind = TokenKind.SESSION) -> Token:
        """The token of that hash and kind if it works at ``now``.

        Raises: NotFound (no such token), Expired (expired, revoked, or its user disabled).
        """
        with self._read():
            return self._valid_token(token_hash, kind, now)

    def _valid_token(self, token_hash: str, kind: TokenKind, now: float) -> Token:
        row = self._one(f"SELECT {_TOKEN} FROM tokens WHERE token_hash = ? AND kind = ?",
                        (token_hash, kind.value))
        if row is None:
            raise NotFound("no such token; log in again")
        token = _token(row)
        if token.revoked_at is not None:
            raise Expired("this token was revoked; log in again")
        if now >= token.expires_at:
            raise Expired("this token has expired; log in again")
        if self._user_row(token.user).disabled:
            raise Expired("this account is disabled; ask an admin")
        return token

    def revoke_token(self, token_hash: str, *, now: float) -> None:
        """Revoke one token (logout); revoking it again changes nothing. Raises: NotFound."""
        with self._write() as db:
            if self._one("SELECT 1 FROM tokens WHERE token_hash = ?", (token_hash,)) is None:
                raise NotFound("no such token")
            db.execute("UPDATE tokens SET revoked_at = ? "
                       "WHERE token_hash = ? AND revoked_at IS NULL", (now, token_hash))

    def revoke_user_tokens(self, user_id: str, *, now: float) -> int:
        """Revoke every live token of the user (log out everywhere); returns how many."""
        with self._write() as db:
            return db.execute("UPDATE tokens SET revoked_at = ? "
                              "WHERE user = ? AND revoked_at IS NULL", (now, user_id)).rowcount

    # -- API key records ----------------------------------------------------------------

    def add_api_key(self, *, id: str, team: str, name: str, prefix: str, created_by: str,
                    now: float) -> ApiKeyRecord:
        """Record a key app-node created in the shared database (under the same ``id``).

        Raises: NotFound (team), Conflict (id reused), Invalid.
        """
        record = ApiKeyRecord(id=_ident("id", id), team=team, name=_text("name", name, 100),
                              prefix=_text("prefix", prefix, 32), created_by=created_by,
                              created_at=now)
        with self._write() as db:
            self._team_row(team)
            if self._one("SELECT 1 FROM api_keys WHERE id = ?", (id,)) is not None:
                raise Conflict(f"an API key {id} exists already")
            db.execute(f"INSERT INTO api_keys ({_API_KEY}) VALUES (?,?,?,?,?,?,?)",
                       (record.id, team, record.name, record.prefix, created_by, now, None))
        return record

    def get_api_key(self, key_id: str) -> ApiKeyRecord:
        """Raises: NotFound."""
        with self._read():
            row = self._one(f"SELECT {_API_KEY} FROM api_keys WHERE id = ?", (key_id,))
        if row is None:
            raise NotFound(f"no API key {key_id}")
        return _api_key(row)

    def list_api_keys(self, team: str, *, include_revoked: bool = True) -> list[ApiKeyRecord]:
        """The team's keys, oldest first."""
        where = "" if include_revoked else " AND revoked_at IS NULL"
        with self._read() as db:
            return [_api_key(row) for row in db.execute(
                f"SELECT {_API_KEY} FROM api_keys WHERE team = ?{where} "
                "ORDER BY created_at, id", (team,))]

    def revoke_api_key(self, key_id: str, *, now: float) -> ApiKeyRecord:
        """Mark it revoked (again: unchanged). Raises: NotFound."""
        with self._write() as db:
            if self._one("SELECT 1 FROM api_keys WHERE id = ?", (key_id,)) is None:
                raise NotFound(f"no API key {key_id}")
            db.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                       (now, key_id))
        return self.get_api_key(key_id)

    # -- job records --------------------------------------------------------------------

    def add_job(self, *, id: str, team: str, created_by: str, spec: JobSpec,
                now: float) -> JobRecord:
        """Record a job wrk-ork accepted under ``id``.

        Raises: NotFound (team), Conflict (id reused), Invalid (``spec.team`` is another team).
        """
        _ident("id", id)
        if spec.team != team:
            raise Invalid("team", f"the spec's team {spec.team} is not the job's team {team}")
        record = JobRecord(id=id, team=team, created_by=created_by, name=spec.name, spec=spec,
                           created_at=now)
        with self._write() as db:
            self._team_row(team)
            if self._one("SELECT 1 FROM jobs WHERE id = ?", (id,)) is not None:
                raise Conflict(f"a job {id} exists already")
            db.execute(f"INSERT INTO jobs ({_JOB}) VALUES (?,?,?,?,?,?,?)",
                       (id, team, created_by, spec.name, spec.model_dump_json(), now, None))
        return record

    def get_job(self, job_id: str) -> JobRecord:
        """The record, deleted or not. Raises: NotFound."""
        with self._read():
            row = self._one(f"SELECT {_JOB} FROM jobs WHERE id = ?", (job_id,))
            if row is None:
                raise NotFound(f"no job {job_id}")
            return _job(row)

    def list_jobs(self, team: str, *, limit: int = 50, cursor: str | None = None,
                  include_deleted: bool = False) -> Page[JobRecord]:
        """The team's jobs, newest first, ``limit`` at a time."""
        limit, before = _limit(limit), _cursor(cursor)
        where = "" if include_deleted else " AND deleted_at IS NULL"
        with self._read() as db:
            rows = db.execute(
                f"SELECT seq, {_JOB} FROM jobs WHERE team = ? AND seq < ?{where} "
                "ORDER BY seq DESC LIMIT ?",
                (team, before if before is not None else 2**62, limit + 1)).fetchall()
            return _page(rows, limit, _job)

    def mark_job_deleted(self, job_id: str, *, now: float) -> JobRecord:
        """Mark the record deleted (again: unchanged); it stays for history. Raises: NotFound."""
        with self._write() as db:
            if self._one("SELECT 1 FROM jobs WHERE id = ?", (job_id,)) is None:
                raise NotFound(f"no job {job_id}")
            db.execute("UPDATE jobs SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL",
                       (now, job_id))
        return self.get_job(job_id)
