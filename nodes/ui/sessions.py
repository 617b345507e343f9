"""Who is signed in: browser sessions, each holding an app-node bearer token.

The browser gets only a random session id in an ``HttpOnly`` cookie; the token
it stands for stays here, so a script in the page (or an extension reading
``document.cookie``) never sees a credential of the API. Sessions live in memory:
a restarted UI asks everyone to sign in again, and app-node's tokens stay valid
until they expire or the user signs out.

The store is bounded (the least recently used session ends first) and each
session ends after ``idle_timeout_s`` without a request. Times are passed in, so
the store has no clock of its own.
"""

from __future__ import annotations

import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["COOKIE", "Session", "SessionStore"]

#: The cookie's name; ``__Host-`` over HTTPS (no Domain, Path=/, Secure).
COOKIE = "cosmicac_session"

#: 32 random bytes, URL-safe: 43 characters.
_ID_BYTES = 32


@dataclass
class Session:
    """One signed-in browser."""

    id: str
    #: app-node's bearer token for this user.
    token: str
    email: str
    last_seen: float
    #: When app-node's token ends (POSIX seconds).
    expires_at: float
    #: What the next page shows once, then forgets (a new API key's secret: never in
    #: a URL, never shown twice).
    once: dict[str, str] | None = None

    def take_once(self) -> dict[str, str] | None:
        """The one-time values, now forgotten."""
        once, self.once = self.once, None
        return once


class SessionStore:
    """Sessions by id, bounded in count and idle time."""

    def __init__(self, *, idle_timeout_s: float, max_sessions: int) -> None:
        self._idle_timeout_s = idle_timeout_s
        self._max = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, token: str, email: str, expires_at: float, now: float) -> Session:
        """A new session for ``token``; the oldest ends if the store is full."""
        while len(self._sessions) >= self._max:
            self._sessions.popitem(last=False)
        session = Session(secrets.token_urlsafe(_ID_BYTES), token, email, now, expires_at)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None, now: float, wall_now: float) -> Session | None:
        """The live session ``session_id`` names (touched), or None.

        ``now`` is the monotonic clock (idle time); ``wall_now`` POSIX seconds
        (app-node's expiry).
        """
        if not session_id or len(session_id) > 64:
            return None
        session = self._sessions.get(session_id)
        # The dict lookup already matched; compare again in constant time so the
        # answer's timing says nothing about near misses.
        if session is None or not hmac.compare_digest(session.id, session_id):
            return None
        if now - session.last_seen > self._idle_timeout_s or wall_now >= session.expires_at:
            del self._sessions[session_id]
            return None
        session.last_seen = now
        self._sessions.move_to_end(session_id)
        return session

    def close(self, session_id: str | None) -> Session | None:
        """End ``session_id``'s session; the one it was, if any."""
        if not session_id:
            return None
        return self._sessions.pop(session_id, None)

    def expire(self, now: float) -> int:
        """End every session idle for longer than the timeout; how many ended."""
        ended = 0
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.last_seen <= self._idle_timeout_s:
                break
            self._sessions.popitem(last=False)
            ended += 1
        return ended
