"""The model server's HTTP API, in process through httpx's ASGITransport."""

from __future__ import annotations

import base64
import json
import math
import struct

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.inference.engines import ChatMessage
from agents.inference.engines._demo import DemoEngine
from agents.inference.server import create_app
from contracts.inference import MAX_BODY
from p2p.bodies import BodyBudget
from tests.examples import examples

ENGINE = DemoEngine()
NAME = "demo-served"
CHAT = {"model": NAME, "messages": [{"role": "user", "content": "Hello, who are you?"}]}


@pytest.fixture
async def client():
    app = create_app(ENGINE, served_name=NAME, max_model_len=512)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
        yield client


def events(body: str) -> list[dict | str]:
    """The SSE events of ``body``, checking the framing vLLM uses."""
    assert body.endswith("\n\n")
    out: list[dict | str] = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        out.append(data if data == "[DONE]" else json.loads(data))
    assert out[-1] == "[DONE]"
    return out


def chat_prompt_tokens(messages: list[dict]) -> int:
    prompt = ENGINE.chat_prompt([ChatMessage(m["role"], m["content"]) for m in messages])
    return len(ENGINE.tokenize(prompt))


async def test_health_is_200_with_empty_body(client: httpx.AsyncClient) -> None:
    response = await client.get("/health")
    assert response.status_code == 200
    assert response.content == b""


async def test_models_lists_the_served_name(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    assert [card["id"] for card in body["data"]] == [NAME]


async def test_chat_counts_tokens_with_the_tokenizer(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "seed": 3})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == NAME
    [choice] = body["choices"]
    assert choice["message"]["role"] == "assistant"
    text = choice["message"]["content"]
    assert text and choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] == chat_prompt_tokens(CHAT["messages"])
    assert usage["completion_tokens"] == len(ENGINE.tokenize(text))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    again = (await client.post("/v1/chat/completions", json={**CHAT, "seed": 3})).json()
    assert again["choices"][0]["message"]["content"] == text


async def test_chat_accepts_content_parts(client: httpx.AsyncClient) -> None:
    parts = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "who are you?"}]
    request = {"model": NAME, "messages": [{"role": "user", "content": parts}], "seed": 3}
    plain = (await client.post("/v1/chat/completions", json={**CHAT, "seed": 3})).json()
    split = (await client.post("/v1/chat/completions", json=request)).json()
    assert split["choices"] == plain["choices"]


@pytest.mark.parametrize("seed", [0, 7, 12345])
async def test_streamed_chat_matches_the_non_streamed_one(
    client: httpx.AsyncClient, seed: int
) -> None:
    request = {**CHAT, "seed": seed, "temperature": 0.8}
    whole = (await client.post("/v1/chat/completions", json=request)).json()
    response = await client.post(
        "/v1/chat/completions",
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = events(response.text)[:-1]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    *content, usage_chunk = chunks
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in content)
    assert text == whole["choices"][0]["message"]["content"]
    assert content[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == whole["usage"]
    assert usage_chunk["usage"]["completion_tokens"] == len(ENGINE.tokenize(text))


async def test_stream_without_include_usage_has_no_usage_chunk(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    chunks = events(response.text)[:-1]
    assert all(chunk["choices"] for chunk in chunks)
    assert all("usage" not in chunk for chunk in chunks)


async def test_max_tokens_finishes_with_length(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2


async def test_stop_string_cuts_the_answer(client: httpx.AsyncClient) -> None:
    whole = (await client.post("/v1/chat/completions", json=CHAT)).json()
    text = whole["choices"][0]["message"]["content"]
    stop = text[3:6]
    cut = (await client.post("/v1/chat/completions", json={**CHAT, "stop": stop})).json()
    assert cut["choices"][0]["message"]["content"] == text[: text.find(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


async def test_completions_plain_and_streamed(client: httpx.AsyncClient) -> None:
    request = {"model": NAME, "prompt": "Once upon a time", "max_tokens": 50, "seed": 1}
    whole = (await client.post("/v1/completions", json=request)).json()
    assert whole["object"] == "text_completion"
    text = whole["choices"][0]["text"]
    assert whole["usage"]["prompt_tokens"] == len(ENGINE.tokenize("Once upon a time"))
    assert whole["usage"]["completion_tokens"] == len(ENGINE.tokenize(text))
    response = await client.post(
        "/v1/completions",
        json={**request, "stream": True, "stream_options": {"include_usage": True}},
    )
    *content, usage_chunk = events(response.text)[:-1]
    assert all(chunk["object"] == "text_completion" for chunk in content)
    assert "".join(chunk["choices"][0]["text"] for chunk in content) == text
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == whole["usage"]


async def test_completions_default_to_16_tokens_and_take_token_ids(
    client: httpx.AsyncClient,
) -> None:
    ids = ENGINE.tokenize("Once upon a time")
    by_ids = (await client.post("/v1/completions", json={"model": NAME, "prompt": ids})).json()
    by_text = (
        await client.post("/v1/completions", json={"model": NAME, "prompt": "Once upon a time"})
    ).json()
    assert by_ids["choices"] == by_text["choices"]
    assert by_ids["usage"]["completion_tokens"] <= 16


async def test_embeddings_float_and_base64(client: httpx.AsyncClient) -> None:
    request = {"model": NAME, "input": ["red fox", "blue dog"]}
    body = (await client.post("/v1/embeddings", json=request)).json()
    assert [item["index"] for item in body["data"]] == [0, 1]
    first = body["data"][0]["embedding"]
    assert first == ENGINE.embed_sync("red fox")
    assert math.isclose(sum(x * x for x in first), 1.0, rel_tol=1e-9)
    tokens = len(ENGINE.tokenize("red fox")) + len(ENGINE.tokenize("blue dog"))
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    packed = (
        await client.post("/v1/embeddings", json={**request, "encoding_format": "base64"})
    ).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    floats = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(floats, first, strict=True))


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> str:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert error["param"] == param
    return error["message"]


async def test_bad_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", content=b"{not json")
    assert "not valid JSON" in assert_error(response, 400)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
async def test_json_nested_100000_deep_is_a_400_not_a_500(client: httpx.AsyncClient,
                                                          path: str) -> None:
    """Regression: ``json.loads`` raised RecursionError, answered as a 500."""
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"model":' + b"[" * 100_000):
        response = await client.post(path, content=body)
        assert "nests more than 64 levels" in assert_error(response, 400)


async def test_a_body_past_the_limit_is_a_413_before_it_is_read() -> None:
    app = create_app(ENGINE, served_name=NAME)
    app.state.bodies = BodyBudget(max_bytes=1 << 20, max_reads=2)
    sent = 0

    async def endless():
        nonlocal sent
        while True:
            sent += 1
            yield b" " * 65536

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://model") as http:
        response = await http.post("/v1/chat/completions", content=b"{}",
                                   headers={"content-length": str(MAX_BODY + 1)})
        assert_error(response, 413)
        response = await http.post("/v1/completions", content=endless())
        assert_error(response, 503)  # past the 1 MiB held at once, long before MAX_BODY
        assert sent <= 20
        response = await http.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200  # everything was given back
    assert (app.state.bodies.held, app.state.bodies.reading) == (0, 0)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"n": 2}, "n"),
        ({"max_tokens": 600}, "max_tokens"),  # beyond max_model_len=512
    ],
)
async def test_bad_fields_are_400(client: httpx.AsyncClient, change: dict, param: str) -> None:
    response = await client.post("/v1/chat/completions", json={**CHAT, **change})
    assert_error(response, 400, param)


async def test_missing_field_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"model": NAME})
    assert_error(response, 400, "prompt")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "model": "other"}),
        ("/v1/completions", {"model": "other", "prompt": "x"}),
        ("/v1/embeddings", {"model": "other", "input": "x"}),
    ],
)
async def test_unknown_model_is_404(client: httpx.AsyncClient, path: str, body: dict) -> None:
    message = assert_error(await client.post(path, json=body), 404, "model")
    assert "`other`" in message


async def test_token_ids_outside_the_vocabulary_are_400(client: httpx.AsyncClient) -> None:
    for ids in ([5, ENGINE.vocab_size], [-1]):
        response = await client.post("/v1/completions", json={"model": NAME, "prompt": ids})
        assert "outside the demo vocabulary" in assert_error(response, 400, "prompt")


async def test_several_prompts_are_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"model": NAME, "prompt": ["a", "b"]})
    assert_error(response, 400, "prompt")


@settings(max_examples=examples(25), deadline=None)
@given(
    content=st.text(max_size=40),
    seed=st.integers(min_value=0, max_value=2**31),
    max_tokens=st.integers(min_value=1, max_value=40),
    stop=st.none() | st.sampled_from([".", " the", "o", "xyz"]),
)
def test_any_stream_equals_the_whole_answer(
    content: str, seed: int, max_tokens: int, stop: str | None
) -> None:
    request = {
        "model": NAME,
        "messages": [{"role": "user", "content": content}],
        "seed": seed,
        "max_tokens": max_tokens,
        "stop": stop,
    }

    async def check() -> None:
        app = create_app(ENGINE, served_name=NAME)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://model") as client:
            whole = (await client.post("/v1/chat/completions", json=request)).json()
            streamed = await client.post(
                "/v1/chat/completions",
                json={**request, "stream": True, "stream_options": {"include_usage": True}},
            )
        *content_chunks, usage_chunk = events(streamed.text)[:-1]
        deltas = [chunk["choices"][0]["delta"].get("content", "") for chunk in content_chunks]
        assert "".join(deltas) == whole["choices"][0]["message"]["content"]
        assert (
            content_chunks[-1]["choices"][0]["finish_reason"]
            == whole["choices"][0]["finish_reason"]
        )
        assert usage_chunk["usage"] == whole["usage"]
        assert whole["usage"]["prompt_tokens"] == chat_prompt_tokens(request["messages"])
        assert 1 <= whole["usage"]["completion_tokens"] <= max_tokens

    trio.run(check)
