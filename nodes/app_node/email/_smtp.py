"""The SMTP backend: stdlib :mod:`smtplib`, run in a worker thread.

smtplib blocks, so each send runs in ``trio.to_thread.run_sync`` with
``abandon_on_cancel=True``: a cancelled send returns at once, and the thread
finishes (or times out after ``timeout_s``) on its own. One connection per
message: app-node sends a few mails an hour, not a stream, and a fresh
connection never finds a server-side idle timeout.

Errors follow RFC 5321 §4.2.1: a 5yz reply is permanent (:class:`EmailRejected`),
a 4yz reply transient (:class:`EmailUnavailable`); so are the network and
timeouts. Wrong credentials are permanent. When the server refuses some
recipients but takes the rest, the message *was* sent to the rest: that is
reported as :class:`EmailRejected` naming the refused ones, and must not be
retried as a whole.

Shortcomings: implicit TLS (port 465, ``SMTP_SSL``) is not offered; use
STARTTLS on 587. The server certificate is checked against the system store.
"""

from __future__ import annotations

import smtplib
import ssl
import time
from email.message import EmailMessage as MimeMessage

import trio

from ._errors import EmailError, EmailRejected, EmailUnavailable
from ._message import EmailMessage, SendResult, check_address, to_mime

__all__ = ["SmtpSender"]

_BACKEND = "smtp"


def _by_code(code: int, what: str, fix: str) -> EmailError:
    """A 5yz reply is permanent, anything else (4yz) transient (RFC 5321 §4.2.1)."""
    if 500 <= code < 600:
        return EmailRejected(f"{what}; {fix}", backend=_BACKEND, status=code)
    return EmailUnavailable(f"{what}; retry later", backend=_BACKEND, status=code)


def _text(reply: bytes | str) -> str:
    return reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)


class SmtpSender:
    """Send through an SMTP server (a relay, or a provider's SMTP endpoint).

    Args:
        host, port: the server (587 with STARTTLS is the submission default).
        username, password: log in when both are given.
        starttls: upgrade to TLS before logging in; on unless the relay is local.
        from_address: the envelope sender and ``From`` header.
        timeout_s: for connecting and for each reply.
    """

    def __init__(
        self,
        host: str,
        port: int = 587,
        *,
        username: str | None = None,
        password: str | None = None,
        starttls: bool = True,
        from_address: str,
        timeout_s: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.username = username
        self._password = password
        self.starttls = starttls
        self.from_address = check_address(from_address)
        self.timeout_s = timeout_s
        self._ssl_context = ssl_context

    def __repr__(self) -> str:  # never the password
        return f"SmtpSender({self.host}:{self.port}, user={self.username!r})"

    async def send(self, message: EmailMessage) -> SendResult:
        """Send ``message``; return its ``Message-ID``.

        Raises:
            EmailRejected: a 5yz reply (refused recipient or sender, too big),
                failed login, or no STARTTLS where it was asked for.
            EmailUnavailable: a 4yz reply, the network, a timeout.
        """
        mime = to_mime(message, self.from_address, date_s=time.time())
        await trio.to_thread.run_sync(self._send_blocking, mime, abandon_on_cancel=True)
        return SendResult(message_id=str(mime["Message-ID"]), backend=_BACKEND)

    def _send_blocking(self, mime: MimeMessage) -> None:
        where = f"SMTP server {self.host}:{self.port}"
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout_s) as smtp:
                if self.starttls:
                    smtp.starttls(context=self._ssl_context or ssl.create_default_context())
                if self.username is not None and self._password is not None:
                    smtp.login(self.username, self._password)
                refused = smtp.send_message(mime)
        except smtplib.SMTPRecipientsRefused as exc:
            codes = [code for code, _ in exc.recipients.values()]
            detail = "; ".join(f"{a}: {c} {_text(r)}" for a, (c, r) in exc.recipients.items())
            code = max(codes) if all(c >= 500 for c in codes) else min(codes)
            raise _by_code(
                code, f"{where} refused every recipient ({detail})", "check the addresses"
            ) from exc
        except smtplib.SMTPSenderRefused as exc:
            raise _by_code(
                exc.smtp_code,
                f"{where} refused the sender {exc.sender}: {_text(exc.smtp_error)}",
                "set from_address to an address the server lets you send as",
            ) from exc
        except smtplib.SMTPAuthenticationError as exc:
            raise EmailRejected(
                f"{where} refused the login of {self.username!r}: "
                f"{exc.smtp_code} {_text(exc.smtp_error)}; check username and password",
                backend=_BACKEND,
                status=exc.smtp_code,
            ) from exc
        except smtplib.SMTPNotSupportedError as exc:
            raise EmailRejected(
                f"{where} does not offer {exc}; set starttls=false only for a trusted "
                "local relay, or remove the username for a server without AUTH",
                backend=_BACKEND,
            ) from exc
        except smtplib.SMTPException as exc:  # data refused, disconnected, bad greeting
            code = getattr(exc, "smtp_code", 0)
            if isinstance(code, int) and code >= 400:
                reply = _text(getattr(exc, "smtp_error", b""))
                raise _by_code(code, f"{where} answered {code} {reply}", "fix the message") from exc
            raise EmailUnavailable(f"{where}: {exc}; retry later", backend=_BACKEND) from exc
        except ssl.SSLError as exc:
            raise EmailRejected(
                f"{where}: TLS failed ({exc}); check the host name and its certificate",
                backend=_BACKEND,
            ) from exc
        except OSError as exc:  # refused, unreachable, timeout (TimeoutError is an OSError)
            raise EmailUnavailable(
                f"cannot reach {where}: {exc}; check host and port, or retry later",
                backend=_BACKEND,
            ) from exc
        if refused:
            detail = "; ".join(f"{a}: {c} {_text(r)}" for a, (c, r) in refused.items())
            raise EmailRejected(
                f"{where} took the message but refused some recipients ({detail}); "
                "the others got it, so do not resend to them",
                backend=_BACKEND,
                status=max(c for c, _ in refused.values()),
            )
