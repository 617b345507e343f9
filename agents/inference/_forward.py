"""Forward one OpenAI request to the model server and turn its answer into frames.

Two layers:

- sans-IO: :func:`prepare` (what to send: a streamed chat or completion always
  asks the server for usage, ``stream_options.include_usage``, because the
  proxy bills by it; whether the client asked decides if the usage chunk is
  passed on), :class:`SseSplitter` (whole events out of a byte stream, the
  usage taken from the one that carries it) and :func:`usage_of` (the usage of
  a whole JSON answer: tokens, or a transcription's audio seconds);
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
import math
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import trio

from contracts.inference import InferFrame, Usage
from p2p.rpc import RpcError

from ._http import HttpError, HttpPool, Response

__all__ = [
    "MAX_ANSWER_BYTES",
    "ModelClient",
    "Prepared",
    "SseSplitter",
    "audio_usage",
    "prepare",
    "usage_of",
]

#: Largest whole (non-streamed) answer passed on: embeddings of a large batch
#: are megabytes; more than this is a server gone wrong.
MAX_ANSWER_BYTES = 64 << 20
#: A frame's data stays well under a mux message (512 KiB).
MAX_FRAME_DATA = 256 << 10
_STREAMED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


@dataclass(frozen=True, slots=True)
class Prepared:
    """What to send to the model server, and how to treat its answer."""

    body: bytes
    #: The client asked for a streamed answer.
    stream: bool = False
    #: Drop the usage-only chunk: we asked for it, the client did not.
    strip_usage: bool = False


def prepare(path: str, body: bytes) -> Prepared:
    """The body to send for ``path``; unchanged unless usage must be asked for.

    A body that is not a JSON object is passed on as it is: the model server
    answers it with its own 400, which is what the client should see.
    """
    if path not in _STREAMED_PATHS or b'"stream"' not in body:
        return Prepared(body)
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Prepared(body)
    if not isinstance(request, dict) or request.get("stream") is not True:
        return Prepared(body)
    options = request.get("stream_options")
    if not isinstance(options, dict):
        options = {}
    if options.get("include_usage") is True:
        return Prepared(body, stream=True)
    request["stream_options"] = {**options, "include_usage": True}
    return Prepared(json.dumps(request, separators=(",", ":")).encode(), stream=True,
                    strip_usage=True)


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
    """The usage a whole JSON answer reports, or None."""
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return _usage(answer.get("usage")) if isinstance(answer, dict) else None


class SseSplitter:
    """Whole SSE events out of a byte stream; the usage taken from the event carrying it.

    ``feed(data)`` returns the bytes of the whole events completed by ``data``
    (the usage-only chunk left out when ``strip_usage``); ``flush()`` returns
    what is left at the end.
    """

    def __init__(self, *, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.usage: Usage | None = None
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        self._pending += data
        end = self._pending.rfind(b"\n\n")
        if end < 0:
            return b""
        whole, self._pending = self._pending[:end + 2], self._pending[end + 2:]
        if b'"usage"' not in whole:
            return whole
        kept = []
        for event in whole.split(b"\n\n")[:-1]:
            if self._take_usage(event) and self.strip_usage:
                continue
            kept.append(event + b"\n\n")
        return b"".join(kept)

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest

    def _take_usage(self, event: bytes) -> bool:
        """Record the usage of ``event``; True if the event is only a usage chunk."""
        if b'"usage"' not in event or not event.startswith(b"data:"):
            return False
        try:
            chunk = json.loads(event[5:])
        except (ValueError, UnicodeDecodeError):
            return False
        if not isinstance(chunk, dict):
            return False
        usage = _usage(chunk.get("usage"))
        if usage is None:
            return False
        self.usage = usage
        return chunk.get("choices") == []


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

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def forward(self, path: str, content_type: str, body: bytes
                      ) -> AsyncIterator[InferFrame]:
        """The model server's answer to one request, as frames.

        Raises:
            RpcError: ``UNAVAILABLE`` when the server cannot be reached (nothing
                was sent); ``UPSTREAM`` when it failed after the request went out.
        """
        prepared = (prepare(path, body) if content_type.startswith("application/json")
                    else Prepared(body))
        try:
            async with self._pool.request("POST", path, [("content-type", content_type)],
                                          prepared.body) as response:
                kind = response.headers.get("content-type", "application/octet-stream")
                if prepared.stream and kind.startswith("text/event-stream"):
                    async for frame in self._events(response, kind, prepared.strip_usage):
                        yield frame
                else:
                    data = await response.body(MAX_ANSWER_BYTES)
                    usage = None
                    if response.status < 300:
                        usage = usage_of(data) if "json" in kind else None
                        if usage is None and path == "/v1/audio/transcriptions":
                            usage = await trio.to_thread.run_sync(audio_usage, content_type,
                                                                  body)
                    yield InferFrame(status=response.status, content_type=kind, data=data,
                                     usage=usage or Usage(), done=True)
        except HttpError as exc:
            if not exc.sent:
                raise RpcError("UNAVAILABLE", f"the model server is not reachable: {exc}"
                               ) from None
            raise RpcError("UPSTREAM", f"the model server failed: {exc}") from None

    @staticmethod
    async def _events(response: Response, kind: str, strip_usage: bool
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
        yield InferFrame(**head, data=splitter.flush(), usage=splitter.usage or Usage(),
                         done=True)
