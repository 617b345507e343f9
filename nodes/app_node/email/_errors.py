"""Errors of the email senders: permanent or transient, nothing else matters to callers.

::

    EmailError                  .code EMAIL_ERROR
    ├── EmailRejected           EMAIL_REJECTED: permanent. A bad address, a refused
    │                           recipient, wrong credentials, a provider 4xx (but
    │                           429). Sending the same message again fails again:
    │                           fix the address or the settings first.
    └── EmailUnavailable        EMAIL_UNAVAILABLE: transient. The network, a
                                timeout, a provider 5xx or 429, an SMTP 4xx. Retry
                                later (``retry_after_s`` when the provider said when);
                                :func:`send_with_retry` does.

Each backend translates its foreign exceptions (smtplib's, httpx's, OSError)
into these once, at its boundary, with ``raise … from``. Callers branch on the
class or ``code``, never on the message text; the message says what to fix.
"""

from __future__ import annotations

__all__ = ["EmailError", "EmailRejected", "EmailUnavailable"]


class EmailError(Exception):
    """An email could not be handed to its backend; ``message`` says what to do next."""

    code = "EMAIL_ERROR"

    def __init__(self, message: str, *, backend: str = "") -> None:
        super().__init__(message)
        self.message = message
        #: Which backend failed (``outbox``, ``smtp``, ``sendgrid``); empty if none yet.
        self.backend = backend


class EmailRejected(EmailError):
    """Permanent: the message or the settings are wrong; resending unchanged fails again."""

    code = "EMAIL_REJECTED"

    def __init__(self, message: str, *, backend: str = "", status: int | None = None) -> None:
        super().__init__(message, backend=backend)
        #: The provider's status (HTTP status or SMTP reply code), if it answered.
        self.status = status


class EmailUnavailable(EmailError):
    """Transient: the backend could not take the message now; retrying may succeed."""

    code = "EMAIL_UNAVAILABLE"

    def __init__(
        self,
        message: str,
        *,
        backend: str = "",
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, backend=backend)
        self.status = status
        #: How long the provider asked us to wait (HTTP ``Retry-After``), if it did.
        self.retry_after_s = retry_after_s
