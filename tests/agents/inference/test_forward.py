"""The sans-IO half of forwarding: usage asked for, SSE split into whole events,
usage read from answers; fuzzed, since every byte comes from a model server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.inference._forward import BadBody, SseSplitter, prepare, usage_of
from contracts.inference import Usage

from .stream_bodies import CONTENT_TYPES, VllmFields, request_bodies, server_reads


def test_a_streamed_request_always_asks_for_usage():
    body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
    prepared = prepare("/v1/chat/completions", "application/json", body)
    assert prepared.stream and prepared.strip_usage
    assert json.loads(prepared.body)["stream_options"] == {"include_usage": True}

    asked = json.dumps({"stream": True, "stream_options": {"include_usage": True}}).encode()
    prepared = prepare("/v1/completions", "application/json", asked)
    assert json.loads(prepared.body) == json.loads(asked) and not prepared.strip_usage


def test_other_requests_keep_their_bytes():
    for path, kind, body, sent_as in [
            ("/v1/embeddings", "application/json", b'{"stream": true}', "application/json"),
            ("/v1/embeddings", "text/plain", b'{"input": "x"}', "application/json"),
            ("/v1/audio/transcriptions", "multipart/form-data; boundary=x", b"--x--",
             "multipart/form-data; boundary=x")]:
        prepared = prepare(path, kind, body)
        assert (prepared.body, prepared.content_type, prepared.stream) == (body, sent_as, False)


#: The shapes that were billed 0: each a stream for the model server, each once
#: read as no stream by the agent, so the usage chunk was never asked for.
STREAM_SHAPES = [
    ("application/json", b'{"model":"m","\\u0073tream":true,"prompt":"hi"}'),
    ("application/json", b'{"model":"m","stream":1,"prompt":"hi"}'),
    ("application/json", b'{"model":"m","stream":"true","prompt":"hi"}'),
    ("text/plain", b'{"model":"m","stream":true,"prompt":"hi"}'),
    ("Application/JSON", b'{"model":"m","stream":true,"prompt":"hi"}'),
    ("application/json", b'{"model":"m","stream":false,"stream":true,"prompt":"hi"}'),
    ("application/json", b'\xef\xbb\xbf{"model":"m","stream":"YES","prompt":"hi"}'),
    ("application/json", '{"model":"m","stream":1.0,"prompt":"hi"}'.encode("utf-16")),
    ("", b'{"model":"m","stream":"on","stream_options":{"include_usage":"0"},"prompt":"hi"}'),
]


@pytest.mark.parametrize(("kind", "body"), STREAM_SHAPES)
def test_every_shape_of_a_stream_is_sent_as_one_canonical_stream_asking_for_usage(kind, body):
    for path in ("/v1/chat/completions", "/v1/completions"):
        prepared = prepare(path, kind, body)
        assert prepared.stream and prepared.strip_usage
        assert prepared.content_type == "application/json"
        sent = json.loads(prepared.body)
        assert sent["stream"] is True and sent["stream_options"]["include_usage"] is True
        assert sent["model"] == "m" and sent["prompt"] == "hi"


@pytest.mark.parametrize(("body", "stream"), [
    (b'{"stream": false, "stream_options": {"include_usage": true}}', False),
    (b'{"stream": null}', False),
    (b'{"stream": "off"}', False),
    (b'{"stream": 0}', False),
    (b'{"stream": true, "stream_options": null}', True),
    (b'{"stream": true, "stream_options": {"continuous_usage_stats": true}}', True),
])
def test_the_sent_body_says_what_was_decided(body, stream):
    prepared = prepare("/v1/chat/completions", "application/json", body)
    sent = json.loads(prepared.body)
    assert prepared.stream is stream and sent["stream"] is stream
    assert ("stream_options" in sent) is stream
    if stream:
        assert sent["stream_options"]["include_usage"] is True


@pytest.mark.parametrize(("body", "code", "param"), [
    (b'{"stream": tru', "invalid_json", None),
    (b"[1, 2]", "invalid_request", None),
    (b'"text"', "invalid_request", None),
    (b"\xff\xfe\xfd", "invalid_json", None),
    (b"[" * 100_000 + b"]" * 100_000, "json_too_deep", None),
    (b'{"stream": 2}', "invalid_request", "stream"),
    (b'{"stream": "maybe"}', "invalid_request", "stream"),
    (b'{"stream": [true]}', "invalid_request", "stream"),
    (b'{"stream": true, "stream_options": "yes"}', "invalid_request", "stream_options"),
    (b'{"stream": true, "stream_options": {"include_usage": 5}}', "invalid_request",
     "stream_options.include_usage"),
])
def test_a_body_whose_stream_cannot_be_read_is_refused_with_a_400(body, code, param):
    with pytest.raises(BadBody) as info:
        prepare("/v1/chat/completions", "application/json", body)
    frame = info.value.frame()
    assert frame.status == 400 and frame.done and frame.usage == Usage()
    error = json.loads(frame.data)["error"]
    assert (error["code"], error["param"]) == (code, param)


def test_usage_of_tokens_and_audio():
    assert usage_of(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4, '
                    b'"total_tokens": 7}}') == Usage(prompt_tokens=3, completion_tokens=4,
                                                     total_tokens=7)
    assert usage_of(b'{"text": "hi", "usage": {"type": "duration", "seconds": 2.5}}') == \
        Usage(audio_ms=2500)
    for bad in (b"", b"[]", b'{"usage": {"prompt_tokens": -1}}',
                b'{"usage": {"type": "duration", "seconds": "x"}}',
                b'{"usage": {"prompt_tokens": true}}', b'{"usage": {"total_tokens": 1e400}}'):
        assert usage_of(bad) is None


EVENTS = [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n',
          b'data: {"choices": [{"delta": {"content": "b"}}], "usage": null}\n\n',
          b'data: {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2, '
          b'"total_tokens": 4}}\n\n',
          b"data: [DONE]\n\n"]


@given(st.lists(st.integers(0, sum(map(len, EVENTS))), max_size=12), st.booleans())
def test_sse_events_survive_any_split_and_the_usage_chunk_is_kept_or_dropped(cuts, strip):
    stream = b"".join(EVENTS)
    splitter = SseSplitter(strip_usage=strip)
    out = b""
    previous = 0
    for cut in [*sorted(cuts), len(stream)]:
        out += splitter.feed(stream[previous:cut])
        previous = cut
    out += splitter.flush()
    expected = b"".join(e for i, e in enumerate(EVENTS) if not (strip and i == 2))
    assert out == expected
    assert splitter.usage == Usage(prompt_tokens=2, completion_tokens=2, total_tokens=4)
    assert splitter.pieces == 2  # what a stream without usage would be billed


@given(st.binary(max_size=2000), st.integers(0, 100_000))
def test_any_bytes_from_a_server_are_passed_on_or_ignored_never_raise(data, depth):
    nested = b"[" * depth + data + b"]" * depth
    splitter = SseSplitter(strip_usage=True)
    splitter.feed(data)
    splitter.feed(b"data: " + nested + b"\n\n")
    splitter.flush()
    usage_of(data)
    usage_of(nested)


def wav_bytes(seconds: float, rate: int = 16000) -> bytes:
    import io
    import wave

    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(b"\0\0" * int(seconds * rate))
    return out.getvalue()


def multipart(audio: bytes, boundary: str = "b0und4ry") -> tuple[str, bytes]:
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
            f"speech\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n").encode()
    body += audio + f"\r\n--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", body


def test_a_transcription_without_usage_is_billed_by_its_wav_duration():
    from agents.inference._forward import audio_usage

    kind, body = multipart(wav_bytes(2.5, rate=8000))
    assert audio_usage(kind, body) == Usage(audio_ms=2500)
    assert audio_usage(kind, multipart(b"not a wav")[1]) is None
    assert audio_usage("application/json", body) is None


@given(st.binary(max_size=3000))
def test_audio_usage_of_any_bytes_never_raises(data):
    from agents.inference._forward import audio_usage

    audio_usage("multipart/form-data; boundary=x", data)
    audio_usage("multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data; "
                b"name=\"file\"\r\n\r\n" + data + b"\r\n--x--\r\n")


# --- streams billed 0, as a class: the agent decides "stream" as the model servers do ---


@given(request_bodies("/v1/chat/completions"), st.sampled_from(CONTENT_TYPES))
def test_the_agent_reads_stream_as_the_model_servers_do(body, kind):
    from agents.inference.server import ChatRequest

    local, vllm = server_reads(ChatRequest, body), server_reads(VllmFields, body)
    try:
        prepared = prepare("/v1/chat/completions", kind, body)
    except BadBody:
        assert local is None  # refused: the local server refuses it too
        return
    assert prepared.stream is local is vllm
    sent = json.loads(prepared.body)
    # The server gets a body whose stream-ness no reader can take otherwise.
    assert sent["stream"] is prepared.stream
    assert server_reads(ChatRequest, prepared.body) is server_reads(VllmFields, prepared.body) \
        is prepared.stream
    if prepared.stream:
        assert ChatRequest.model_validate(sent).usage_asked
        assert VllmFields.model_validate(sent).stream_options.include_usage is True
