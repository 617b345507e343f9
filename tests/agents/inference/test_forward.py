"""The sans-IO half of forwarding: usage asked for, SSE split into whole events,
usage read from answers; fuzzed, since every byte comes from a model server."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agents.inference._forward import SseSplitter, prepare, usage_of
from contracts.inference import Usage


def test_a_streamed_request_always_asks_for_usage():
    body = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
    prepared = prepare("/v1/chat/completions", body)
    assert prepared.stream and prepared.strip_usage
    assert json.loads(prepared.body)["stream_options"] == {"include_usage": True}

    asked = json.dumps({"stream": True, "stream_options": {"include_usage": True}}).encode()
    prepared = prepare("/v1/completions", asked)
    assert prepared.body == asked and not prepared.strip_usage


def test_other_requests_pass_unchanged():
    for path, body in [("/v1/chat/completions", b'{"stream": false}'),
                       ("/v1/embeddings", b'{"stream": true}'),
                       ("/v1/chat/completions", b"[1, 2]"),
                       ("/v1/chat/completions", b'{"stream": tru')]:
        prepared = prepare(path, body)
        assert prepared.body == body and not prepared.stream


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


@given(st.binary(max_size=2000))
def test_any_bytes_from_a_server_are_passed_on_or_ignored_never_raise(data):
    splitter = SseSplitter(strip_usage=True)
    splitter.feed(data)
    splitter.flush()
    usage_of(data)


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
