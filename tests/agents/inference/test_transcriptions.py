"""POST /v1/audio/transcriptions in process (demo engine), and what engines without speech say."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

import httpx
import pytest

from agents.inference.engines import (
    Audio,
    ChatMessage,
    SpeechEngine,
    Step,
    TextEngine,
    Transcript,
)
from agents.inference.engines._demo import DemoEngine
from agents.inference.server import create_app
from tests.agents.inference.wavs import tone_wav

NAME = "ears"
DEMO = DemoEngine()


class SpeechOnly:
    """A speech engine with no text side (as pocketsphinx-en is), hearing what demo hears."""

    name = "speech-only"
    languages: frozenset[str] | None = frozenset({"en"})

    async def transcribe(
        self, audio: Audio, *, language: str | None = None, temperature: float = 0.0
    ) -> Transcript:
        return await DEMO.transcribe(audio, language=language, temperature=temperature)


class TextOnly:
    """A language model without speech or embeddings (as gemma-3-270m is), speaking demo."""

    name = "text-only"
    embedding_dim: int | None = None
    max_model_len: int | None = 256

    def tokenize(self, text: str) -> list[int]:
        return DEMO.tokenize(text)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return DEMO.detokenize(token_ids)

    def chat_prompt(self, messages: Sequence[ChatMessage]) -> str:
        return DEMO.chat_prompt(messages)

    def generate(self, prompt_tokens: Sequence[int], **kwargs) -> AsyncGenerator[Step, None]:
        return DEMO.generate(prompt_tokens, **kwargs)

    async def embed(self, text: str) -> list[float]:
        raise AssertionError("the server must not ask")


def client_for(engine) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=create_app(engine, served_name=NAME))
    return httpx.AsyncClient(transport=transport, base_url="http://model")


def form(**fields: str) -> dict[str, str]:
    return {"model": NAME, **fields}


def assert_error(response: httpx.Response, status: int, param: str | None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (status, param)
    return error["message"]


def test_the_protocols_tell_engines_apart() -> None:
    assert isinstance(DEMO, TextEngine) and isinstance(DEMO, SpeechEngine)
    assert isinstance(SpeechOnly(), SpeechEngine) and not isinstance(SpeechOnly(), TextEngine)
    assert isinstance(TextOnly(), TextEngine) and not isinstance(TextOnly(), SpeechEngine)


async def test_json_text_and_verbose_json() -> None:
    wav = tone_wav(2.25, rate=22_050, channels=2)
    files = {"file": ("a.wav", wav, "audio/wav")}
    async with client_for(DEMO) as client:
        plain = await client.post("/v1/audio/transcriptions", data=form(), files=files)
        text = await client.post(
            "/v1/audio/transcriptions", data=form(response_format="text"), files=files
        )
        verbose = await client.post(
            "/v1/audio/transcriptions",
            data=form(response_format="verbose_json", language="en"),
            files=files,
        )
    assert plain.status_code == 200, plain.text
    said = "2.25 seconds of stereo audio at 22050 Hz."
    # Metered in whole audio seconds, rounded up, as vLLM does.
    assert plain.json() == {"text": said, "usage": {"type": "duration", "seconds": 3}}
    assert plain.headers["x-audio-seconds"] == "3"
    assert text.headers["content-type"].startswith("text/plain")
    assert (text.text, text.headers["x-audio-seconds"]) == (said, "3")
    body = verbose.json()
    assert body["duration"] == 2.25 and body["language"] == "en" and body["text"] == said
    assert body["segments"][0]["start"] == 0.0 and body["segments"][0]["end"] == 2.25
    assert body["usage"] == {"type": "duration", "seconds": 3}


@pytest.mark.parametrize(
    ("kwargs", "param", "message"),
    [
        ({"files": {"file": ("a.mp3", b"ID3\x04" + bytes(64), "audio/mpeg")}}, "file", "not a WAV"),
        ({"files": {"file": ("a.wav", b"", "audio/wav")}}, "file", "empty"),
        ({"files": {"other": ("a.wav", tone_wav(0.1), "audio/wav")}}, "file", "required"),
        ({"data": form(response_format="srt")}, "response_format", "response_format"),
        ({"data": form(temperature="2")}, "temperature", "temperature"),
        ({"data": {}}, "model", "model"),
    ],
)
async def test_bad_forms_are_400(kwargs: dict, param: str, message: str) -> None:
    kwargs.setdefault("data", form())
    kwargs.setdefault("files", {"file": ("a.wav", tone_wav(0.1), "audio/wav")})
    async with client_for(DEMO) as client:
        response = await client.post("/v1/audio/transcriptions", **kwargs)
    assert message in assert_error(response, 400, param)


async def test_not_multipart_or_broken_multipart_is_400() -> None:
    async with client_for(DEMO) as client:
        as_json = await client.post("/v1/audio/transcriptions", json={"model": NAME})
        assert "multipart/form-data" in assert_error(as_json, 400, None)
        broken = await client.post(
            "/v1/audio/transcriptions",
            content=b"--x\r\nContent-Disposition: form-data\r\n\r\nno name\r\n--x--\r\n",
            headers={"content-type": "multipart/form-data; boundary=x"},
        )
        assert "bad multipart body" in assert_error(broken, 400, None)
        no_boundary = await client.post(
            "/v1/audio/transcriptions",
            content=b"whatever",
            headers={"content-type": "multipart/form-data"},
        )
        assert "bad multipart body" in assert_error(no_boundary, 400, None)


async def test_unknown_model_is_404() -> None:
    files = {"file": ("a.wav", tone_wav(0.1), "audio/wav")}
    async with client_for(DEMO) as client:
        response = await client.post(
            "/v1/audio/transcriptions", data={"model": "other"}, files=files
        )
    assert "`other`" in assert_error(response, 404, "model")


async def test_a_speech_engine_refuses_text_endpoints() -> None:
    chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}]}
    async with client_for(SpeechOnly()) as client:
        for path, body in [
            ("/v1/chat/completions", chat),
            ("/v1/completions", {"model": NAME, "prompt": "hi"}),
            ("/v1/embeddings", {"model": NAME, "input": "hi"}),
        ]:
            message = assert_error(await client.post(path, json=body), 400, "model")
            assert "does not support" in message
        files = {"file": ("a.wav", tone_wav(0.5), "audio/wav")}
        heard = await client.post("/v1/audio/transcriptions", data=form(), files=files)
        assert heard.json()["usage"]["seconds"] == 1
        french = await client.post(
            "/v1/audio/transcriptions", data=form(language="fr"), files=files
        )
        assert "en only" in assert_error(french, 400, "language")


async def test_a_text_engine_refuses_speech_and_missing_embeddings() -> None:
    files = {"file": ("a.wav", tone_wav(0.5), "audio/wav")}
    async with client_for(TextOnly()) as client:
        heard = await client.post("/v1/audio/transcriptions", data=form(), files=files)
        assert "does not support audio transcriptions" in assert_error(heard, 400, "model")
        embedded = await client.post("/v1/embeddings", json={"model": NAME, "input": "x"})
        assert "does not support embeddings" in assert_error(embedded, 400, "model")
        chat = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        # The engine's own context limit (256) caps the server's (4096 by default).
        too_long = await client.post("/v1/chat/completions", json={**chat, "max_tokens": 300})
        assert "256" in assert_error(too_long, 400, "max_tokens")
