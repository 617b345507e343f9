"""The SendGrid backend: one ``POST /v3/mail/send`` per message.

The request, as SendGrid's v3 Mail Send reference documents it::

    POST {base_url}/v3/mail/send
    Authorization: Bearer <api key>
    Content-Type: application/json

    {"personalizations": [{"to": [{"email": "alice@example.com"}, ...]}],
     "from": {"email": "noreply@example.com"},
     "subject": "...",
     "content": [{"type": "text/plain", "value": "..."},     # text/plain first:
                 {"type": "text/html",  "value": "..."}],    # SendGrid requires it
     "custom_args": {"idempotency_key": "...", "kind": "invitation"}}

One personalization holds every recipient, so they see each other in ``To``,
as with the other backends. ``custom_args`` come back in SendGrid's event
webhook, which ties a bounce to the intent that sent it. No ``headers``: SendGrid
refuses a list of reserved ones with a 400, and sets its own ``Message-ID``.

The answers::

    202 Accepted            queued; the id is the X-Message-Id header
    400/401/403/413/...     permanent: {"errors": [{"message", "field", "help"}]}
                            -> EmailRejected with SendGrid's messages
    429 Too Many Requests   transient, Retry-After / X-RateLimit-Reset
                            -> EmailUnavailable(retry_after_s=...)
    5xx                     transient -> EmailUnavailable

The request body and the reading of the answer are plain functions
(:func:`sendgrid_request`, :func:`sendgrid_result`); :class:`SendGridSender`
only moves bytes with httpx (which runs on trio through anyio).

Shortcomings: one HTTP connection per message (no pooling); SendGrid has no
idempotency key, so a retry after a lost 202 delivers twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._errors import EmailRejected, EmailUnavailable
from ._message import EmailMessage, SendResult, check_address

__all__ = ["SendGridSender", "sendgrid_request", "sendgrid_result"]

_BACKEND = "sendgrid"
MAIL_SEND_PATH = "/v3/mail/send"


def sendgrid_request(message: EmailMessage, from_address: str) -> dict[str, Any]:
    """The JSON body of ``POST /v3/mail/send`` for ``message``."""
    content = [{"type": "text/plain", "value": message.text}]
    if message.html is not None:
        content.append({"type": "text/html", "value": message.html})
    return {
        "personalizations": [{"to": [{"email": address} for address in message.to]}],
        "from": {"email": from_address},
        "subject": message.subject,
        "content": content,
        "custom_args": {"idempotency_key": message.idempotency_key, "kind": message.kind.value},
    }


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds form only) if given and sane."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None  # the HTTP-date form: let the retry policy pick the delay
    return value if 0 <= value <= 86_400 else None


def _provider_messages(body: bytes) -> str:
    """SendGrid's error messages, joined; the raw body (cut) when it is not its JSON."""
    try:
        errors = json.loads(body)["errors"]
        parts = []
        for error in errors:
            text = str(error.get("message", "")).strip()
            field = error.get("field")
            parts.append(f"{text} (field {field})" if field else text)
        if parts:
            return "; ".join(parts)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return body[:300].decode(errors="replace") or "no body"


def sendgrid_result(status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
    """Read SendGrid's answer to ``POST /v3/mail/send``.

    Args:
        headers: with lower-case names (httpx's ``Headers`` matches any case).

    Raises:
        EmailRejected: a 4xx other than 429, with SendGrid's own messages.
        EmailUnavailable: 429 (with ``retry_after_s`` if sent) or 5xx.
    """
    if 200 <= status < 300:
        # 202 is documented; 200 only in sandbox mode (valid, not queued). Any
        # other 2xx still means SendGrid took it: resending could deliver twice.
        return SendResult(message_id=headers.get("x-message-id", ""), backend=_BACKEND)
    said = _provider_messages(body)
    if status == 429:
        raise EmailUnavailable(
            f"SendGrid rate limit reached (429): {said}; retry later",
            backend=_BACKEND,
            status=status,
            retry_after_s=_retry_after_s(headers),
        )
    if status >= 500:
        raise EmailUnavailable(
            f"SendGrid failed ({status}): {said}; retry later", backend=_BACKEND, status=status
        )
    if status < 400:
        fix = f"check sendgrid_base_url (it should be https://api.sendgrid.com, not {status})"
    elif status in (401, 403):
        fix = "check the API key (Mail Send permission) and that from_address is a verified sender"
    elif status == 413:
        fix = "shorten the message"
    else:
        fix = "fix the message or the settings"
    raise EmailRejected(
        f"SendGrid rejected the message ({status}): {said}; {fix}",
        backend=_BACKEND,
        status=status,
    )


class SendGridSender:
    """Send through SendGrid's v3 Mail Send API.

    Args:
        api_key: a key with the Mail Send permission.
        from_address: a verified sender of the SendGrid account.
        base_url: ``https://api.sendgrid.com`` (``https://api.eu.sendgrid.com``
            for EU-pinned accounts); tests point it at a local server.
        timeout_s: for connecting and for the answer.
    """

    def __init__(
        self,
        api_key: str,
        from_address: str,
        base_url: str = "https://api.sendgrid.com",
        *,
        timeout_s: float = 30.0,
    ) -> None:
        self._api_key = api_key
        self.from_address = check_address(from_address)
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def __repr__(self) -> str:  # never the key
        return f"SendGridSender({self.base_url}, from={self.from_address})"

    async def send(self, message: EmailMessage) -> SendResult:
        """POST ``message`` to SendGrid; return its ``X-Message-Id``.

        Raises:
            EmailRejected: SendGrid refused it (4xx but 429); the message says why.
            EmailUnavailable: 429, 5xx, the network or a timeout.
        """
        import httpx  # only a SendGrid deployment needs it

        url = self.base_url + MAIL_SEND_PATH
        body = sendgrid_request(message, self.from_address)
        headers = {"Authorization": f"Bearer {self._api_key}", "Accept": "application/json"}
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                response = await client.post(url, json=body, headers=headers)
        except httpx.TransportError as exc:  # connect, read, write, timeouts
            raise EmailUnavailable(
                f"cannot reach SendGrid at {self.base_url}: {exc!r}; retry later",
                backend=_BACKEND,
            ) from exc
        return sendgrid_result(response.status_code, response.headers, response.content)
