"""Session and password-reset tokens (stored hashed)."""

from __future__ import annotations

from ..errors import Conflict, Expired, Invalid, NotFound
from ..model import Token, TokenKind
from ._connection import Connection
from ._read_cache import MISS
from ._rows import _TOKEN, _token, user_row

__all__ = ["Tokens", "valid_token"]


def valid_token(db: Connection, token_hash: str, kind: TokenKind, now: float) -> Token:
    """The token if it works at ``now`` (inside a read or write; also for a password reset).

    Raises: NotFound, Expired.
    """
    row = db.one(f"SELECT {_TOKEN} FROM tokens WHERE token_hash = ? AND kind = ?",
                 (token_hash, kind.value))
    if row is None:
        raise NotFound("no such token; log in again")
    token = _token(row)
    if token.revoked_at is not None:
        raise Expired("this token was revoked; log in again")
    if now >= token.expires_at:
        raise Expired("this token has expired; log in again")
    if user_row(db, token.user).disabled:
        raise Expired("this account is disabled; ask an admin")
    return token


class Tokens:
    """Tokens (``store.tokens``). Blocking, thread-safe, each change atomic."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    def add(self, *, token_hash: str, user: str, kind: TokenKind | str,
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
        with self._db.write() as db:
            user_row(self._db, user)
            if self._db.one("SELECT 1 FROM tokens WHERE token_hash = ?", (token_hash,)):
                raise Conflict("that token is in use already; make a new one")
            db.execute(f"INSERT INTO tokens ({_TOKEN}) VALUES (?,?,?,?,?,?)",
                       (token_hash, user, kind.value, now, expires_at, None))
        return token

    def valid(self, token_hash: str, *, now: float,
              kind: TokenKind = TokenKind.SESSION) -> Token:
        """The token of that hash and kind if it works at ``now`` (kept: ``_read_cache.py``).

        Raises: NotFound (no such token), Expired (expired, revoked, or its user disabled).
        """
        key = ("token", token_hash, kind)
        token = self._db.cache.get(key)
        if token is not MISS and now < token.expires_at:
            return token  # valid when kept; no change since (revoked, user disabled)
        with self._db.read():
            token = valid_token(self._db, token_hash, kind, now)
            self._db.cache.put(key, token)
        return token

    def revoke(self, token_hash: str, *, now: float) -> None:
        """Revoke one token (logout); revoking it again changes nothing. Raises: NotFound."""
        with self._db.write() as db:
            if self._db.one("SELECT 1 FROM tokens WHERE token_hash = ?", (token_hash,)) is None:
                raise NotFound("no such token")
            db.execute("UPDATE tokens SET revoked_at = ? "
                       "WHERE token_hash = ? AND revoked_at IS NULL", (now, token_hash))

    def revoke_all_of(self, user_id: str, *, now: float) -> int:
        """Revoke every live token of the user (log out everywhere); returns how many."""
        with self._db.write() as db:
            return db.execute("UPDATE tokens SET revoked_at = ? "
                              "WHERE user = ? AND revoked_at IS NULL", (now, user_id)).rowcount
