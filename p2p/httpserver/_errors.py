"""Errors of the HTTP/1.1 server.

::

    HttpServerError
    ├── RemoteProtocolError   the client sent what HTTP/1.1 does not allow, or too much
    │                         of it; ``status_hint`` is the answer (400, 408, 413, 431)
    └── LocalProtocolError    the app misused the ASGI interface (sends out of order)
"""

from __future__ import annotations

__all__ = ["HttpServerError", "LocalProtocolError", "RemoteProtocolError"]


class HttpServerError(Exception):
    """Base of this package's errors."""


class RemoteProtocolError(HttpServerError):
    """The client broke HTTP/1.1 or a limit: answer ``status_hint`` and close.

    ``code`` is stable (``bad_request``, ``head_too_large``, ``head_timeout``).
    """

    def __init__(self, message: str, *, status_hint: int = 400,
                 code: str = "bad_request") -> None:
        super().__init__(message)
        self.status_hint = status_hint
        self.code = code


class LocalProtocolError(HttpServerError):
    """The app sent ASGI messages out of order or malformed (a bug of the app)."""
