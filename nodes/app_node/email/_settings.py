"""Which backend app-node sends mail with, and building it (:func:`make_sender`).

The outbox is the default: an embedded deployment sends nothing out of the
box, and every mail can still be read from ``<storage>/outbox``. Secrets are
``SecretStr``, so they never show in a repr, a log line or an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from ._message import EmailAddress, EmailSender
from ._outbox import OutboxSender
from ._sendgrid import SendGridSender
from ._smtp import SmtpSender

__all__ = ["EmailSettings", "make_sender"]


class EmailSettings(BaseModel):
    """How app-node sends email; only the chosen backend's fields are read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: ``outbox`` (files, the default), ``smtp`` or ``sendgrid``.
    backend: Literal["outbox", "smtp", "sendgrid"] = "outbox"
    #: The ``From`` of every mail (for SendGrid, a verified sender).
    from_address: EmailAddress = "cosmicac@localhost"

    #: The outbox folder; ``<storage>/outbox`` when unset.
    outbox_folder: Path | None = None

    smtp_host: str | None = None
    #: 587 is the submission port (RFC 6409), used with STARTTLS.
    smtp_port: int = Field(default=587, ge=1, le=65535)
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_starttls: bool = True
    smtp_timeout_s: float = Field(default=30.0, gt=0)

    sendgrid_api_key: SecretStr | None = None
    sendgrid_base_url: str = "https://api.sendgrid.com"
    sendgrid_timeout_s: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _backend_complete(self) -> EmailSettings:
        if self.backend == "smtp" and not self.smtp_host:
            raise ValueError("backend 'smtp' needs smtp_host (and smtp_port, default 587)")
        if self.backend == "smtp" and (self.smtp_username is None) != (self.smtp_password is None):
            raise ValueError("give both smtp_username and smtp_password, or neither")
        if self.backend == "sendgrid" and (
            self.sendgrid_api_key is None or not self.sendgrid_api_key.get_secret_value()
        ):
            raise ValueError("backend 'sendgrid' needs sendgrid_api_key (a Mail Send API key)")
        if not self.sendgrid_base_url.startswith(("https://", "http://")):
            raise ValueError("sendgrid_base_url must start with https:// (or http:// for tests)")
        return self


def make_sender(settings: EmailSettings, storage: Path | str) -> EmailSender:
    """The sender ``settings`` describe.

    Args:
        storage: the node's storage folder; the outbox defaults to ``<storage>/outbox``.
    """
    if settings.backend == "smtp":
        assert settings.smtp_host is not None  # checked by the model
        return SmtpSender(
            settings.smtp_host,
            settings.smtp_port,
            username=settings.smtp_username,
            password=(
                settings.smtp_password.get_secret_value() if settings.smtp_password else None
            ),
            starttls=settings.smtp_starttls,
            from_address=settings.from_address,
            timeout_s=settings.smtp_timeout_s,
        )
    if settings.backend == "sendgrid":
        assert settings.sendgrid_api_key is not None  # checked by the model
        return SendGridSender(
            settings.sendgrid_api_key.get_secret_value(),
            settings.from_address,
            settings.sendgrid_base_url,
            timeout_s=settings.sendgrid_timeout_s,
        )
    folder = settings.outbox_folder or Path(storage) / "outbox"
    return OutboxSender(folder, from_address=settings.from_address)
