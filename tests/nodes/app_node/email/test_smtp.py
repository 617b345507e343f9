"""SmtpSender against a real SMTP server: aiosmtpd's Controller in a thread on 127.0.0.1.

Real sockets and threads, so the real clock, bounded by ``trio.fail_after``.
"""

from __future__ import annotations

from email import message_from_bytes
from email.policy import default

import pytest
import trio

from nodes.app_node.email import (
    EmailKind,
    EmailMessage,
    EmailRejected,
    EmailUnavailable,
    SmtpSender,
    send_with_retry,
)
from tests.ports import free_port

aiosmtpd_controller = pytest.importorskip("aiosmtpd.controller")
aiosmtpd_smtp = pytest.importorskip("aiosmtpd.smtp")

USER, PASSWORD = "app-node", "s3cret"


class _Handler:
    """Keeps what arrived; refuses ``nobody@…`` (550) and ``later@…`` (451)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, list[str], bytes]] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("nobody@"):
            return "550 5.1.1 no such user here"
        if address.startswith("later@"):
            return "451 4.3.0 mailbox busy, try again"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.received.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 Message accepted for delivery"


def _authenticator(server, session, envelope, mechanism, auth_data):
    ok = isinstance(auth_data, aiosmtpd_smtp.LoginPassword) and (
        auth_data.login == USER.encode() and auth_data.password == PASSWORD.encode()
    )
    # handled=False: aiosmtpd then answers 535 itself (handled=True would answer nothing).
    return aiosmtpd_smtp.AuthResult(success=ok, handled=False)


@pytest.fixture
def smtp_server():
    """An SMTP server on 127.0.0.1 offering AUTH (PLAIN, LOGIN) over plain TCP (test only)."""
    handler = _Handler()
    controller = aiosmtpd_controller.Controller(
        handler,
        hostname="127.0.0.1",
        port=free_port(),
        authenticator=_authenticator,
        auth_require_tls=False,
    )
    controller.start()
    try:
        yield handler, controller.port
    finally:
        controller.stop()


def _message(to: str | list[str] = "alice@example.com", **kw) -> EmailMessage:
    return EmailMessage(
        to=to,
        subject="You are invited to team gpu-lab",
        text="Open https://app.example/invite/abc to join.",
        html="<p>Open <a href='https://app.example/invite/abc'>this link</a>.</p>",
        kind=EmailKind.INVITATION,
        idempotency_key="invite:42:7",
        **kw,
    )


def _sender(port: int, **kw) -> SmtpSender:
    kw.setdefault("starttls", False)
    return SmtpSender("127.0.0.1", port, from_address="noreply@cosmicac.test", timeout_s=5, **kw)


async def test_sends_with_login_and_the_server_gets_the_mime(smtp_server):
    handler, port = smtp_server
    with trio.fail_after(10):
        result = await _sender(port, username=USER, password=PASSWORD).send(
            _message(["alice@example.com", "bob@example.com"])
        )
    assert result.backend == "smtp"
    [(mail_from, rcpts, raw)] = handler.received
    assert mail_from == "noreply@cosmicac.test"
    assert rcpts == ["alice@example.com", "bob@example.com"]
    parsed = message_from_bytes(raw, policy=default)
    assert parsed["Message-ID"] == result.message_id
    assert parsed["Subject"] == "You are invited to team gpu-lab"
    assert parsed["X-CosmicAC-Kind"] == "invitation"
    assert "invite/abc" in parsed.get_body(("plain",)).get_content()
    assert "<a href" in parsed.get_body(("html",)).get_content()


async def test_sends_without_login(smtp_server):
    handler, port = smtp_server
    with trio.fail_after(10):
        await _sender(port).send(_message())
    assert len(handler.received) == 1


async def test_a_wrong_password_is_rejected_and_names_the_fix(smtp_server):
    handler, port = smtp_server
    with trio.fail_after(10), pytest.raises(EmailRejected) as info:
        await _sender(port, username=USER, password="wrong").send(_message())
    assert info.value.status == 535
    assert "check username and password" in info.value.message
    assert "wrong" not in info.value.message
    assert handler.received == []


async def test_a_refused_recipient_is_rejected(smtp_server):
    handler, port = smtp_server
    with trio.fail_after(10), pytest.raises(EmailRejected) as info:
        await _sender(port).send(_message("nobody@example.com"))
    assert info.value.status == 550
    assert "nobody@example.com" in info.value.message
    assert "no such user" in info.value.message
    assert handler.received == []


async def test_a_partly_refused_message_is_rejected_but_went_to_the_rest(smtp_server):
    handler, port = smtp_server
    with trio.fail_after(10), pytest.raises(EmailRejected) as info:
        await _sender(port).send(_message(["alice@example.com", "nobody@example.com"]))
    assert "do not resend" in info.value.message
    assert [rcpts for _, rcpts, _ in handler.received] == [["alice@example.com"]]


async def test_a_4xx_recipient_reply_is_transient(smtp_server):
    _, port = smtp_server
    with trio.fail_after(10), pytest.raises(EmailUnavailable) as info:
        await _sender(port).send(_message("later@example.com"))
    assert info.value.status == 451


async def test_starttls_asked_of_a_server_without_it_is_rejected(smtp_server):
    _, port = smtp_server
    with trio.fail_after(10), pytest.raises(EmailRejected) as info:
        await _sender(port, starttls=True).send(_message())
    assert "STARTTLS" in info.value.message
    assert "starttls=false" in info.value.message


async def test_nobody_listening_is_transient_and_retried_within_bounds():
    port = free_port()  # closed again: connecting is refused
    sender = _sender(port)
    from nodes.app_node.email import RetryPolicy

    policy = RetryPolicy(max_attempts=2, base_delay_s=0.01, deadline_s=5)
    with trio.fail_after(10), pytest.raises(EmailUnavailable) as info:
        await send_with_retry(sender, _message(), policy)
    assert "gave up after 2 attempt(s)" in info.value.message
    assert "check host and port" in info.value.message
