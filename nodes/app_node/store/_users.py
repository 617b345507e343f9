"""The users of an app-node: accounts, passwords, CLI keys, active team."""

from __future__ import annotations

from contracts.model import key_hex

from ..errors import Conflict, Invalid, NotFound
from ..model import Page, Team, TokenKind, User
from ..model import check_text as _text
from ..model import normal_email as _email
from ._connection import Connection
from ._read_cache import MISS
from ._rows import _USER, _cursor, _limit, _new_id, _page, _user, user_row
from ._teams import check_not_last_owner, insert_team
from ._tokens import valid_token

__all__ = ["Users"]


class Users:
    """Accounts (``store.users``). Blocking, thread-safe, each change atomic."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    def any(self) -> bool:
        """Whether any user exists (none: sign-up of the first admin is open)."""
        with self._db.read() as db:
            return db.execute("SELECT 1 FROM users LIMIT 1").fetchone() is not None

    def create_first_admin(self, *, email: str, name: str, password_hash: str,
                           team_name: str, now: float) -> tuple[User, Team]:
        """Sign-up of the first admin: the user, a team they own (their active team).

        Raises:
            Conflict: a user exists already (sign-up is closed; log in instead).
        """
        with self._db.write():
            if self._db.one("SELECT 1 FROM users LIMIT 1", ()) is not None:
                raise Conflict("the first admin exists already; log in, or ask an admin "
                               "for an invitation")
            user = self._insert(email, name, password_hash, now)
            team = insert_team(self._db, team_name, user.id, now)
        return self.get(user.id), team

    def create(self, *, email: str, name: str, password_hash: str, now: float) -> User:
        """Raises: Conflict (the email is taken), Invalid."""
        with self._db.write():
            return self._insert(email, name, password_hash, now)

    def _insert(self, email: str, name: str, password_hash: str, now: float) -> User:
        email = _email(email)
        name = _text("name", name, 100)
        if not password_hash:
            raise Invalid("password_hash", "password_hash is empty")
        if self._db.one("SELECT 1 FROM users WHERE email = ?", (email,)) is not None:
            raise Conflict(f"a user with email {email} exists already; log in or reset "
                           "the password")
        user = User(id=_new_id(), email=email, name=name, password_hash=password_hash,
                    created_at=now)
        self._db.execute(f"INSERT INTO users ({_USER}) VALUES (?,?,?,?,?,?,?,?)",
                         (user.id, user.email, user.name, user.password_hash,
                          user.created_at, 0, None, None))
        return user

    def get(self, user_id: str) -> User:
        """Raises: NotFound. (Kept: ``_read_cache.py``.)"""
        key = ("user", user_id)
        user = self._db.cache.get(key)
        if user is not MISS:
            return user
        with self._db.read():
            row = self._db.one(f"SELECT {_USER} FROM users WHERE id = ?", (user_id,))
            if row is None:
                raise NotFound(f"no user {user_id}")
            user = _user(row)
            self._db.cache.put(key, user)
        return user

    def by_email(self, email: str) -> User:
        """Case-insensitive. Raises: NotFound."""
        with self._db.read():
            row = self._db.one(f"SELECT {_USER} FROM users WHERE email = ?",
                               (email.strip().lower(),))
        if row is None:
            raise NotFound(f"no user with email {email.strip()}")
        return _user(row)

    def page(self, *, limit: int = 100, cursor: str | None = None) -> Page[User]:
        """All users, oldest first, ``limit`` at a time."""
        limit, after = _limit(limit), _cursor(cursor)
        with self._db.read() as db:
            rows = db.execute(
                f"SELECT rowid, {_USER} FROM users WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (after or 0, limit + 1)).fetchall()
        return _page(rows, limit, _user)

    def update(self, user_id: str, *, name: str | None = None,
               email: str | None = None, disabled: bool | None = None) -> User:
        """Change the given fields. Raises: NotFound, Conflict (email taken), Invalid."""
        with self._db.write() as db:
            user = user_row(self._db, user_id)
            if name is not None:
                db.execute("UPDATE users SET name = ? WHERE id = ?",
                           (_text("name", name, 100), user_id))
            if email is not None:
                email = _email(email)
                if self._db.one("SELECT 1 FROM users WHERE email = ? AND id != ?",
                                (email, user_id)) is not None:
                    raise Conflict(f"a user with email {email} exists already")
                db.execute("UPDATE users SET email = ? WHERE id = ?", (email, user.id))
            if disabled is not None:
                db.execute("UPDATE users SET disabled = ? WHERE id = ?",
                           (int(disabled), user_id))
        return self.get(user_id)

    def delete(self, user_id: str) -> None:
        """Delete the user, their memberships and tokens (their jobs' records stay).

        Raises:
            NotFound; LastOwner: they are the only owner of a team (hand it over first).
        """
        with self._db.write() as db:
            user_row(self._db, user_id)
            for (team,) in db.execute(
                    "SELECT team FROM memberships WHERE user = ? AND role = 'owner'",
                    (user_id,)).fetchall():
                check_not_last_owner(self._db, team, user_id)
            db.execute("DELETE FROM users WHERE id = ?", (user_id,))

    def set_password(self, user_id: str, password_hash: str, *, now: float) -> User:
        """Replace the password hash and revoke every token of the user (log out everywhere).

        Raises: NotFound, Invalid.
        """
        if not password_hash:
            raise Invalid("password_hash", "password_hash is empty")
        with self._db.write() as db:
            user_row(self._db, user_id)
            db.execute("UPDATE users SET password_hash = ? WHERE id = ?",
                       (password_hash, user_id))
            db.execute("UPDATE tokens SET revoked_at = ? WHERE user = ? AND revoked_at IS NULL",
                       (now, user_id))
        return self.get(user_id)

    def upgrade_password_hash(self, user_id: str, old_hash: str, new_hash: str) -> bool:
        """Store ``new_hash`` (the same password at a higher cost) if the stored hash is
        still ``old_hash``; sessions stay. False when the password changed meanwhile.

        Raises: Invalid.
        """
        if not new_hash:
            raise Invalid("password_hash", "password_hash is empty")
        with self._db.write() as db:
            changed = db.execute("UPDATE users SET password_hash = ? "
                                 "WHERE id = ? AND password_hash = ?",
                                 (new_hash, user_id, old_hash)).rowcount
        return changed == 1

    def reset_password(self, token_hash: str, password_hash: str, *, now: float) -> User:
        """Use a reset token: check it, set the password, revoke all the user's tokens.

        Raises: NotFound (no such reset token), Expired (expired, used or revoked), Invalid.
        """
        if not password_hash:
            raise Invalid("password_hash", "password_hash is empty")
        with self._db.write() as db:
            token = valid_token(self._db, token_hash, TokenKind.RESET, now)
            db.execute("UPDATE users SET password_hash = ? WHERE id = ?",
                       (password_hash, token.user))
            db.execute("UPDATE tokens SET revoked_at = ? WHERE user = ? AND revoked_at IS NULL",
                       (now, token.user))
        return self.get(token.user)

    def set_cli_key(self, user_id: str, public_key: str | None) -> User:
        """Record the public key (64 hex) the user's CLI registered; None forgets it.

        Raises: NotFound, Invalid.
        """
        if public_key is not None:
            try:
                public_key = key_hex(public_key)
            except ValueError as exc:
                raise Invalid("cli_public_key", f"cli_public_key {exc}") from None
        with self._db.write() as db:
            user_row(self._db, user_id)
            db.execute("UPDATE users SET cli_public_key = ? WHERE id = ?",
                       (public_key, user_id))
        return self.get(user_id)

    def set_active_team(self, user_id: str, team_id: str | None) -> User:
        """Choose the team new jobs and keys belong to.

        Raises: NotFound (user, or they are not a member of the team).
        """
        with self._db.write() as db:
            user_row(self._db, user_id)
            if team_id is not None and self._db.one(
                    "SELECT 1 FROM memberships WHERE user = ? AND team = ?",
                    (user_id, team_id)) is None:
                raise NotFound(f"user {user_id} is not a member of team {team_id}; "
                               "accept an invitation first")
            db.execute("UPDATE users SET active_team = ? WHERE id = ?", (team_id, user_id))
        return self.get(user_id)
