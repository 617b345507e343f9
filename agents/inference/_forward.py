"""Forward one OpenAI request to the model server and turn its answer into frames.

Two layers:

- sans-IO: :func:`prepare` (what to send: a chat or completion is parsed and
  sent as a canonical body the agent built, so whether it is a stream is
  decided once, here, as the model server would decide it; a stream always
  asks the server for usage, ``stream_options.include_usage``, because the
  proxy bills by it; whether the client asked decides if the usage chunk is
  passed on), :class:`SseSplitter` (whole events out of a byte stream, the
  usage taken from the one that carries it, the generated pieces counted for
  a server that sends none) and :func:`usage_of` (the usage of a whole JSON
  answer: tokens, or a transcription's audio seconds);
- :class:`ModelClient`: the model server's answers as :class:`InferFrame` s,
  over the pooled keep-alive connections of ``_http.py``.

Frames, as ``contracts/inference.py`` orders them: a whole answer is one
frame (status, content type, body, usage, done). A streamed answer's first
frame has the status and content type with the first events; each further
frame carries the whole events that arrived together; the last one has the
usage and ``done``.
"""

from __future__ import annotations

import email
import email.policy
import io
import json
import logging
import math
import wave
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import trio
from pydantic import ValidationError

from contracts.inference import InferFrame, Usage
from p2p.bodies import JsonBodyError, loads_bounded
from p2p.rpc import RpcError

from ._http import HttpError, HttpPool, Response
from ._streaming import StreamFields

log = logging.getLogger("cosmicac.agent.inference")

__all__ = [
    "MAX_ANSWER_BYTES",
    "BadBody",
    "ModelClient",
    "Prepared",
    "SseSplitter",
    "audio_usage",
    "header_usage",
    "prepare",
    "usage_of",
]

#: Largest whole (non-streamed) answer passed on: embeddings of a large batch
#: are megabytes; more than this is a server gone wrong.
MAX_ANSWER_BYTES = 64 << 20
#: A frame's data stays well under a mux message (512 KiB).
MAX_FRAME_DATA = 256 << 10
_STREAMED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_JSON_PATHS = _STREAMED_PATHS | {"/v1/embeddings"}
JSON = "application/json"
#: A body larger than this is read and encoded again on a worker thread.
_THREAD_BODY_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class Prepared:
    """What to send to the model server, and how to treat its answer."""

    body: bytes
    content_type: str = JSON
    #: The request is a stream (as the model server reads it: it is the
    #: canonical body the agent built).
    stream: bool = False
    #: Drop the usage-only chunk: we asked for it, the client did not.
    strip_usage: bool = False


class BadBody(Exception):
    """A chat or completion body the agent will not forward: answered with a 400.

    ``code`` is stable (``invalid_json``, ``json_too_deep``,
    ``invalid_request``); ``param`` names the field at fault, if one is.
    """

    def __init__(self, message: str, *, code: str = "invalid_request",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param

    def frame(self) -> InferFrame:
        """The 400 answer, OpenAI-shaped, as the model server's own would be."""
        error = {"message": str(self), "type": "invalid_request_error", "param": self.param,
                 "code": self.code}
        return InferFrame(status=400, content_type=JSON, usage=Usage(), done=True,
                          data=json.dumps({"error": error}).encode())


def prepare(path: str, content_type: str, body: bytes) -> Prepared:
    """What to send for ``path``: for a chat or completion, a body the agent built.

    The decision "is this a stream" is made once, here, on a canonical body:
    the client's bytes are parsed as the model server parses them (``json.loads``,
    whatever the content type, as the local server does; nesting bounded),
    ``stream`` and ``stream_options`` are read with the servers' own lax rules
    (:class:`StreamFields`), and the body is encoded again with ``stream`` a
    JSON boolean and, for a stream, ``stream_options.include_usage`` true (the
    proxy bills by the usage chunk). So ``"\\u0073tream": true``, ``"stream":
    1`` or ``"stream": "true"``, sent as ``text/plain`` or
    ``Application/JSON``, reach the server as ``"stream":true`` with
    ``application/json``, and the server cannot stream what the agent did not
    see as a stream. A non-streamed body loses its ``stream_options`` (which
    vLLM refuses without ``stream``).

    Embeddings go as sent, marked ``application/json``; a transcription's
    multipart body and content type go as sent.

    Raises:
        BadBody: a chat or completion body that is not a JSON object, nests
            deeper than ``MAX_JSON_DEPTH``, or has a ``stream`` or
            ``stream_options`` no server would take.
    """
    if path not in _JSON_PATHS:
        return Prepared(body, content_type)
    if path not in _STREAMED_PATHS:
        return Prepared(body)
    try:
        request = loads_bounded(body)
    except JsonBodyError as exc:
        raise BadBody(str(exc), code=exc.code) from None
    if not isinstance(request, dict):
        raise BadBody("the body must be a JSON object")
    try:
        fields = StreamFields.model_validate(request)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise BadBody(f"{param}: {first['msg']}", param=param) from None
    stream = bool(fields.stream)
    request["stream"] = stream
    if stream:
        options = request.get("stream_options")
        request["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                     "include_usage": True}
    else:
        request.pop("stream_options", None)
    return Prepared(_encode(request), stream=stream,
                    strip_usage=stream and not fields.usage_asked)


def _encode(document: Any) -> bytes:
    """Compact JSON in UTF-8 (``\\u`` escapes only for lone surrogates, which UTF-8 lacks)."""
    try:
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(document, separators=(",", ":")).encode()


def _usage(value: Any) -> Usage | None:
    """A :class:`Usage` from an OpenAI ``usage`` object, or None if it is not one."""
    if not isinstance(value, dict):
        return None
    if value.get("type") == "duration":  # a transcription: {"type": "duration", "seconds": N}
        seconds = value.get("seconds")
        if (isinstance(seconds, int | float) and not isinstance(seconds, bool)
                and 0 <= seconds < 2**40):
            return Usage(audio_ms=math.ceil(seconds * 1000))
        return None
    counts = {}
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        count = value.get(name, 0)
        if count is None:
            count = 0
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count < 2**53:
            return None
        counts[name] = count
    if not counts["total_tokens"]:
        counts["total_tokens"] = counts["prompt_tokens"] + counts["completion_tokens"]
    return Usage(**counts)


def header_usage(headers: dict[str, str]) -> Usage | None:
    """A transcription's audio seconds from our servers' ``x-audio-seconds`` header."""
    try:
        seconds = float(headers.get("x-audio-seconds", ""))
    except ValueError:
        return None
    return _usage({"type": "duration", "seconds": seconds})


def audio_usage(content_type: str, body: bytes) -> Usage | None:
    """The duration of a transcription request's WAV ``file``, for answers that
    carry no usage (``response_format`` text, srt or vtt); None if unknown."""
    if not content_type.startswith("multipart/form-data"):
        return None
    try:
        message = email.message_from_bytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body,
            policy=email.policy.HTTP)
        for part in message.iter_parts():
            if part.get_param("name", header="content-disposition") != "file":
                continue
            audio = part.get_payload(decode=True)
            with wave.open(io.BytesIO(audio)) as wav:
                rate, frames = wav.getframerate(), wav.getnframes()
            return Usage(audio_ms=math.ceil(frames * 1000 / rate)) if rate > 0 else None
    except (ValueError, TypeError, UnicodeError, EOFError, wave.Error, AttributeError):
        return None
    return None


def usage_of(body: bytes) -> Usage | None:
    """The usage a whole JSON answer reports, or None (also for JSON nested too deeply)."""
    try:
        answer = loads_bounded(body)
    except JsonBodyError:
        return None
    return _usage(answer.get("usage")) if isinstance(answer, dict) else None


class SseSplitter:
    """Whole SSE events out of a byte stream; the usage taken from the event carrying it.

    ``feed(data)`` returns the bytes of the whole events completed by ``data``
    (the usage-only chunk left out when ``strip_usage``); ``flush()`` returns
    what is left at the end. ``pieces`` counts the generated pieces the events
    carried (a choice's non-empty ``text`` or ``delta``): a lower bound of the
    completion tokens, for a stream whose server sent no usage.
    """

    def __init__(self, *, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.usage: Usage | None = None
        self.pieces = 0
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        self._pending += data
        end = self._pending.rfind(b"\n\n")
        if end < 0:
            return b""
        whole, self._pending = self._pending[:end + 2], self._pending[end + 2:]
        events = whole.split(b"\n\n")[:-1]
        dropped = False
        kept = []
        for event in events:
            if self._read(event) and self.strip_usage:
                dropped = True
                continue
            kept.append(event + b"\n\n")
        return b"".join(kept) if dropped else whole

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest

    def _read(self, event: bytes) -> bool:
        """Count ``event``'s pieces and take its usage; True if it is only a usage chunk."""
        if not event.startswith(b"data:") or event[5:].strip() == b"[DONE]":
            return False
        try:
            chunk = loads_bounded(event[5:])
        except JsonBodyError:
            return False
        if not isinstance(chunk, dict):
            return False
        choices = chunk.get("choices")
        if isinstance(choices, list):
            self.pieces += sum(1 for choice in choices if _generated(choice))
        if "usage" not in chunk:
            return False
        usage = _usage(chunk.get("usage"))
        if usage is None:
            return False
        self.usage = usage
        return choices == []

    def counted(self) -> Usage:
        """What can be counted of a stream that reported no usage: its pieces."""
        return Usage(completion_tokens=self.pieces, total_tokens=self.pieces)


def _generated(choice: Any) -> bool:
    """A streamed choice carries generated output (text, content, a tool call …)."""
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(value for name, value in delta.items()
                                           if name != "role")


class ModelClient:
    """Keep-alive HTTP/1.1 connections to the model server on loopback.

    Args:
        host, port: where the model server listens.
        max_connections: requests in flight to the server at once.
        timeout_s: longest silence while reading an answer (a long generation
            streams; a whole answer may take minutes on a big model).
    """

    def __init__(self, host: str, port: int, *, max_connections: int = 256,
                 timeout_s: float = 600.0) -> None:
        self.base_url = f"http://{host}:{port}"
        self._pool = HttpPool(host, port, max_connections=max_connections,
                              read_timeout_s=timeout_s)
        #: Chat or completion bodies answered with a 400 here (not forwarded).
        self.refused = 0
        #: Streams whose server sent no usage chunk (billed from what was counted).
        self.usage_missing = 0

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def _prepare(self, path: str, content_type: str, body: bytes
                       ) -> Prepared | InferFrame:
        """What to send, or the 400 frame of a body :func:`prepare` refuses."""
        try:
            if len(body) > _THREAD_BODY_BYTES and path in _STREAMED_PATHS:
                return await trio.to_thread.run_sync(prepare, path, content_type, body)
            return prepare(path, content_type, body)
        except BadBody as exc:
            self.refused += 1
            log.info("inference.refused path=%s code=%s reason=%s", path, exc.code, exc)
            return exc.frame()

    async def forward(self, path: str, content_type: str, body: bytes
                      ) -> AsyncIterator[InferFrame]:
        """The model server's answer to one request, as frames.

        A chat or completion goes as :func:`prepare` builds it; one it refuses
        is answered here with a 400 frame, and the server never sees it.

        Raises:
            RpcError: ``UNAVAILABLE`` when the server cannot be reached (nothing
                was sent); ``UPSTREAM`` when it failed after the request went out.
        """
        prepared = await self._prepare(path, content_type, body)
        if isinstance(prepared, InferFrame):
            yield prepared
            return
        try:
            async with self._pool.request("POST", path, [("content-type", prepared.content_type)],
                                          prepared.body) as response:
                kind = response.headers.get("content-type", "application/octet-stream")
                if kind.startswith("text/event-stream"):
                    # Read as a stream whatever was decided: a server that streams an
                    # answer nobody asked to stream is still billed by its usage chunk.
                    async for frame in self._events(response, path, kind,
                                                    prepared.strip_usage):
                        yield frame
                else:
                    yield await self._whole_frame(response, path, kind, content_type, body)
        except HttpError as exc:
            raise _rpc_error(exc) from None

    async def whole(self, path: str, content_type: str, body: bytes, *, limit: int
                    ) -> InferFrame:
        """:meth:`forward`'s answer as one frame (``done``), without a generator per
        layer: the path of ``infer_whole``, where those cost a tenth of the agent's time.

        Raises:
            RpcError: as :meth:`forward`; ``TOO_LARGE`` past ``limit`` bytes of data.
        """
        prepared = await self._prepare(path, content_type, body)
        if isinstance(prepared, InferFrame):
            return prepared
        try:
            async with self._pool.request("POST", path, [("content-type", prepared.content_type)],
                                          prepared.body) as response:
                kind = response.headers.get("content-type", "application/octet-stream")
                if not kind.startswith("text/event-stream"):
                    frame = await self._whole_frame(response, path, kind, content_type, body)
                    if len(frame.data) > limit:
                        raise _too_large(limit)
                    return frame
                # A stream nobody asked for: joined, billed by its usage chunk as ever.
                parts: list[bytes] = []
                size = 0
                last: InferFrame | None = None
                async with aclosing(self._events(response, path, kind,
                                                 prepared.strip_usage)) as frames:
                    async for last in frames:
                        size += len(last.data)
                        if size > limit:
                            raise _too_large(limit)
                        parts.append(last.data)
                assert last is not None and last.done  # _events ends with the done frame
                return InferFrame.model_construct(
                    status=response.status, content_type=kind, data=b"".join(parts),
                    usage=last.usage, done=True)
        except HttpError as exc:
            raise _rpc_error(exc) from None

    async def _whole_frame(self, response: Response, path: str, kind: str,
                           content_type: str, body: bytes) -> InferFrame:
        """A whole (not SSE) answer as its one frame, with the usage it reports."""
        data = await response.body(MAX_ANSWER_BYTES)
        usage = None
        if response.status < 300:
            usage = usage_of(data) if "json" in kind else None
            if usage is None and path == "/v1/audio/transcriptions":
                usage = header_usage(response.headers) or \
                    await trio.to_thread.run_sync(audio_usage, content_type, body)
        return InferFrame(status=response.status, content_type=kind, data=data,
                          usage=usage or Usage(), done=True)

    async def _events(self, response: Response, path: str, kind: str, strip_usage: bool
                      ) -> AsyncIterator[InferFrame]:
        splitter = SseSplitter(strip_usage=strip_usage)
        head: dict[str, Any] = {"status": response.status, "content_type": kind}
        async for chunk in response.iter_body():
            data = splitter.feed(chunk)
            while len(data) > MAX_FRAME_DATA:
                yield InferFrame(**head, data=data[:MAX_FRAME_DATA])
                head, data = {}, data[MAX_FRAME_DATA:]
            if data:
                yield InferFrame(**head, data=data)
                head = {}
        usage = splitter.usage
        if usage is None and response.status < 300:
            # Asked for and not sent: never billed as free. What was streamed is
            # counted (a lower bound: no prompt tokens, a piece per token at most).
            usage = splitter.counted()
            self.usage_missing += 1
            log.warning("inference.usage_missing path=%s status=%d counted_completion=%d "
                        "reason=the model server's stream carried no usage chunk",
                        path, response.status, splitter.pieces)
        yield InferFrame(**head, data=splitter.flush(), usage=usage or Usage(), done=True)


def _rpc_error(exc: HttpError) -> RpcError:
    if not exc.sent:
        return RpcError("UNAVAILABLE", f"the model server is not reachable: {exc}")
    return RpcError("UPSTREAM", f"the model server failed: {exc}")


def _too_large(limit: int) -> RpcError:
    return RpcError("TOO_LARGE", f"the answer exceeds {limit} bytes; ask with infer")
