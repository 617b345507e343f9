"""EmailSettings and make_sender."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from nodes.app_node.email import (
    EmailSender,
    EmailSettings,
    OutboxSender,
    SendGridSender,
    SmtpSender,
    make_sender,
)


def test_the_default_is_the_outbox_under_storage(tmp_path):
    sender = make_sender(EmailSettings(), tmp_path)
    assert isinstance(sender, OutboxSender) and isinstance(sender, EmailSender)
    assert sender.folder == tmp_path / "outbox"


def test_smtp_and_sendgrid(tmp_path):
    smtp = make_sender(
        EmailSettings(
            backend="smtp",
            smtp_host="mail.example",
            smtp_username="u",
            smtp_password="hunter2",
            from_address="noreply@example.com",
        ),
        tmp_path,
    )
    assert isinstance(smtp, SmtpSender) and smtp.port == 587 and smtp.starttls
    assert "hunter2" not in repr(smtp)
    settings = EmailSettings(backend="sendgrid", sendgrid_api_key="SG.secret")
    assert "SG.secret" not in repr(settings)
    assert isinstance(make_sender(settings, tmp_path), SendGridSender)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"backend": "smtp"}, "smtp_host"),
        ({"backend": "smtp", "smtp_host": "h", "smtp_username": "u"}, "smtp_password"),
        ({"backend": "sendgrid"}, "sendgrid_api_key"),
        ({"backend": "pigeon"}, "backend"),
        ({"from_address": "nobody"}, "alice@example.com"),
    ],
)
def test_incomplete_settings_say_what_is_missing(fields, says):
    with pytest.raises(ValidationError) as info:
        EmailSettings(**fields)
    assert says in str(info.value)
