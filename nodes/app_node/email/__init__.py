"""app-node's outgoing email: invitations and password resets, through one of three backends.

``make_sender(settings, storage)`` gives an :class:`EmailSender`; its ``send``
takes an :class:`EmailMessage` and raises :class:`EmailRejected` (permanent) or
:class:`EmailUnavailable` (transient). :func:`send_with_retry` retries the
transient ones. See README.md for the backends and their wire formats.
"""

from ._errors import EmailError, EmailRejected, EmailUnavailable
from ._message import (
    EmailAddress,
    EmailKind,
    EmailMessage,
    EmailSender,
    SendResult,
    check_address,
    to_mime,
)
from ._outbox import OutboxSender
from ._retry import RetryPolicy, send_with_retry
from ._sendgrid import SendGridSender, sendgrid_request, sendgrid_result
from ._settings import EmailSettings, make_sender
from ._smtp import SmtpSender

__all__ = [
    "EmailAddress",
    "EmailError",
    "EmailKind",
    "EmailMessage",
    "EmailRejected",
    "EmailSender",
    "EmailSettings",
    "EmailUnavailable",
    "OutboxSender",
    "RetryPolicy",
    "SendGridSender",
    "SendResult",
    "SmtpSender",
    "check_address",
    "make_sender",
    "send_with_retry",
    "sendgrid_request",
    "sendgrid_result",
    "to_mime",
]
