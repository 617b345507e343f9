"""The OpenAI-compatible HTTP front: an ASGI app (Starlette) on hypercorn's trio worker.

Endpoints (DESIGN.md §4)::

    GET  /v1/models                 the team's Active jobs' served names
    GET  /v1/models/{model}         one of them
    POST /v1/chat/completions       \\
    POST /v1/completions             | forwarded to one of the job's agents
    POST /v1/embeddings              | (``cosmicac-inference/1``), body as sent
    POST /v1/audio/transcriptions   /  (multipart: raw body and content type)

Every request carries ``Authorization: Bearer <secret>``; the key is looked
up in memory (:class:`~.keys.KeyCache`), never in SQLite on the request path
once seen. Errors are OpenAI's shape, ``{"error": {"message", "type",
"param", "code"}}``:

| status | code | when |
| --- | --- | --- |
| 401 | ``invalid_api_key`` | no bearer, an unknown secret, a revoked key |
| 400 | ``invalid_request`` | a body that is not a JSON object (or a form) naming a ``model`` |
| 400 | ``json_too_deep`` | JSON nested deeper than ``p2p.bodies.MAX_JSON_DEPTH`` (64) |
| 404 | ``model_not_found`` | no job of the key's team that takes requests serves that name |
| 408 | ``body_timeout`` | the body did not arrive within ``http.body_timeout_s`` |
| 413 | ``request_too_large`` | a body over ``MAX_BODY`` (32 MiB; a declared length at once) |
| 429 | ``too_many_bodies`` | the key's share of the bodies held or being read is taken |
| 503 | ``server_busy`` | all the room for bodies held or being read is taken |
| 503 | ``model_unavailable`` | no replica connected, or both tries failed before answering |
| 502 | ``upstream_error`` | the answer broke off (a stream gets an SSE error event) |

The forwarded POSTs are plain ASGI (the hot path needs three headers and the
body, no request object); ``/v1/models`` is a Starlette app behind them. The
key is checked before any byte of the body is read; the body is read within
the key's share of :class:`~p2p.bodies.BodyBudget` and counted there until
the answer ends; an answer given before the body was read whole closes the
connection. Only ``model`` is read from a JSON body (``loads_bounded``: its
nesting bounded, no model of the whole OpenAI body); the agent decides the
rest (whether it is a stream, see agents/inference/README.md, "What is billed").
The agent's status and content type become the response's; an SSE answer is
passed through frame by frame as it arrives (the first byte leaves when the
agent's first frame does), a non-streamed one is collected first so that a
failure midway is a clean 502. The last frame's ``usage`` is counted
(:class:`~.usage.UsageRecorder`) under the key, the served name and the UTC
day; a successful answer whose usage is missing or partial
(:func:`usage_missing`) is billed as counted, and also counted in
``proxy_usage_missing_total`` and logged (``proxy.usage_missing``).
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from contracts.inference import FORWARDED_PATHS, MAX_BODY, Usage
from crdt import ApiKey
from p2p.bodies import BodyBudget, BodyRefused, JsonBodyError, loads_bounded, read_body

from .health import HealthWindow
from .keys import KeyCache
from .metrics import ProxyMetrics
from .router import Route as JobRoute
from .router import RoutingTable
from .settings import ProxyHttpSettings
from .upstream import AgentPool, Answer, RequestRefused, UpstreamError, UpstreamFailed
from .usage import UsageRecorder

__all__ = ["Front", "create_app", "error_body"]

log = logging.getLogger(__name__)

TRANSCRIPTIONS = "/v1/audio/transcriptions"
_NO_USAGE = Usage()
SSE = "text/event-stream"
#: OpenAI's error types of the statuses a refused body gets (else ``invalid_request_error``).
_ERROR_TYPES = {429: "rate_limit_error", 503: "server_error"}
#: Paths whose non-streamed answers are asked for whole (``infer_whole``).
_WHOLE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
#: A JSON body larger than this is parsed on a worker thread.
_THREAD_PARSE_BYTES = 1 << 20


#: Request ids: a random prefix per process and a counter (``req-`` and 16 hex digits,
#: unique per process and unlikely to repeat across them): drawing 8 random bytes per
#: request cost as much as the rest of naming it.
_REQUEST_PREFIX = "req-" + secrets.token_hex(4)
_request_count = itertools.count()


def _next_request_id() -> str:
    return f"{_REQUEST_PREFIX}{next(_request_count) & 0xFFFFFFFF:08x}"


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class HttpError(Exception):
    """An answer to give instead of forwarding."""

    def __init__(self, status: int, message: str, type_: str, code: str | None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type_, code, param)
        self.code = code or type_


@dataclass
class Front:
    """What the app needs: keys, the routing table, the agents, the usage book."""

    keys: KeyCache
    table: Callable[[], RoutingTable]
    pool: AgentPool
    recorder: UsageRecorder
    metrics: ProxyMetrics
    #: The per-job window wrk-monitor judges model health from (None: not kept).
    health: HealthWindow | None = None
    #: Request bodies being read and held at once, in all and per API key.
    bodies: BodyBudget = field(default_factory=lambda: ProxyHttpSettings().body_budget())
    #: A request body must arrive within this long (408).
    body_timeout_s: float = ProxyHttpSettings.model_fields["body_timeout_s"].default

    async def authenticate(self, header: str) -> ApiKey:
        """The key of an ``Authorization`` header's bearer secret.

        Raises:
            HttpError: 401, no bearer, an unknown secret or a revoked key.
        """
        scheme, _, secret = header.partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret:
            raise HttpError(401, "You didn't provide an API key. Give it as "
                                 "'Authorization: Bearer <key>'.",
                            "invalid_request_error", "invalid_api_key")
        try:
            key = self.keys.lookup_nowait(secret)
        except trio.WouldBlock:
            key = await self.keys.lookup(secret)
        if key is None:
            raise HttpError(401, "Incorrect API key provided.", "invalid_request_error",
                            "invalid_api_key")
        if key.revoked:
            raise HttpError(401, "This API key has been revoked.", "authentication_error",
                            "invalid_api_key")
        return key


async def _send_json(send: Any, status: int, document: Any, *, close: bool = False) -> None:
    body = json.dumps(document).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _fail(front: Front, send: Any, error: HttpError, model: str = "-", *,
                close: bool = False) -> None:
    """Answer ``error``; ``model`` is a served name, or ``-`` (never a client's free text,
    which would make the metrics' labels unbounded). ``close``: the request's body
    was not read to its end, so the connection is not kept for another request."""
    front.metrics.of(model).count(error.status, None)
    front.metrics.errors.labels(error.code).inc()
    await _send_json(send, error.status, error.body, close=close)


def _failed(front: Front, error: HttpError) -> JSONResponse:
    """:func:`_fail` for the Starlette endpoints."""
    front.metrics.of("-").count(error.status, None)
    front.metrics.errors.labels(error.code).inc()
    return JSONResponse(error.body, status_code=error.status)


def _model_of_json(body: bytes) -> str:
    """The ``model`` of a JSON body (the rest is the agent's business).

    Raises:
        HttpError: as :func:`_read_json`.
    """
    return _read_json(body)[0]


def _read_json(body: bytes) -> tuple[str, bool]:
    """The ``model`` of a JSON body, and whether the body says it is not a stream
    (``stream`` absent, ``null`` or ``false``, which the agent reads so too; any
    other value is left for the agent to decide).

    Raises:
        HttpError: 400 ``invalid_request`` (not JSON, not an object, no model),
            400 ``json_too_deep`` (nested deeper than ``MAX_JSON_DEPTH``).
    """
    try:
        document = loads_bounded(body)
    except JsonBodyError as exc:
        if exc.code == "json_too_deep":
            raise HttpError(400, str(exc), "invalid_request_error", exc.code) from None
        raise HttpError(400, "The body is not valid JSON.", "invalid_request_error",
                        "invalid_request") from None
    if not isinstance(document, dict):
        raise HttpError(400, "The body must be a JSON object.", "invalid_request_error",
                        "invalid_request")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise HttpError(400, "You must provide a model parameter.", "invalid_request_error",
                        "invalid_request", "model")
    return model, document.get("stream") in (None, False)


def _form_field(body: bytes, content_type: str, name: str) -> str | None:
    """One text field of a ``multipart/form-data`` body (the rest is the agent's business)."""
    boundary = None
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "boundary":
            boundary = value.strip().strip('"')
    if not boundary:
        return None
    wanted = f'name="{name}"'.encode()
    for piece in body.split(b"--" + boundary.encode("latin-1")):
        head, sep, value = piece.partition(b"\r\n\r\n")
        if not sep:
            continue
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-disposition:") and wanted in line:
                if b"filename=" in line:
                    return None
                return value.removesuffix(b"\r\n").decode("utf-8", "replace")
    return None


def _model_of_form(body: bytes, content_type: str) -> str:
    if not content_type.lower().startswith("multipart/form-data"):
        raise HttpError(400, "A transcription is a multipart/form-data request.",
                        "invalid_request_error", "invalid_request")
    model = _form_field(body, content_type, "model")
    if not model:
        raise HttpError(400, "You must provide a model parameter.", "invalid_request_error",
                        "invalid_request", "model")
    return model


class _Forwarded:
    """The agent's answer as an ASGI response: started once the first frame is in."""

    def __init__(self, front: Front, key: ApiKey, route: JobRoute, path: str,
                 content_type: str, body: bytes, started: float, *, whole: bool = False) -> None:
        self.front = front
        #: The answer is expected whole (asked with ``infer_whole``).
        self.whole = whole
        self.key = key
        self.route = route
        self.path = path
        self.request_content_type = content_type
        self.request_body = body
        self.started = started
        #: Request start to the agent's first frame, once it came.
        self.first_byte_s: float | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        front, route = self.front, self.route
        model = route.served_name
        request_id = _next_request_id()
        try:
            async with front.pool.infer(route, path=self.path,
                                        content_type=self.request_content_type,
                                        body=self.request_body,
                                        request_id=request_id, whole=self.whole) as answer:
                self.first_byte_s = time.perf_counter() - self.started
                front.metrics.of(model).first_byte.observe(self.first_byte_s)
                first = answer.first
                status = first.status or 200
                content_type = first.content_type or "application/json"
                if content_type.startswith(SSE):
                    await self._stream(answer, status, content_type, request_id, receive, send)
                else:
                    await self._whole(answer, status, content_type, request_id, send)
        except RequestRefused as exc:
            self._health(400, error=False)
            await _fail(front, send, HttpError(400, str(exc), "invalid_request_error",
                                               "invalid_request"), model)
        except UpstreamFailed as exc:  # non-streamed: nothing was sent yet
            self._health(502, error=True)
            await _fail(front, send, HttpError(502, f"The model server failed: {exc}",
                                               "server_error", "upstream_error"), model)
        except UpstreamError as exc:
            self._health(503, error=True)
            await _fail(front, send, HttpError(
                503, f"The model {model!r} has no replica that can answer now ({exc}).",
                "server_error", "model_unavailable"), model)

    def _health(self, status: int, *, error: bool, total_s: float | None = None,
                now: float | None = None) -> None:
        """One finished request in the job's health window (O(1); see ``health.py``)."""
        window = self.front.health
        if window is not None:
            window.record(self.route.job_id, status,
                          time.perf_counter() if now is None else now, error=error,
                          first_byte_s=self.first_byte_s, total_s=total_s)

    def _headers(self, content_type: str, request_id: str,
                 length: int | None = None) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", content_type.encode("latin-1")),
                   (b"x-request-id", request_id.encode())]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        else:
            headers.append((b"cache-control", b"no-cache"))
        return headers

    def _done(self, answer: Answer, status: int, usage: Usage | None,
              request_id: str) -> None:
        front, model = self.front, self.route.served_name
        # The model server's refusals (4xx, 5xx) are not billed as requests unless
        # they report usage (a server that spent tokens before failing says so).
        if status < 400 or (usage is not None and usage != _NO_USAGE):
            front.recorder.record(self.key.id, model, usage)
        if status < 300 and usage_missing(self.path, usage):
            # Billed as it came (the agent's count of a stream without usage is a
            # lower bound), but never silently: counted and logged for the operator.
            front.metrics.usage_missing.labels(model).inc()
            log.warning("proxy.usage_missing job=%s model=%s key=%s request=%s path=%s "
                        "prompt=%d completion=%d audio_ms=%d", self.route.job_id, model,
                        self.key.id, request_id, self.path,
                        *((usage.prompt_tokens, usage.completion_tokens, usage.audio_ms)
                          if usage is not None else (0, 0, 0)))
        metrics = front.metrics.of(model)
        metrics.count(status, usage)
        now = time.perf_counter()
        metrics.latency.observe(now - self.started)
        self._health(status, error=status >= 500, total_s=now - self.started, now=now)

    async def _whole(self, answer: Answer, status: int, content_type: str, request_id: str,
                     send: Any) -> None:
        first = answer.first
        parts = [first.data]
        last = first
        async for frame in answer.frames():
            parts.append(frame.data)
            last = frame
        body = b"".join(parts)
        self._done(answer, status, last.usage, request_id)
        await send({"type": "http.response.start", "status": status,
                    "headers": self._headers(content_type, request_id, len(body))})
        await send({"type": "http.response.body", "body": body})

    async def _stream(self, answer: Answer, status: int, content_type: str, request_id: str,
                      receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": self._headers(content_type, request_id)})
        first = answer.first
        client = _Client()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.watch, receive, nursery.cancel_scope)
            if first.data:
                await client.send(send, first.data)
            last = first
            try:
                # What arrived together goes out as one chunk (one write).
                async for batch in answer.batches():
                    last = batch[-1]
                    data = b"".join(frame.data for frame in batch)
                    if data:
                        await client.send(send, data)
            except UpstreamFailed as exc:
                self.front.metrics.errors.labels("upstream_error").inc()
                self._health(status, error=True)
                log.warning("proxy.stream_broken job=%s request=%s code=%s reason=%s",
                            self.route.job_id, request_id, exc.code, exc)
                event = error_body(f"The model server failed midway: {exc}", "server_error",
                                   "upstream_error")
                await client.send(send, b"data: " + json.dumps(event).encode() + b"\n\n")
            else:
                self._done(answer, status, last.usage, request_id)
            if not client.gone:
                await send({"type": "http.response.body", "body": b""})
            nursery.cancel_scope.cancel()


def usage_missing(path: str, usage: Usage | None) -> bool:
    """A successful answer whose usage cannot be the whole of it: a chat or completion
    without prompt tokens (every prompt has some) or without any token, embeddings
    without tokens, a transcription without audio."""
    if usage is None:
        return True
    if path == TRANSCRIPTIONS:
        return not usage.audio_ms
    if path == "/v1/embeddings":
        return not usage.total_tokens
    return not (usage.prompt_tokens and usage.total_tokens)


#: After the client left a stream, its answer is still read this long for the
#: last frame and its usage (a client that stops at ``data: [DONE]`` leaves just
#: before it); then the agent is told to stop (the stream's CANCEL).
GONE_GRACE_S = 2.0


class _Client:
    """A streaming client: whether it left, and what to do then."""

    def __init__(self) -> None:
        self.gone = False

    async def send(self, send: Any, data: bytes) -> None:
        if not self.gone:
            await send({"type": "http.response.body", "body": data, "more_body": True})

    async def watch(self, receive: Any, scope: trio.CancelScope) -> None:
        """On ``http.disconnect`` stop sending; give the answer ``GONE_GRACE_S`` to end."""
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        await trio.sleep(GONE_GRACE_S)
        scope.cancel()


async def _chunks(receive: Any) -> AsyncIterator[bytes]:
    """The request body's chunks as the ASGI server delivers them."""
    while True:
        message = await receive()
        yield message.get("body", b"")
        if not message.get("more_body"):
            return


async def _forward(front: Front, scope: Any, receive: Any, send: Any) -> None:
    """A POST to a forwarded path: checked here, then answered by an agent.

    Plain ASGI, not a Starlette endpoint: this is the hot path, and it needs
    three headers and the body, nothing of a request object. The key is
    checked before a byte of the body is read; the body is then read within
    the key's share of ``front.bodies`` and held there until the answer ends.
    """
    started = time.perf_counter()
    path = scope["path"]
    authorization = ""
    content_type = "application/json"
    declared: int | None = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
        elif name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"content-length" and value.isdigit():
            declared = int(value)
    ticket = None
    try:
        try:
            if scope["method"] != "POST":
                raise HttpError(405, f"Use POST for {path}.", "invalid_request_error",
                                "method_not_allowed")
            key = await front.authenticate(authorization)
            try:
                ticket = front.bodies.open(key.id, limit=MAX_BODY, declared=declared)
                body = await read_body(_chunks(receive), ticket, timeout_s=front.body_timeout_s)
            except BodyRefused as exc:
                raise HttpError(exc.status, str(exc), _ERROR_TYPES.get(exc.status,
                                                                       "invalid_request_error"),
                                exc.code) from None
            not_a_stream = False
            if path == TRANSCRIPTIONS:
                model = _model_of_form(body, content_type)
            elif len(body) > _THREAD_PARSE_BYTES:
                model, not_a_stream = await trio.to_thread.run_sync(_read_json, body)
            else:
                model, not_a_stream = _read_json(body)
            route = front.table().lookup(key.team, model)
            if route is None:
                raise HttpError(404, f"The model {model!r} does not exist or you do not "
                                     "have access to it.", "invalid_request_error",
                                "model_not_found", "model")
        except HttpError as exc:
            # Refused before the body was read whole: the rest of it is never read.
            await _fail(front, send, exc, close=ticket is None or ticket.reading)
            return
        # A chat or completion that is not a stream comes back whole: one RPC message
        # each way (embeddings may be megabytes, more than one message holds).
        whole = not_a_stream and path in _WHOLE_PATHS
        await _Forwarded(front, key, route, path, content_type, body, started, whole=whole)(
            scope, receive, send)
    finally:
        if ticket is not None:
            ticket.close()


def create_app(front: Front) -> Any:
    """The ASGI app over ``front`` (serve it with ``p2p.http.serve_asgi``)."""

    async def list_models(request: Request) -> Response:
        try:
            key = await front.authenticate(request.headers.get("authorization", ""))
        except HttpError as exc:
            return _failed(front, exc)
        data = [_model_entry(route) for route in front.table().models(key.team)]
        front.metrics.of("-").count(200, None)
        return JSONResponse({"object": "list", "data": data})

    async def get_model(request: Request) -> Response:
        try:
            key = await front.authenticate(request.headers.get("authorization", ""))
        except HttpError as exc:
            return _failed(front, exc)
        name = request.path_params["model"]
        for route in front.table().models(key.team):
            if route.served_name == name:
                front.metrics.of(name).count(200, None)
                return JSONResponse(_model_entry(route))
        return _failed(front, HttpError(404, f"The model {name!r} does not exist or you do "
                                             "not have access to it.", "invalid_request_error",
                                        "model_not_found", "model"))

    rest = Starlette(routes=[Route("/v1/models", list_models, methods=["GET"]),
                             Route("/v1/models/{model:path}", get_model, methods=["GET"])])
    forwarded = frozenset(FORWARDED_PATHS)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] in forwarded:
            await _forward(front, scope, receive, send)
        else:
            await rest(scope, receive, send)

    return app


def _model_entry(route: JobRoute) -> dict:
    return {"id": route.served_name, "object": "model", "created": int(route.created_at),
            "owned_by": route.team}
