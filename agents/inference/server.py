"""The ``local`` model server: an engine behind vLLM's OpenAI-compatible HTTP API.

agent-inference starts it as a subprocess (``python -m agents.inference.server
--model demo --port N --served-name NAME``), waits for ``GET /health`` to
answer 200, and the proxy reaches it through the agent exactly as it reaches
vLLM. So it speaks vLLM's shapes (../shared/reference §4):

- ``GET /health``: 200 with an empty body (the engine is loaded before the
  socket opens, so a listening server is a healthy one).
- ``GET /v1/models``: the one served name.
- ``POST /v1/chat/completions`` and ``POST /v1/completions``: non-streaming
  with ``usage``, or SSE (``data: {json}\\n\\n`` … ``data: [DONE]\\n\\n``) with
  a final ``choices: []`` usage chunk when ``stream_options.include_usage``.
  Token counts are the engine tokenizer's, never estimates.
- ``POST /v1/embeddings``: floats, or base64 float32 (the openai client's default).
- ``POST /v1/audio/transcriptions``: OpenAI's multipart form (``file``,
  ``model``, ``response_format`` json|text|verbose_json, ``language``,
  ``temperature``); 16-bit PCM WAV at any rate. ``usage`` is audio seconds,
  ``{"type": "duration", "seconds": N}`` with N the duration rounded up to a
  whole second, as vLLM meters it; the ``text`` format carries the same number
  in the ``x-audio-seconds`` header.

Errors are OpenAI-shaped, ``{"error": {"message", "type", "param", "code"}}``:
400 for bad JSON (nested deeper than ``p2p.bodies.MAX_JSON_DEPTH`` too),
fields or audio, and for an endpoint the engine does not offer (chat on a
speech model, transcription or embeddings on a model without them); 404 for
a model name that is not served; 413, 408 and 503 for a body too large, too
slow, or one too many at once (:mod:`._request_body`). A JSON body is read whatever
its content type; ``stream`` is read as :mod:`._streaming` reads it, the rules
the agent decides by before it forwards.

The ASGI app (:func:`create_app`) is Starlette; :func:`serve_model` runs it on
the lean HTTP/1.1 server of :mod:`p2p.httpserver` (httptools under trio; the
other HTTP services stay on hypercorn's trio worker, DESIGN.md §2).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import math
import secrets
import struct
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Sequence
from contextlib import aclosing
from typing import Any, Literal, TypeVar

import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from agents.inference.engines import (
    BadAudio,
    ChatMessage,
    Engine,
    EngineError,
    SpeechEngine,
    Step,
    TextEngine,
    Transcript,
    decode_wav,
    load_engine,
)
from agents.inference.engines._audio import MAX_AUDIO_BYTES
from contracts.inference import MAX_BODY
from p2p.bodies import JsonBodyError, loads_bounded
from p2p.http import serve_asgi

from ._openai_errors import OpenAIError, guarded
from ._request_body import install_budget, read_bounded, read_form_bounded
from ._serving import ServerBindError, run_until_signalled
from ._streaming import StreamFields

__all__ = [
    "DEFAULT_MAX_MODEL_LEN",
    "ModelServerBindError",
    "create_app",
    "main",
    "serve_model",
]

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)

DEFAULT_MAX_MODEL_LEN = 4096
_CHAT_DEFAULT_MAX_TOKENS = 256
_COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions


# --- request models (pydantic at the boundary; unknown OpenAI fields are ignored) ---


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Request):
    type: str
    text: str = ""


class Message(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if part.type == "text")


class _Generation(StreamFields):
    """A chat's or a completion's fields (``stream`` read as the agent reads it)."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Generation):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int]


class EmbeddingRequest(_Request):
    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"


class TranscriptionForm(_Request):
    """The form fields of ``/v1/audio/transcriptions`` other than ``file``."""

    model: str
    response_format: Literal["json", "text", "verbose_json"] = "json"
    language: str | None = Field(default=None, pattern=r"^[A-Za-z]{2,3}(-[A-Za-z0-9]+)?$")
    temperature: float = Field(default=0.0, ge=0.0, le=1.0)
    prompt: str | None = None


# --- errors ---


async def _parse(request: Request, model: type[_M]) -> _M:
    """The JSON body as ``model``: any content type, nesting bounded (``MAX_JSON_DEPTH``)."""
    raw = await read_bounded(request, MAX_BODY)
    try:
        data = loads_bounded(raw)
    except JsonBodyError as exc:
        raise OpenAIError(400, str(exc)) from None
    return _validate(model, data)


def _validate(model: type[_M], data: Any) -> _M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise OpenAIError(400, f"{param or 'body'}: {first['msg']}", param=param) from None


# --- the app ---


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class _Api:
    def __init__(self, engine: Engine, served_name: str, max_model_len: int) -> None:
        self.engine = engine
        self.text = engine if isinstance(engine, TextEngine) else None
        self.speech = engine if isinstance(engine, SpeechEngine) else None
        self.served_name = served_name
        if self.text is not None and self.text.max_model_len is not None:
            max_model_len = min(max_model_len, self.text.max_model_len)
        self.max_model_len = max_model_len
        self.created = int(time.time())

    def _check_model(self, model: str) -> None:
        if model != self.served_name:
            raise OpenAIError(404, f"The model `{model}` does not exist.", param="model")

    def _unsupported(self, what: str) -> OpenAIError:
        return OpenAIError(
            400,
            f"The model `{self.served_name}` ({self.engine.name}) does not support {what}.",
            param="model",
        )

    def _text_engine(self, model: str, what: str) -> TextEngine:
        self._check_model(model)
        if self.text is None:
            raise self._unsupported(what)
        return self.text

    def _check_generation(self, body: _Generation, prompt_len: int, max_tokens: int) -> None:
        if body.n != 1:
            raise OpenAIError(400, f"n: only n=1 is supported, not {body.n}", param="n")
        if prompt_len + max_tokens > self.max_model_len:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens; the "
                f"request has {prompt_len} prompt tokens and max_tokens={max_tokens}.",
                param="max_tokens",
            )

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.served_name,
            "object": "model",
            "created": self.created,
            "owned_by": "cosmicac",
            "root": self.engine.name,
            "max_model_len": self.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def chat(self, request: Request) -> Response:
        body = await _parse(request, ChatRequest)
        engine = self._text_engine(body.model, "chat completions")
        messages = [ChatMessage(m.role, m.text()) for m in body.messages]
        prompt = engine.tokenize(engine.chat_prompt(messages))
        max_tokens = body.max_completion_tokens or body.max_tokens or _CHAT_DEFAULT_MAX_TOKENS
        self._check_generation(body, len(prompt), max_tokens)
        return await self._respond(engine, body, prompt, max_tokens, chat=True)

    async def completions(self, request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        engine = self._text_engine(body.model, "completions")
        if isinstance(body.prompt, str):
            prompt = engine.tokenize(body.prompt)
        elif body.prompt and all(isinstance(p, int) for p in body.prompt):
            prompt = [int(p) for p in body.prompt]
            try:
                engine.detokenize(prompt)
            except ValueError as exc:
                raise OpenAIError(400, f"prompt: {exc}", param="prompt") from None
        elif len(body.prompt) == 1:
            prompt = engine.tokenize(str(body.prompt[0]))
        else:
            raise OpenAIError(400, "prompt: give one prompt (a string or token ids)",
                              param="prompt")
        max_tokens = body.max_tokens or _COMPLETION_DEFAULT_MAX_TOKENS
        self._check_generation(body, len(prompt), max_tokens)
        return await self._respond(engine, body, prompt, max_tokens, chat=False)

    async def embeddings(self, request: Request) -> Response:
        body = await _parse(request, EmbeddingRequest)
        engine = self._text_engine(body.model, "embeddings")
        if engine.embedding_dim is None:
            raise self._unsupported("embeddings")
        texts = [body.input] if isinstance(body.input, str) else body.input
        data: list[dict[str, Any]] = []
        prompt_tokens = 0
        for index, text in enumerate(texts):
            tokens = len(engine.tokenize(text))
            if tokens > self.max_model_len:
                raise OpenAIError(
                    400,
                    f"input {index} has {tokens} tokens, more than this model's maximum "
                    f"context length of {self.max_model_len} tokens.",
                    param="input",
                )
            prompt_tokens += tokens
            vector = await engine.embed(text)
            embedding: list[float] | str = vector
            if body.encoding_format == "base64":
                packed = struct.pack(f"<{len(vector)}f", *vector)
                embedding = base64.b64encode(packed).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": self.served_name,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            }
        )

    async def transcriptions(self, request: Request) -> Response:
        fields, data = await _read_form(request)
        self._check_model(fields.model)
        if self.speech is None:
            raise self._unsupported("audio transcriptions")
        if data is None:
            raise OpenAIError(400, "file: an audio file is required (a form field)", param="file")
        if len(data) > MAX_AUDIO_BYTES:
            raise OpenAIError(
                400, f"file: larger than {MAX_AUDIO_BYTES // 2**20} MB", param="file"
            )
        try:
            audio = decode_wav(data)
        except BadAudio as exc:
            raise OpenAIError(400, f"file: {exc}", param="file") from None
        language = fields.language.lower().split("-")[0] if fields.language else None
        known = self.speech.languages
        if language is not None and known is not None and language not in known:
            raise OpenAIError(
                400,
                f"language: {self.engine.name} transcribes {', '.join(sorted(known))} only, "
                f"not {fields.language!r}",
                param="language",
            )
        transcript = await self.speech.transcribe(
            audio, language=language, temperature=fields.temperature
        )
        seconds = math.ceil(audio.duration)
        headers = {"x-audio-seconds": str(seconds)}
        usage = {"type": "duration", "seconds": seconds}
        if fields.response_format == "text":
            return PlainTextResponse(transcript.text, headers=headers)
        if fields.response_format == "json":
            return JSONResponse({"text": transcript.text, "usage": usage}, headers=headers)
        return JSONResponse(
            _verbose(transcript, audio.duration, fields.temperature, usage), headers=headers
        )

    async def _respond(
        self,
        engine: TextEngine,
        body: _Generation,
        prompt: Sequence[int],
        max_tokens: int,
        *,
        chat: bool,
    ) -> Response:
        steps = engine.generate(
            prompt,
            max_tokens=max_tokens,
            temperature=body.temperature,
            seed=body.seed,
            stop=body.stops(),
            chat=chat,
        )
        ident = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        created = int(time.time())
        if body.stream:
            stream = self._stream(
                steps, ident, created, len(prompt), chat=chat, include_usage=body.usage_asked
            )
            return StreamingResponse(
                stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        pieces: list[str] = []
        finish = None
        count = 0
        # aclosing: an engine holds its model while generating; give it back now, not at GC.
        async with aclosing(steps):
            async for step in steps:
                pieces.append(step.text)
                finish = step.finish_reason
                count += 1
        text = "".join(pieces)
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": None,
                "finish_reason": finish,
                "message": {"role": "assistant", "content": text},
            }
        else:
            choice = {"index": 0, "logprobs": None, "finish_reason": finish, "text": text}
        return JSONResponse(
            {
                "id": ident,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": self.served_name,
                "choices": [choice],
                "usage": _usage(len(prompt), count),
            }
        )

    async def _stream(
        self,
        steps: AsyncGenerator[Step, None],
        ident: str,
        created: int,
        prompt_len: int,
        *,
        chat: bool,
        include_usage: bool,
    ) -> AsyncIterator[bytes]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            return _sse(
                {
                    "id": ident,
                    "object": obj,
                    "created": created,
                    "model": self.served_name,
                    "choices": choices,
                    **extra,
                }
            )

        if chat:
            first = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            yield chunk([first])
        count = 0
        async with aclosing(steps):
            async for step in steps:
                count += 1
                if not step.text and step.finish_reason is None:
                    continue  # text held back (it may begin a stop string): nothing to send
                if chat:
                    choice: dict[str, Any] = {"index": 0, "delta": {"content": step.text}}
                else:
                    choice = {"index": 0, "text": step.text}
                choice.update(logprobs=None, finish_reason=step.finish_reason)
                yield chunk([choice])
        if include_usage:
            yield chunk([], usage=_usage(prompt_len, count))
        yield _sse("[DONE]")


async def _read_form(request: Request) -> tuple[TranscriptionForm, bytes | None]:
    """The transcription form's fields and file (at most one byte over the cap).

    Anything wrong with the form is a 400 saying what.
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise OpenAIError(
            400, f"send multipart/form-data with a 'file' field, not {kind or 'no content type'}"
        )
    too_large = OpenAIError(400, f"file: larger than {MAX_AUDIO_BYTES // 2**20} MB",
                            param="file")
    form = await read_form_bounded(request, MAX_AUDIO_BYTES + 2**20, too_large=too_large)
    try:  # closes spooled files
        fields = _validate(
            TranscriptionForm, {k: v for k, v in form.multi_items() if isinstance(v, str)}
        )
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            return fields, None
        return fields, await upload.read(MAX_AUDIO_BYTES + 1)
    finally:
        await form.close()


def _verbose(
    transcript: Transcript, duration: float, temperature: float, usage: dict[str, Any]
) -> dict[str, Any]:
    """OpenAI's ``verbose_json``: one segment for the whole audio, and the word times.

    Whisper's per-segment figures (``avg_logprob``, ``compression_ratio``,
    ``no_speech_prob``, ``tokens``) are left out rather than made up: these
    engines compute none of them.
    """
    segment = {
        "id": 0,
        "seek": 0,
        "start": 0.0,
        "end": round(duration, 3),
        "text": transcript.text,
        "temperature": temperature,
    }
    return {
        "task": "transcribe",
        "language": transcript.language,
        "duration": round(duration, 3),
        "text": transcript.text,
        "segments": [segment] if transcript.text else [],
        "words": [
            {"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)}
            for w in transcript.words
        ],
        "usage": usage,
    }


def create_app(
    engine: Engine,
    *,
    served_name: str | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> Starlette:
    """The ASGI app serving ``engine`` under ``served_name`` (default: the engine's name)."""
    api = _Api(engine, served_name or engine.name, max_model_len)

    routes = [
        Route("/health", guarded(api.health), methods=["GET"]),
        Route("/v1/models", guarded(api.models), methods=["GET"]),
        Route("/v1/chat/completions", guarded(api.chat), methods=["POST"]),
        Route("/v1/completions", guarded(api.completions), methods=["POST"]),
        Route("/v1/embeddings", guarded(api.embeddings), methods=["POST"]),
        Route("/v1/audio/transcriptions", guarded(api.transcriptions), methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    install_budget(app)
    return app


# --- serving ---


class ModelServerBindError(ServerBindError):
    """The model server cannot listen on its address (busy port, bad host)."""

    what = "the model"


async def serve_model(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    served_name: str | None = None,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``engine`` on ``http://host:port`` until cancelled.

    Reports the bound ``(host, port)`` through ``task_status`` (port 0 picks a
    free one).

    Raises:
        ModelServerBindError: the address cannot be bound (an ``OSError``).
    """
    app = create_app(engine, served_name=served_name, max_model_len=max_model_len)

    def listening(address: tuple[str, int]) -> None:
        log.info("model_server.listening model=%s url=http://%s:%d",
                 served_name or engine.name, *address)

    # On the lean HTTP/1.1 server (p2p.httpserver): every request of the proxy's hot
    # path comes here, and hypercorn's own cost per request was most of a short one.
    await serve_asgi(app, host=host, port=port, bind_error=ModelServerBindError,
                     on_listening=listening, lean=True, task_status=task_status)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agents.inference.server``: load the model, serve it, print the address.

    Prints ``listening http://HOST:PORT`` on stdout once the socket is open
    (useful with ``--port 0``); exits 0 on SIGTERM or SIGINT, 2 when the
    model cannot be loaded or the address cannot be bound, with the reason on
    stderr.
    """
    parser = argparse.ArgumentParser(
        prog="python -m agents.inference.server",
        description="Serve a local model over the OpenAI API.",
    )
    parser.add_argument("--model", default="demo", help="engine to load (default: demo)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--served-name", default=None, help="the name clients put in 'model' (default: --model)"
    )
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for a llama.cpp model (default: all usable cores; fewer can be "
        "faster when other processes keep the cores busy)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")
    try:
        engine = load_engine(args.model, threads=args.threads)
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def serve(task_status: trio.TaskStatus[tuple[str, int]]) -> Awaitable[None]:
        return serve_model(engine, host=args.host, port=args.port,
                           served_name=args.served_name or args.model,
                           max_model_len=args.max_model_len, task_status=task_status)

    # The agent stops its model server with SIGTERM: leave cleanly, exit 0.
    return run_until_signalled(serve, log=log, event="model_server.stopping")


if __name__ == "__main__":
    sys.exit(main())
