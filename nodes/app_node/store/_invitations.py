"""Invitations to join a team, accepted with the secret token emailed (stored hashed)."""

from __future__ import annotations

from ..errors import Conflict, Expired, Invalid, NotFound, WrongAccount
from ..model import Invitation, Membership, Role
from ..model import normal_email as _email
from ..model import parse_role as _role
from ._connection import Connection
from ._rows import _INVITATION, _invitation, _new_id, team_row
from ._teams import insert_member

__all__ = ["Invitations"]


class Invitations:
    """Invitations (``store.invitations``). Blocking, thread-safe, each change atomic."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    def create(self, *, team: str, email: str, role: Role | str, token_hash: str,
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
        with self._db.write() as db:
            team_row(self._db, team)
            if self._db.one("SELECT 1 FROM invitations WHERE token_hash = ?",
                            (token_hash,)) is not None:
                raise Conflict("that invitation token is in use already; make a new one")
            db.execute(f"INSERT INTO invitations ({_INVITATION}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (invitation.id, team, email, role.value, token_hash, invited_by, now,
                        expires_at, None, None))
        return invitation

    def accept(self, token_hash: str, user_id: str, *, now: float,
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
        with self._db.write() as db:
            invitation = self._pending(token_hash, now)
            if email is not None and email.strip().lower() != invitation.email:
                raise WrongAccount("this invitation was sent to another email address; "
                                   "accept it as the account with that address (or create "
                                   "the account with that address)")
            membership = insert_member(self._db, invitation.team, user_id, invitation.role)
            db.execute("UPDATE invitations SET accepted_at = ?, accepted_by = ? WHERE id = ?",
                       (now, user_id, invitation.id))
        return membership

    def get(self, invitation_id: str) -> Invitation:
        """Raises: NotFound."""
        with self._db.read():
            row = self._db.one(f"SELECT {_INVITATION} FROM invitations WHERE id = ?",
                               (invitation_id,))
        if row is None:
            raise NotFound(f"no invitation {invitation_id}")
        return _invitation(row)

    def pending(self, token_hash: str, *, now: float) -> Invitation:
        """The invitation of ``token_hash`` if it may still be accepted (nothing changed).

        Raises: NotFound (no such token, or revoked); Expired (used, or past its time):
        the checks :meth:`accept` makes first.
        """
        with self._db.read():
            return self._pending(token_hash, now)

    def _pending(self, token_hash: str, now: float) -> Invitation:
        row = self._db.one(f"SELECT {_INVITATION} FROM invitations WHERE token_hash = ?",
                           (token_hash,))
        if row is None:
            raise NotFound("no such invitation; it may have been revoked, ask for a new one")
        invitation = _invitation(row)
        if invitation.accepted_at is not None:
            raise Expired("this invitation was used already; ask for a new one")
        if now >= invitation.expires_at:
            raise Expired("this invitation has expired; ask for a new one")
        return invitation

    def of_team(self, team: str, *, pending_at: float | None = None) -> list[Invitation]:
        """The team's invitations, oldest first; with ``pending_at``, only those neither
        accepted nor expired at that time."""
        with self._db.read() as db:
            rows = db.execute(f"SELECT {_INVITATION} FROM invitations WHERE team = ? "
                              "ORDER BY created_at, id", (team,)).fetchall()
            invitations = [_invitation(row) for row in rows]
        if pending_at is not None:
            invitations = [i for i in invitations
                           if i.accepted_at is None and pending_at < i.expires_at]
        return invitations

    def revoke(self, invitation_id: str) -> None:
        """Withdraw a pending invitation (its token stops working).

        Raises: NotFound; Conflict (it was accepted already: remove the member instead).
        """
        with self._db.write() as db:
            row = self._db.one("SELECT accepted_at FROM invitations WHERE id = ?",
                               (invitation_id,))
            if row is None:
                raise NotFound(f"no invitation {invitation_id}")
            if row[0] is not None:
                raise Conflict("the invitation was accepted already; remove the member instead")
            db.execute("DELETE FROM invitations WHERE id = ?", (invitation_id,))
