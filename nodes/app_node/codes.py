"""The error codes of app-node's HTTP API: one vocabulary, one table.

Every error answer is ``{"error": {"code", "message", "field"?}}``. ``code`` is
one of the names below, spelled like the RPC layer's codes (``UNKNOWN_METHOD``,
``INVALID_PARAMS``, wrk-ork's ``QUOTA_EXCEEDED``): upper-case snake, so a client
reads one vocabulary whether an answer came over HTTP or over the swarm, and
wrk-ork's codes pass through unchanged. Clients branch on the code, never on the
message, which is for humans and says what to do next.

:data:`STATUS` gives each code's HTTP status. The API, the store's errors
(:mod:`nodes.app_node.errors`) and the rate limiter all take their codes from
here; this module imports nothing, so each of them can.

=========================  ======  ==========================================
code                       status  meaning
=========================  ======  ==========================================
NOT_FOUND                  404     no such user, team, membership, invitation,
                                   token, key, job or route (also a team or key
                                   of a team the caller is not in)
CONFLICT                   409     a duplicate (email, team name, membership,
                                   served name), or the first admin exists
INVALID                    422     a malformed value; ``field`` names it
LAST_OWNER                 409     the change would leave a team without owner
EXPIRED                    410     an invitation or reset link past its expiry
                                   or used (an expired *session* is 401)
WRONG_ACCOUNT              403     an invitation accepted by another address
STORE                      500     app-node's store cannot be used
APP_NODE_ERROR             500     any other refusal of the store
UNAUTHENTICATED            401     no session, or an expired or revoked one
FORBIDDEN                  403     the caller's role does not allow it
TEAM_CREATION_FORBIDDEN    403     only operators create teams here
RATE_LIMITED               429     over the request rate (``Retry-After``)
THROTTLED                  429     failed logins, reset emails or token guesses
                                   back off (``Retry-After``)
BODY_TOO_LARGE             413     the request body is beyond the route's limit
BAD_CONTENT_LENGTH         400     ``Content-Length`` is not a number
CLIENT_DISCONNECTED        400     the client left before its whole body
JSON_TOO_DEEP              400     JSON nested deeper than the limit
BODY_TIMEOUT               408     the body did not arrive in time
SERVER_BUSY                503     too many bodies being read (``Retry-After``)
METHOD_NOT_ALLOWED         405     the route does not take this method
HTTP_ERROR                 (any)   another HTTP-level refusal, with its status
TOO_MANY_STREAMS           503     as many event streams open as allowed
ORK_UNAVAILABLE            503     wrk-ork not configured, unreachable, or
                                   refusing app-node's key
ORK_ERROR                  502     wrk-ork failed in a way the API does not map
INVALID_STATE              409     wrk-ork: not allowed in the job's state
QUOTA_EXCEEDED             409     wrk-ork: past the team's or the caller's GPU
                                   quota (``field: gpus``)
BAD_REQUEST                422     wrk-ork refused the request (``field``)
INVALID_PARAMS             422     wrk-ork refused the parameters (``field``)
MONITOR_UNAVAILABLE        503     wrk-monitor not configured, unreachable, or
                                   refusing app-node's key
MONITOR_ERROR              502     wrk-monitor failed
HEALTH_UNAVAILABLE         503     no health prober, or its store fails
EMAIL_FAILED               502     the email could not be sent
INTERNAL                   500     app-node failed; the error is in its log
=========================  ======  ==========================================
"""

from __future__ import annotations

__all__ = [
    "APP_NODE_ERROR", "BAD_CONTENT_LENGTH", "BAD_REQUEST", "BODY_TIMEOUT", "BODY_TOO_LARGE",
    "CLIENT_DISCONNECTED", "CONFLICT", "EMAIL_FAILED", "EXPIRED", "FORBIDDEN",
    "HEALTH_UNAVAILABLE", "HTTP_ERROR", "INTERNAL", "INVALID", "INVALID_PARAMS",
    "INVALID_STATE", "JSON_TOO_DEEP", "LAST_OWNER", "METHOD_NOT_ALLOWED", "MONITOR_ERROR",
    "MONITOR_UNAVAILABLE", "NOT_FOUND", "ORK_ERROR", "ORK_UNAVAILABLE", "QUOTA_EXCEEDED",
    "RATE_LIMITED", "SERVER_BUSY", "STATUS", "STORE", "TEAM_CREATION_FORBIDDEN",
    "THROTTLED", "TOO_MANY_STREAMS", "UNAUTHENTICATED", "WRONG_ACCOUNT",
]

# The store's refusals (nodes.app_node.errors).
NOT_FOUND = "NOT_FOUND"
CONFLICT = "CONFLICT"
INVALID = "INVALID"
LAST_OWNER = "LAST_OWNER"
EXPIRED = "EXPIRED"
WRONG_ACCOUNT = "WRONG_ACCOUNT"
STORE = "STORE"
APP_NODE_ERROR = "APP_NODE_ERROR"
# Who may.
UNAUTHENTICATED = "UNAUTHENTICATED"
FORBIDDEN = "FORBIDDEN"
TEAM_CREATION_FORBIDDEN = "TEAM_CREATION_FORBIDDEN"
# How often.
RATE_LIMITED = "RATE_LIMITED"
THROTTLED = "THROTTLED"
# Request bodies and HTTP itself.
BODY_TOO_LARGE = "BODY_TOO_LARGE"
BAD_CONTENT_LENGTH = "BAD_CONTENT_LENGTH"
CLIENT_DISCONNECTED = "CLIENT_DISCONNECTED"
JSON_TOO_DEEP = "JSON_TOO_DEEP"
BODY_TIMEOUT = "BODY_TIMEOUT"
SERVER_BUSY = "SERVER_BUSY"
METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
HTTP_ERROR = "HTTP_ERROR"
TOO_MANY_STREAMS = "TOO_MANY_STREAMS"
# The daemons behind app-node; wrk-ork's own codes pass through as it sends them.
ORK_UNAVAILABLE = "ORK_UNAVAILABLE"
ORK_ERROR = "ORK_ERROR"
INVALID_STATE = "INVALID_STATE"
QUOTA_EXCEEDED = "QUOTA_EXCEEDED"
BAD_REQUEST = "BAD_REQUEST"
INVALID_PARAMS = "INVALID_PARAMS"
MONITOR_UNAVAILABLE = "MONITOR_UNAVAILABLE"
MONITOR_ERROR = "MONITOR_ERROR"
HEALTH_UNAVAILABLE = "HEALTH_UNAVAILABLE"
EMAIL_FAILED = "EMAIL_FAILED"
INTERNAL = "INTERNAL"

#: Each code's HTTP status. ``HTTP_ERROR`` carries the status of the refusal it
#: reports, so it has none here.
STATUS: dict[str, int] = {
    NOT_FOUND: 404, CONFLICT: 409, INVALID: 422, LAST_OWNER: 409, EXPIRED: 410,
    WRONG_ACCOUNT: 403, STORE: 500, APP_NODE_ERROR: 500,
    UNAUTHENTICATED: 401, FORBIDDEN: 403, TEAM_CREATION_FORBIDDEN: 403,
    RATE_LIMITED: 429, THROTTLED: 429,
    BODY_TOO_LARGE: 413, BAD_CONTENT_LENGTH: 400, CLIENT_DISCONNECTED: 400,
    JSON_TOO_DEEP: 400, BODY_TIMEOUT: 408, SERVER_BUSY: 503, METHOD_NOT_ALLOWED: 405,
    TOO_MANY_STREAMS: 503,
    ORK_UNAVAILABLE: 503, ORK_ERROR: 502, INVALID_STATE: 409, QUOTA_EXCEEDED: 409,
    BAD_REQUEST: 422, INVALID_PARAMS: 422,
    MONITOR_UNAVAILABLE: 503, MONITOR_ERROR: 502, HEALTH_UNAVAILABLE: 503,
    EMAIL_FAILED: 502, INTERNAL: 500,
}
