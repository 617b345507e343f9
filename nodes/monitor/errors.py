"""What wrk-monitor's HTTP backends (Loki, Prometheus) answer when it is not what was asked."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["BackendError"]


class BackendError(Exception):
    """A backend answered with an error, with a body that is not its documented
    shape, or not at all (``status`` 0). ``message`` is the backend's own text."""

    #: The backend's name in the message (set by each subclass).
    backend: ClassVar[str] = "the backend"

    def __init__(self, status: int, message: str, *, url: str = "") -> None:
        where = f"{self.backend} at {url}" if url else self.backend
        super().__init__(f"{where} answered {status}: {message}" if status
                         else f"{where} unreachable: {message}")
        self.status = status
        self.message = message
        self.url = url
