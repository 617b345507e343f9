"""EmailMessage validation and its MIME form."""

from __future__ import annotations

from email import message_from_bytes
from email.policy import default

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from nodes.app_node.email import EmailKind, EmailMessage, check_address, to_mime


def _message(**kw) -> EmailMessage:
    fields = {"to": "alice@example.com", "subject": "Hi", "text": "Hello", "idempotency_key": "k1"}
    fields.update(kw)
    return EmailMessage(**fields)


def test_one_address_or_many():
    assert _message().to == ("alice@example.com",)
    assert _message(to=["a@x.example", " b@y.example "]).to == ("a@x.example", "b@y.example")


@pytest.mark.parametrize(
    "bad",
    [
        "alice",
        "alice@",
        "@example.com",
        "a@b@example.com",
        "Alice <alice@example.com>",
        "alice@example.com\r\nBcc: evil@example.com",
        "alice@exa mple.com",
        "alice..x@example.com",
        "alice@-example.com",
    ],
)
def test_bad_addresses_are_refused_with_an_example(bad):
    with pytest.raises(ValidationError) as info:
        _message(to=bad)
    assert "alice@example.com" in str(info.value)  # the hint shows what is right


def test_no_recipients_no_subject_line_breaks_no_key():
    for kw in ({"to": []}, {"subject": "a\nBcc: x@y.example"}, {"idempotency_key": ""}):
        with pytest.raises(ValidationError):
            _message(**kw)


def test_the_message_is_frozen():
    with pytest.raises(ValidationError):
        _message().subject = "other"  # type: ignore[misc]


@given(st.text(max_size=80))
def test_check_address_never_lets_a_line_break_through(text):
    try:
        address = check_address(text)
    except ValueError:
        return
    assert "\r" not in address and "\n" not in address and address.count("@") == 1


def test_mime_has_text_then_html_and_a_stable_message_id():
    message = _message(html="<b>Hello</b>", kind=EmailKind.INVITATION)
    raw = to_mime(message, "noreply@cosmicac.test", date_s=1_700_000_000).as_bytes()
    parsed = message_from_bytes(raw, policy=default)
    assert parsed["To"] == "alice@example.com"
    assert parsed.get_content_type() == "multipart/alternative"
    assert parsed.get_body(("plain",)).get_content().strip() == "Hello"
    assert parsed.get_body(("html",)).get_content().strip() == "<b>Hello</b>"
    again = to_mime(message, "noreply@cosmicac.test", date_s=1_800_000_000)
    assert again["Message-ID"] == parsed["Message-ID"]
    assert parsed["Message-ID"].endswith(".invitation@cosmicac.test>")
    assert "k1" not in parsed["Message-ID"]  # hashed, not shown
