"""``demo``: a small deterministic engine that needs nothing, for fast tests.

It is a real engine in the ways the server and the proxy can observe, and a
fake one in what it says:

Tokenizer
    Text is split into pieces by one regular expression: a chat marker
    (``<|system|>``, ``<|user|>``, ``<|assistant|>``), a run of word
    characters, a run of whitespace, or one other character. A piece found in
    the built-in vocabulary is one token; any other piece becomes one token
    per UTF-8 byte (ids 0 to 255, the byte fallback). ``detokenize(tokenize(t))
    == t`` for every string, and every count in ``usage`` is
    ``len(tokenize(...))`` of the text concerned.

Generation
    The answer is a "sentence" of vocabulary words separated by single spaces
    and ended by ``"."``; its words and its length (8 to 32 tokens) come from
    BLAKE2b over the prompt's token ids, so the same prompt gives the same
    answer. With ``temperature > 0`` the seed (0 when absent) and the
    temperature are hashed in as well, so different seeds answer
    differently, but each seed always the same. Generated tokens are exactly
    the tokenization of the generated text, so ``completion_tokens`` equals
    the tokenizer's count of the text (unless a stop string cut the last
    token, which is still counted, as vLLM counts it).

Embeddings
    The sum, over the text's tokens, of a fixed pseudo-random vector per
    token id (BLAKE2b of the id), normalised to length 1.

Transcription
    It hears nothing: the transcript describes the audio it was given
    ("2.50 seconds of mono audio at 22050 Hz."), so tests of the
    transcription path (the server's form handling, the proxy's metering
    in audio seconds) run without the ``models`` extra.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import AsyncGenerator, Sequence

import trio

from agents.inference.engines import Audio, ChatMessage, FinishReason, Step, Transcript

__all__ = ["DemoEngine"]

_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>")
_PIECES = re.compile(
    "|".join(re.escape(marker) for marker in _MARKERS) + r"|\w+|\s+|[^\w\s]",
    re.UNICODE,
)

# What the demo says: plain lowercase words, all matched whole by ``\w+``.
_WORD_TEXT = (
    "the a an and or but of to in on at for with from by as is are was be "
    "model token stream answer question node peer swarm relay agent cluster "
    "gpu cpu memory disk network packet route key value state replica "
    "quick brown fox jumps over lazy dog lorem ipsum dolor sit amet "
    "hello world demo engine deterministic reply text word sentence "
    "red green blue small large fast slow early late always never "
    "yes no maybe one two three four five six seven eight nine ten"
)
_WORDS = _WORD_TEXT.split()
_OTHER = [*_MARKERS, " ", "\n", "\n\n", ".", ",", "?", "!", ":", ";", "'", '"', "-", "(", ")"]

_BYTE_TOKENS = 256
EOS_ID = _BYTE_TOKENS  # reserved; never emitted as text
_VOCAB: list[str] = [*_OTHER, *dict.fromkeys(_WORDS)]
_ID_OF: dict[str, int] = {piece: _BYTE_TOKENS + 1 + i for i, piece in enumerate(_VOCAB)}
_PIECE_OF: dict[int, str] = {token: piece for piece, token in _ID_OF.items()}
_WORD_IDS: tuple[int, ...] = tuple(_ID_OF[word] for word in dict.fromkeys(_WORDS))
_SPACE_ID = _ID_OF[" "]
_PERIOD_ID = _ID_OF["."]

_MIN_LEN, _MAX_LEN = 8, 40
_EMBEDDING_DIM = 64


def _blake(*parts: bytes, size: int = 32) -> bytes:
    digest = hashlib.blake2b(digest_size=size, person=b"cosmicac-demo")
    for part in parts:
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    return digest.digest()


class DemoEngine:
    """The built-in deterministic engine (see the module docstring for what it does)."""

    name = "demo"
    embedding_dim = _EMBEDDING_DIM
    max_model_len: int | None = None
    languages: frozenset[str] | None = None
    vocab_size = _BYTE_TOKENS + 1 + len(_VOCAB)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``: vocabulary pieces, else one id per UTF-8 byte."""
        ids: list[int] = []
        for match in _PIECES.finditer(text):
            piece = match.group()
            token = _ID_OF.get(piece)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(piece.encode())
        return ids

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids``; byte runs that are not valid UTF-8 decode as U+FFFD."""
        out: list[str] = []
        pending = bytearray()
        for token in token_ids:
            if 0 <= token < _BYTE_TOKENS:
                pending.append(token)
                continue
            if pending:
                out.append(pending.decode(errors="replace"))
                pending.clear()
            if token == EOS_ID:
                continue
            piece = _PIECE_OF.get(token)
            if piece is None:
                raise ValueError(f"token id {token} is outside the demo vocabulary")
            out.append(piece)
        if pending:
            out.append(pending.decode(errors="replace"))
        return "".join(out)

    def chat_prompt(self, messages: Sequence[ChatMessage]) -> str:
        """``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n`` to answer.

        Roles other than system/user/assistant (tool, developer) are written as
        user turns, so the template stays within the vocabulary's markers.
        """
        parts: list[str] = []
        for message in messages:
            role = message.role if message.role in ("system", "user", "assistant") else "user"
            parts.append(f"<|{role}|>\n{message.content}\n")
        parts.append("<|assistant|>\n")
        return "".join(parts)

    def answer_ids(
        self, prompt_tokens: Sequence[int], *, temperature: float = 1.0, seed: int | None = None
    ) -> list[int]:
        """The whole answer's token ids before ``max_tokens`` and stop strings apply."""
        key = [struct.pack(f">{len(prompt_tokens)}I", *prompt_tokens)]
        if temperature > 0:
            key += [str(seed or 0).encode(), repr(float(temperature)).encode()]
        root = _blake(*key)
        words = (_MAX_LEN - _MIN_LEN + 1) // 2
        n_words = 1 + int.from_bytes(root[:4], "big") % max(1, words)  # 1..16 words
        ids: list[int] = []
        for i in range(n_words):
            pick = int.from_bytes(_blake(root, i.to_bytes(4, "big"), size=8), "big")
            if i:
                ids.append(_SPACE_ID)
            ids.append(_WORD_IDS[pick % len(_WORD_IDS)])
        ids.append(_PERIOD_ID)
        while len(ids) < _MIN_LEN:  # short answers trail off: "word. word."
            pick = int.from_bytes(_blake(root, len(ids).to_bytes(4, "big"), size=8), "big")
            ids += [_SPACE_ID, _WORD_IDS[pick % len(_WORD_IDS)], _PERIOD_ID]
        return ids

    async def generate(
        self,
        prompt_tokens: Sequence[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        chat: bool = False,
    ) -> AsyncGenerator[Step, None]:
        """Yield the answer token by token; the last :class:`Step` carries the finish reason.

        ``chat`` changes nothing: the demo's answers need no trimming.

        ``"stop"`` when the answer ended or a stop string appeared (the stop
        string itself is not part of the text), ``"length"`` when
        ``max_tokens`` ran out first. ``max_tokens`` must be at least 1.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
        ids = self.answer_ids(prompt_tokens, temperature=temperature, seed=seed)
        finish: FinishReason = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        pieces = [_PIECE_OF[token] for token in ids]
        # The answer is known whole, so stop strings are found in it up front: the
        # last token is the one completing the earliest match, the text ends before it.
        full = "".join(pieces)
        hits = [(at + len(s), at) for s in stop if s and (at := full.find(s)) >= 0]
        cut = len(full)
        if hits:
            end, cut = min(hits)
            finish = "stop"
            count, length = 0, 0
            while length < end:
                length += len(pieces[count])
                count += 1
            ids = ids[:count]
        start = 0
        for index, token in enumerate(ids):
            await trio.lowlevel.checkpoint()
            stop_at = start + len(pieces[index])
            text = full[min(start, cut) : min(stop_at, cut)]
            start = stop_at
            yield Step(token, text, finish if index == len(ids) - 1 else None)

    async def embed(self, text: str) -> list[float]:
        """A unit vector of :attr:`embedding_dim` floats, the same for the same text."""
        await trio.lowlevel.checkpoint()
        return self.embed_sync(text)

    async def transcribe(
        self, audio: Audio, *, language: str | None = None, temperature: float = 0.0
    ) -> Transcript:
        """A sentence describing ``audio``: its duration, channels and sample rate."""
        await trio.lowlevel.checkpoint()
        layout = {1: "mono", 2: "stereo"}.get(audio.channels, f"{audio.channels}-channel")
        text = f"{audio.duration:.2f} seconds of {layout} audio at {audio.rate} Hz."
        return Transcript(text=text, language=language or "en")

    def embed_sync(self, text: str) -> list[float]:
        """:meth:`embed` without the checkpoint (it needs no thread)."""
        total = [0.0] * _EMBEDDING_DIM
        for token in self.tokenize(text) or [EOS_ID]:
            raw = _blake(b"embed", token.to_bytes(4, "big"), size=_EMBEDDING_DIM)
            for i, byte in enumerate(raw):
                total[i] += byte / 127.5 - 1.0
        norm = math.sqrt(sum(x * x for x in total))
        if norm == 0.0:  # tokens cancelled out exactly: fall back to the first axis
            return [1.0] + [0.0] * (_EMBEDDING_DIM - 1)
        return [x / norm for x in total]
