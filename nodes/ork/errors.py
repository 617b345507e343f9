"""Errors of wrk-ork's core, each with a stable ``code`` that crosses the RPC wire.

::

    OrkError                       .code ORK_ERROR
    ├── NotFound                   NOT_FOUND: no such job, replica, rack or node
    ├── InvalidState               INVALID_STATE: the action is not allowed in the
    │                              current status (restart a deleting job, delete a
    │                              running replica, remove a rack that holds jobs)
    ├── BadRequest                 BAD_REQUEST: the request itself is wrong
    │                              (a container job's replica, a duplicate rack)
    ├── Conflict                   CONFLICT: it clashes with another job (a
    │                              served name the team already uses)
    ├── QuotaExceeded              QUOTA_EXCEEDED: the job would take the team
    │                              (or its creator) past a GPU quota
    └── StoreError                 STORE: the SQLite file cannot be used (a newer
                                   schema, a corrupt row); the daemon stops

The RPC service (:mod:`nodes.ork.service`) answers an ``OrkError`` with its code
and message; callers (app-node, the CLI) branch on the code, never on the text.
The message says what to do next.
"""

from __future__ import annotations

__all__ = ["BadRequest", "Conflict", "InvalidState", "NotFound", "OrkError", "QuotaExceeded",
           "StoreError"]


class OrkError(Exception):
    """Something wrk-ork refuses or cannot do; ``code`` is stable, ``message`` is for humans."""

    code = "ORK_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(OrkError):
    """The job, replica, rack or node named does not exist (any more)."""

    code = "NOT_FOUND"


class InvalidState(OrkError):
    """The action is not allowed while the job or replica is in its current status."""

    code = "INVALID_STATE"


class BadRequest(OrkError):
    """The request is wrong whatever the state (e.g. a replica action on a container job)."""

    code = "BAD_REQUEST"


class Conflict(OrkError):
    """The request clashes with another live job (two jobs of a team, one served name)."""

    code = "CONFLICT"


class QuotaExceeded(OrkError):
    """The job would take its team's (or its creator's) GPUs past the quota app-node sent.

    ``data`` is what the refusal names, for callers that show it: ``scope``
    (``team`` or ``user``), ``quota``, ``in_use`` (GPUs the team's, or the
    user's, jobs hold or may hold) and ``requested`` (the new job's GPUs, all
    replicas).
    """

    code = "QUOTA_EXCEEDED"

    def __init__(self, message: str, *, scope: str, quota: int, in_use: int,
                 requested: int) -> None:
        super().__init__(message)
        self.data = {"scope": scope, "quota": quota, "in_use": in_use, "requested": requested}


class StoreError(OrkError):
    """The store cannot be opened or read: a schema from a newer wrk-ork, a bad row."""

    code = "STORE"
