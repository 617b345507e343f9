"""What app-node sends (:class:`EmailMessage`), what a sender answers, and the MIME form.

An :class:`EmailMessage` is backend-neutral: recipients, subject, a text body,
an optional HTML body, what kind of mail it is and an idempotency key. Every
backend builds the same RFC 5322 message from it (:func:`to_mime`), except
SendGrid, which takes JSON and builds its own.

The idempotency key names the *intent* ("the invitation of user 42 to team 7"),
not the attempt. It becomes the ``Message-ID`` (hashed, so it leaks nothing),
which lets a receiving system drop duplicates, and it names the outbox file,
which lets :class:`~nodes.app_node.email.OutboxSender` skip a message it already
wrote. SMTP and SendGrid themselves offer no idempotency: a retry after a lost
answer may deliver twice (at-least-once), which is the lesser harm for an
invitation or a password reset.

Addresses are checked here, without the ``email-validator`` package: a plain
``local@domain`` with no display name and no line breaks (a line break in a
header is the classic header-injection hole).
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from email.message import EmailMessage as MimeMessage
from email.utils import format_datetime, parseaddr
from enum import StrEnum
from typing import Annotated, Protocol, runtime_checkable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "EmailAddress",
    "EmailKind",
    "EmailMessage",
    "EmailSender",
    "SendResult",
    "check_address",
    "message_id_for",
    "to_mime",
]

# RFC 5321 §4.5.3.1: a path is at most 256 octets, so an address at most 254.
_MAX_ADDRESS = 254
_LOCAL = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,64}$")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DOMAIN = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")


def check_address(value: str) -> str:
    """Return ``value`` stripped if it is a plain ``local@domain`` address.

    Raises:
        ValueError: with what is wrong and an example of what is right.
    """
    address = value.strip()
    hint = "write a plain address such as alice@example.com"
    if any(c in address for c in "\r\n"):
        raise ValueError(f"{value!r} holds a line break; {hint}")
    if len(address) > _MAX_ADDRESS:
        raise ValueError(f"{value[:40]!r}… is longer than {_MAX_ADDRESS} characters; {hint}")
    if parseaddr(address)[1] != address or address.count("@") != 1:
        raise ValueError(f"{value!r} is not one address; {hint}")
    local, domain = address.split("@")
    if not _LOCAL.match(local) or local.startswith(".") or local.endswith(".") or ".." in local:
        raise ValueError(f"{value!r} has an invalid part before '@'; {hint}")
    if not _DOMAIN.match(domain):
        raise ValueError(f"{value!r} has an invalid domain after '@'; {hint}")
    return address


#: A checked ``local@domain`` address.
EmailAddress = Annotated[str, AfterValidator(check_address)]


class EmailKind(StrEnum):
    """Why app-node sends this mail; shown to the outbox reader and in a header."""

    #: Someone was invited to a team; the mail carries the invitation link.
    INVITATION = "invitation"
    #: A user asked to reset their password; the mail carries the reset link.
    PASSWORD_RESET = "password_reset"
    #: Anything else.
    OTHER = "other"


class EmailMessage(BaseModel):
    """One email to send, the same for every backend.

    Args:
        to: one or more recipients (a single string is accepted), each checked.
        subject: one line; line breaks are refused.
        text: the plain-text body, always present (every client can show it).
        html: an optional HTML alternative of the same content.
        kind: why it is sent.
        idempotency_key: names the intent, the same across retries (1..200 chars).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    to: tuple[EmailAddress, ...] = Field(min_length=1, max_length=100)
    subject: str = Field(min_length=1, max_length=998)
    text: str = Field(min_length=1)
    html: str | None = None
    kind: EmailKind = EmailKind.OTHER
    idempotency_key: str = Field(min_length=1, max_length=200)

    @field_validator("to", mode="before")
    @classmethod
    def _one_or_more(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("subject")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\r" in value or "\n" in value:
            raise ValueError("the subject holds a line break; write it on one line")
        return value


class SendResult(BaseModel):
    """What a backend answered: its id for the message, to find it in its logs."""

    model_config = ConfigDict(frozen=True)

    #: The provider's id (SendGrid's ``X-Message-Id``), the ``Message-ID`` header
    #: (SMTP), or the file name (outbox).
    message_id: str
    #: ``outbox``, ``smtp`` or ``sendgrid``.
    backend: str
    #: True when the outbox already held this idempotency key and wrote nothing.
    duplicate: bool = False


@runtime_checkable
class EmailSender(Protocol):
    """Something that hands an :class:`EmailMessage` on for delivery."""

    async def send(self, message: EmailMessage) -> SendResult:
        """Hand ``message`` on; return the backend's id for it.

        Raises:
            EmailRejected: permanent; fix the message or the settings, do not retry.
            EmailUnavailable: transient; retry later (see :func:`send_with_retry`).
        """
        ...


def key_digest(idempotency_key: str) -> str:
    """A short, file- and header-safe digest of an idempotency key."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()[:24]


def message_id_for(message: EmailMessage, from_address: str) -> str:
    """The ``Message-ID`` of ``message``: the same for every retry of the same intent."""
    domain = from_address.rpartition("@")[2] or "localhost"
    return f"<{key_digest(message.idempotency_key)}.{message.kind.value}@{domain}>"


def to_mime(message: EmailMessage, from_address: str, *, date_s: float) -> MimeMessage:
    """The RFC 5322 message for ``message``: text, plus HTML as an alternative if given.

    Args:
        from_address: the ``From`` address (checked).
        date_s: the ``Date`` header, in seconds since the epoch (UTC).
    """
    sender = check_address(from_address)
    mime = MimeMessage()
    mime["From"] = sender
    mime["To"] = ", ".join(message.to)
    mime["Subject"] = message.subject
    mime["Date"] = format_datetime(datetime.fromtimestamp(date_s, UTC))
    mime["Message-ID"] = message_id_for(message, sender)
    mime["X-CosmicAC-Kind"] = message.kind.value
    mime.set_content(message.text)
    if message.html is not None:
        mime.add_alternative(message.html, subtype="html")
    return mime
