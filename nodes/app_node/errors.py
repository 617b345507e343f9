"""Errors of app-node's data layer, each with a stable ``code`` the HTTP API returns.

::

    AppNodeError                   .code APP_NODE_ERROR
    ├── NotFound                   NOT_FOUND: no such user, team, membership,
    │                              invitation, token, API key or job record
    ├── Conflict                   CONFLICT: a duplicate (email, team name,
    │                              membership), or the first admin exists already
    ├── Invalid                    INVALID: a value is malformed; ``field`` names it
    ├── LastOwner                  LAST_OWNER: the change would leave a team
    │                              without an owner
    ├── Expired                    EXPIRED: the invitation or token is past its
    │                              expiry (or already used)
    ├── WrongAccount               WRONG_ACCOUNT: an invitation accepted by an
    │                              account whose email is not the one invited
    └── StoreError                 STORE: the SQLite file cannot be used (a newer
                                   schema, a corrupt row); app-node stops

The API answers an ``AppNodeError`` with ``{"code", "message"}`` (and ``field``
for ``INVALID``), its status from :data:`nodes.app_node.codes.STATUS`; clients
branch on the code, never on the text. Each message says what to do next.
"""

from __future__ import annotations

from . import codes

__all__ = ["AppNodeError", "Conflict", "Expired", "Invalid", "LastOwner", "NotFound",
           "StoreError", "WrongAccount"]


class AppNodeError(Exception):
    """Something app-node refuses or cannot do; ``code`` is stable, ``message`` is for humans."""

    code = codes.APP_NODE_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(AppNodeError):
    """The user, team, membership, invitation, token, key or job does not exist (any more)."""

    code = codes.NOT_FOUND


class Conflict(AppNodeError):
    """A unique value is taken (an email, a team name, a membership), or setup already ran."""

    code = codes.CONFLICT


class Invalid(AppNodeError):
    """A value is malformed; ``field`` names it so a form can point at it."""

    code = codes.INVALID

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class LastOwner(AppNodeError):
    """Removing or demoting this membership would leave its team without an owner."""

    code = codes.LAST_OWNER


class Expired(AppNodeError):
    """The invitation or token is past its expiry, or was already used or revoked."""

    code = codes.EXPIRED


class WrongAccount(AppNodeError):
    """An invitation was accepted as (or to create) an account of another email than
    the one it was sent to: holding the link is not enough, the address must match,
    so a forwarded or leaked link does not let someone else in."""

    code = codes.WRONG_ACCOUNT


class StoreError(AppNodeError):
    """The store cannot be opened or read: a schema from a newer app-node, a bad row."""

    code = codes.STORE
