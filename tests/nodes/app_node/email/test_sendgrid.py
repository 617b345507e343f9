"""SendGridSender against a local HTTP server that checks requests as SendGrid documents them.

The server (Starlette under hypercorn, via :func:`p2p.http.serve_asgi`) listens
on 127.0.0.1 only; ``base_url`` always points at it. It validates each request
against the v3 Mail Send reference (path, method, ``Authorization: Bearer``,
JSON body) and answers from a script: 202 with ``X-Message-Id``, 400 with
SendGrid's error body, 429 with ``Retry-After``, 503.
Real sockets, so the real clock, bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import jsonschema
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from nodes.app_node.email import (
    EmailKind,
    EmailMessage,
    EmailRejected,
    EmailUnavailable,
    RetryPolicy,
    SendGridSender,
    send_with_retry,
    sendgrid_request,
    sendgrid_result,
)
from p2p.http import serve_asgi

API_KEY = "SG.test-key"

_ADDRESS = {
    "type": "object",
    "required": ["email"],
    "properties": {
        "email": {"type": "string", "pattern": "^[^@\\s]+@[^@\\s]+$"},
        "name": {"type": "string"},
    },
    "additionalProperties": False,
}

#: The part of SendGrid's v3 Mail Send request body this sender uses, as documented:
#: at least one personalization with at least one ``to``; ``from``; ``subject``;
#: ``content`` with text/plain first, each value at least one character.
MAIL_SEND_SCHEMA = {
    "type": "object",
    "required": ["personalizations", "from", "subject", "content"],
    "properties": {
        "personalizations": {
            "type": "array",
            "minItems": 1,
            "maxItems": 1000,
            "items": {
                "type": "object",
                "required": ["to"],
                "properties": {
                    "to": {"type": "array", "minItems": 1, "items": _ADDRESS},
                    "cc": {"type": "array", "items": _ADDRESS},
                    "bcc": {"type": "array", "items": _ADDRESS},
                    "subject": {"type": "string"},
                },
                "additionalProperties": False,
            },
        },
        "from": _ADDRESS,
        "subject": {"type": "string", "minLength": 1},
        "content": {
            "type": "array",
            "minItems": 1,
            "prefixItems": [{"properties": {"type": {"const": "text/plain"}}}],
            "items": {
                "type": "object",
                "required": ["type", "value"],
                "properties": {
                    "type": {"enum": ["text/plain", "text/html"]},
                    "value": {"type": "string", "minLength": 1},
                },
                "additionalProperties": False,
            },
        },
        "custom_args": {"type": "object", "additionalProperties": {"type": "string"}},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


@dataclass
class FakeSendGrid:
    """Answers POST /v3/mail/send from ``script`` (then 202), keeping every request."""

    script: list[Response] = field(default_factory=list)
    bodies: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    async def mail_send(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return JSONResponse(
                {
                    "errors": [
                        {
                            "field": None,
                            "message": "The provided authorization grant is "
                            "invalid, expired, or revoked",
                            "help": None,
                        }
                    ]
                },
                status_code=401,
            )
        if not request.headers.get("content-type", "").startswith("application/json"):
            self.problems.append(f"content-type {request.headers.get('content-type')}")
        body = json.loads(await request.body())
        try:
            jsonschema.validate(body, MAIL_SEND_SCHEMA)
        except jsonschema.ValidationError as exc:
            self.problems.append(exc.message)
            return JSONResponse({"errors": [{"message": exc.message, "field": "body"}]}, 400)
        self.bodies.append(body)
        if self.script:
            return self.script.pop(0)
        return Response(status_code=202, headers={"X-Message-Id": f"sg-{len(self.bodies)}"})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v3/mail/send", self.mail_send, methods=["POST"])])


@pytest.fixture
async def sendgrid(nursery):
    """A FakeSendGrid on 127.0.0.1 and its base URL."""
    fake = FakeSendGrid()
    host, port = await nursery.start(
        lambda task_status: serve_asgi(
            fake.app(),
            host="127.0.0.1",
            port=0,
            bind_error=lambda h, p, e: e,
            task_status=task_status,
        )
    )
    yield fake, f"http://{host}:{port}"


def _message(**kw) -> EmailMessage:
    fields = {
        "to": ["alice@example.com", "bob@example.com"],
        "subject": "Reset your password",
        "text": "Open https://app.example/reset/xyz within an hour.",
        "html": "<p>Open <a href='https://app.example/reset/xyz'>this link</a>.</p>",
        "kind": EmailKind.PASSWORD_RESET,
        "idempotency_key": "reset:42:1",
    }
    fields.update(kw)
    return EmailMessage(**fields)


def test_the_request_body_is_sendgrids_documented_shape():
    body = sendgrid_request(_message(), "noreply@cosmicac.test")
    jsonschema.validate(body, MAIL_SEND_SCHEMA)
    assert body["personalizations"] == [
        {"to": [{"email": "alice@example.com"}, {"email": "bob@example.com"}]}
    ]
    assert body["from"] == {"email": "noreply@cosmicac.test"}
    assert [c["type"] for c in body["content"]] == ["text/plain", "text/html"]
    assert body["custom_args"] == {"idempotency_key": "reset:42:1", "kind": "password_reset"}
    html_first = {**body, "content": body["content"][::-1]}
    with pytest.raises(jsonschema.ValidationError):  # the schema itself does check
        jsonschema.validate(html_first, MAIL_SEND_SCHEMA)
    text_only = sendgrid_request(_message(html=None), "noreply@cosmicac.test")
    assert [c["type"] for c in text_only["content"]] == ["text/plain"]


async def test_202_gives_the_x_message_id(sendgrid):
    fake, url = sendgrid
    with trio.fail_after(10):
        result = await SendGridSender(API_KEY, "noreply@cosmicac.test", url).send(_message())
    assert (result.message_id, result.backend) == ("sg-1", "sendgrid")
    assert fake.problems == []
    assert fake.bodies[0]["subject"] == "Reset your password"


async def test_400_is_rejected_with_sendgrids_message(sendgrid):
    fake, url = sendgrid
    fake.script.append(
        JSONResponse(
            {
                "errors": [
                    {
                        "message": "The from address does not match a verified Sender Identity.",
                        "field": "from",
                        "help": "https://sendgrid.example/help",
                    }
                ]
            },
            status_code=400,
        )
    )
    with trio.fail_after(10), pytest.raises(EmailRejected) as info:
        await SendGridSender(API_KEY, "noreply@cosmicac.test", url).send(_message())
    assert info.value.status == 400
    assert "does not match a verified Sender Identity" in info.value.message
    assert "(field from)" in info.value.message


async def test_a_wrong_key_is_rejected_and_never_shown(sendgrid):
    _, url = sendgrid
    with trio.fail_after(10), pytest.raises(EmailRejected) as info:
        await SendGridSender("SG.wrong", "noreply@cosmicac.test", url).send(_message())
    assert info.value.status == 401
    assert "check the API key" in info.value.message
    assert "SG.wrong" not in info.value.message
    assert "SG.wrong" not in repr(SendGridSender("SG.wrong", "a@b.example", url))


async def test_429_is_transient_with_retry_after(sendgrid):
    fake, url = sendgrid
    fake.script.append(
        JSONResponse({"errors": [{"message": "too many requests"}]}, 429, {"Retry-After": "7"})
    )
    with trio.fail_after(10), pytest.raises(EmailUnavailable) as info:
        await SendGridSender(API_KEY, "noreply@cosmicac.test", url).send(_message())
    assert (info.value.status, info.value.retry_after_s) == (429, 7.0)


async def test_the_retry_helper_gets_through_429_and_503(sendgrid):
    fake, url = sendgrid
    fake.script += [
        JSONResponse({"errors": [{"message": "too many requests"}]}, 429, {"Retry-After": "0"}),
        Response("busy", status_code=503),
    ]
    policy = RetryPolicy(max_attempts=3, base_delay_s=0.01, deadline_s=5)
    sender = SendGridSender(API_KEY, "noreply@cosmicac.test", url)
    with trio.fail_after(10):
        result = await send_with_retry(sender, _message(), policy)
    assert result.message_id == "sg-3"
    # Every attempt carried the same intent.
    assert {b["custom_args"]["idempotency_key"] for b in fake.bodies} == {"reset:42:1"}
    assert fake.problems == []


async def test_the_retry_helper_gives_up_on_a_lasting_503(sendgrid):
    fake, url = sendgrid
    fake.script += [Response("busy", status_code=503) for _ in range(5)]
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.01, deadline_s=5)
    sender = SendGridSender(API_KEY, "noreply@cosmicac.test", url)
    with trio.fail_after(10), pytest.raises(EmailUnavailable) as info:
        await send_with_retry(sender, _message(), policy)
    assert "gave up after 2 attempt(s)" in info.value.message
    assert len(fake.bodies) == 2


async def test_nobody_listening_is_transient():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sender = SendGridSender(API_KEY, "noreply@cosmicac.test", f"http://127.0.0.1:{port}")
    with trio.fail_after(10), pytest.raises(EmailUnavailable) as info:
        await sender.send(_message())
    assert "cannot reach SendGrid" in info.value.message


@given(st.integers(100, 599), st.binary(max_size=200), st.sampled_from([None, "5", "x", "-1"]))
def test_any_answer_is_a_result_or_a_typed_error(status, body, retry_after):
    headers = {"x-message-id": "m"} if retry_after is None else {"retry-after": retry_after}
    try:
        result = sendgrid_result(status, headers, body)
    except EmailRejected:
        assert (400 <= status < 500 and status != 429) or status < 200 or 300 <= status < 400
    except EmailUnavailable as exc:
        assert status == 429 or status >= 500
        assert exc.retry_after_s in (None, 5.0)
    else:
        assert 200 <= status < 300 and result.backend == "sendgrid"
