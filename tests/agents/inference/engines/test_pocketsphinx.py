"""pocketsphinx-en (the extra 'models') hears espeak-ng's speech.

Recognition is tolerant by design: only "hello" must be heard in "hello
world". Skipped without the extra or espeak-ng, except in CI.
"""

from __future__ import annotations

import math

import pytest

from agents.inference.engines import SpeechEngine, decode_wav, load_engine
from tests.agents.inference.extras import need
from tests.agents.inference.support import running_server
from tests.agents.inference.wavs import spoken_wav

need("pocketsphinx")
need("numpy")


@pytest.fixture(scope="module")
def hello() -> bytes:
    return spoken_wav("hello world")


async def test_hears_hello_at_any_rate(hello: bytes) -> None:
    engine = load_engine("pocketsphinx-en")
    assert isinstance(engine, SpeechEngine)
    audio = decode_wav(hello)
    assert audio.rate == 22_050  # espeak-ng's rate: the engine resamples to 16 kHz
    heard = await engine.transcribe(audio)
    assert "hello" in heard.text.lower()
    assert heard.words and all(w.start < w.end <= audio.duration + 0.05 for w in heard.words)


def test_openai_client_transcribes_with_the_real_server(hello: bytes) -> None:
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)
    with running_server("pocketsphinx-en", "ears") as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=30, max_retries=0)
        heard = client.audio.transcriptions.create(
            model="ears", file=("hello.wav", hello, "audio/wav"), language="en"
        )
        assert "hello" in heard.text.lower()
        assert heard.usage is not None and heard.usage.type == "duration"
        assert heard.usage.seconds == math.ceil(decode_wav(hello).duration)
        with pytest.raises(openai.BadRequestError, match="does not support chat"):
            client.chat.completions.create(
                model="ears", messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(openai.BadRequestError, match="empty"):
            client.audio.transcriptions.create(model="ears", file=("e.wav", b"", "audio/wav"))
