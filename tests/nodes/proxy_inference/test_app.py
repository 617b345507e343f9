"""The front's request parsing, I/O-free: the model of a JSON body or a multipart form,
and any bytes at all give a model or a 400, never anything else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.proxy_inference.app import HttpError, _form_field, _model_of_form, _model_of_json

BOUNDARY = "----cosmicac7MA4YWxkTrZu0gW"
FORM = "multipart/form-data; boundary=" + BOUNDARY


def form(*fields: tuple[str, bytes, str | None]) -> bytes:
    parts = []
    for name, value, filename in fields:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"'
                                                     if filename else "")
        parts.append(f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
                     + value + b"\r\n")
    return b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()


def test_the_model_of_a_json_body():
    assert _model_of_json(b'{"model": "chat", "stream": true}') == "chat"
    assert _model_of_json(b'{"\\u006dodel": "chat"}') == "chat"
    assert _model_of_json('{"model": "chat"}'.encode("utf-16")) == "chat"


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b"{" * 100_000,
                                  b'{"model": "m", "x": ' + b"[" * 65 + b"]" * 65 + b"}"])
def test_json_nested_too_deep_is_a_400_with_a_code(body):
    """Regression: a body nested 100,000 deep was a RecursionError (a 500)."""
    with pytest.raises(HttpError) as info:
        _model_of_json(body)
    assert info.value.status == 400 and info.value.body["error"]["code"] == "json_too_deep"


@pytest.mark.parametrize("body", [b"", b"{", b"[]", b'"chat"', b'{"model": 3}', b'{"model": ""}',
                                  b"\xff\xfe"])
def test_a_body_without_a_model_is_a_400(body):
    with pytest.raises(HttpError) as info:
        _model_of_json(body)
    assert info.value.status == 400 and info.value.body["error"]["code"] == "invalid_request"


def test_the_model_field_of_a_multipart_form_not_the_file():
    body = form(("file", b'name="model"\r\n\r\nfake', "a.wav"), ("model", b"whisper", None),
                ("language", b"en", None))
    assert _model_of_form(body, FORM) == "whisper"
    assert _form_field(body, FORM, "language") == "en"
    assert _form_field(body, FORM, "prompt") is None
    assert _form_field(body, 'multipart/form-data; boundary="' + BOUNDARY + '"', "model") == \
        "whisper"


def test_a_form_without_a_model_or_not_a_form_is_a_400():
    for body, content_type in [(form(("file", b"x", "a.wav")), FORM),
                               (b'{"model": "m"}', "application/json"),
                               (form(("model", b"m", None)), "multipart/form-data")]:
        with pytest.raises(HttpError) as info:
            _model_of_form(body, content_type)
        assert info.value.status == 400


@given(st.binary(max_size=512), st.sampled_from([FORM, "multipart/form-data; boundary=a",
                                                  "application/json"]))
def test_any_bytes_give_a_model_or_a_400(body, content_type):
    for parse in (lambda: _model_of_json(body), lambda: _model_of_form(body, content_type),
                  lambda: _model_of_json(b"[" * len(body) + body)):
        try:
            parse()
        except HttpError as exc:
            assert exc.status == 400
