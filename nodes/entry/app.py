"""The entry point's ASGI app: a streaming reverse proxy over pooled HTTP clients.

Theory of operation. Each proxied request runs in one nursery with two tasks:

- the *pump* is the only reader of ASGI ``receive``. It hands request body
  chunks to the forwarder through an unbuffered channel (so a slow upstream
  slows the client: hypercorn's own queue of 10 messages is the only buffer),
  then keeps reading until ``http.disconnect``. A disconnect cancels the
  nursery: the upstream request is abandoned and its connection closed, so a
  model stops generating for a client that left.
- the *forwarder* (the nursery's body) sends the request with httpx
  (``stream=True``), passes the status line and headers on as soon as they
  arrive, then every chunk as it is read (``aiter_raw``: no decoding, no
  re-chunking), so Server-Sent Events reach the client one by one.

Errors before the upstream answered become JSON (:func:`routes.error_body`):

| status | code | when |
| --- | --- | --- |
| 404 | ``NOT_FOUND`` | a method other than GET/HEAD on a landing path |
| 413 | ``BODY_TOO_LARGE`` | Content-Length or the streamed body beyond ``max_body_bytes`` |
| 502 | ``UPSTREAM_UNREACHABLE`` | app-node or proxy-inference refused or dropped the request |
| 503 | ``SERVER_BUSY`` | ``max_large_bodies`` large bodies are being streamed already |
| 503 | ``SERVICE_NOT_CONFIGURED`` | ``/monitor`` with no ``monitor_url`` |
| 503 | ``SERVICE_UNAVAILABLE`` | wrk-monitor configured but not answering |
| 504 | ``UPSTREAM_TIMEOUT`` | connect, write, first-byte or pool timeout |

After the status line was sent nothing can be said any more: a broken
upstream or a read timeout cuts the response (the client sees a truncated
body, never a clean end) and is logged and counted as ``UPSTREAM_BROKEN``.

A *large* body (declared beyond ``large_body_bytes``, or chunked with no
length) holds one of ``max_large_bodies`` slots from before the upstream
request until its last byte was handed on (or the exchange ends); with none
free the request is refused at once (503 ``SERVER_BUSY``, ``Retry-After``),
never queued. So the door passes at most ``max_large_bodies`` times
``max_body_bytes`` of uploads at a time, whoever sends them.

``X-Forwarded-For`` is the client's address (the TCP peer's), or, when the peer
is one of ``trusted_proxies``, the chain that proxy vouched for plus the peer
(:func:`nodes.kit.forwarded.forwarded_for`): a client's own header is never passed on.

Every ``send`` to hypercorn is shielded from cancellation: hypercorn 0.18
updates its stream state only after a write returns, and a write cancelled
half-way leaves an h11 error that stops the whole server.

Falls short: no WebSocket proxying (nothing behind the door needs it; SSE
covers streaming), no retries (a request body is streamed once), no HTTP/2
to upstreams, request trailers are dropped, and there is no write timeout
towards a client that stops reading (hypercorn has none either): its request
waits for it or for its disconnect.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import httpx
import trio

from nodes.kit.forwarded import TrustedProxies, forwarded_for

from .metrics import EntryMetrics
from .routes import (
    DAEMONS,
    Forward,
    Service,
    error_body,
    landing_page,
    request_headers,
    response_headers,
    route,
)

__all__ = ["BodyTooLarge", "EntryApp"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]
_JSON = [(b"content-type", b"application/json")]


class BodyTooLarge(Exception):
    """The client's body grew beyond the limit while it was being streamed upstream."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body beyond {limit} bytes")
        self.limit = limit


class EntryApp:
    """The ASGI app behind ``127.0.0.1:5173``.

    Args:
        upstreams: base URL per proxied service (None: not configured).
        clients: the pooled HTTP client per configured service (opened and
            closed by the caller: :func:`nodes.entry.daemon.serve_entry`).
        max_body_bytes: larger request bodies are refused with 413.
        metrics: where requests are counted.
        large_body_bytes / max_large_bodies: bodies beyond the first (or of no
            declared length) streamed at once, at most the second; 503 beyond.
        busy_retry_after_s: ``Retry-After`` of that 503.
        trusted_proxies: peers whose ``X-Forwarded-For`` is passed on (appended to).
    """

    def __init__(self, upstreams: Mapping[Service, str | None],
                 clients: Mapping[Service, httpx.AsyncClient], *, max_body_bytes: int,
                 metrics: EntryMetrics | None = None, large_body_bytes: int = 1024 * 1024,
                 max_large_bodies: int = 16, busy_retry_after_s: int = 1,
                 trusted_proxies: TrustedProxies | None = None) -> None:
        self.upstreams = dict(upstreams)
        self.clients = dict(clients)
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics or EntryMetrics()
        self.large_body_bytes = large_body_bytes
        self.busy_retry_after_s = busy_retry_after_s
        self.trusted_proxies = trusted_proxies or TrustedProxies()
        self._large_slots = trio.Semaphore(max_large_bodies)

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":  # websocket: refused (hypercorn answers 403)
            await send({"type": "websocket.close", "code": 1003})
            return
        send = _shielded(send)
        raw_path = scope.get("raw_path") or scope["path"].encode()
        forward = route(raw_path.split(b"?", 1)[0], scope.get("query_string", b""))
        if forward.service is Service.UI and self.upstreams.get(Service.UI) is None:
            forward = Forward(Service.LANDING, forward.target, b"")
        started = trio.current_time()
        metrics = self.metrics
        gauge = metrics.in_flight.labels(forward.service.value)
        gauge.inc()
        status = 0
        try:
            if forward.service is Service.LANDING:
                status = await self._landing(scope, send)
            else:
                status = await self._proxy(scope, receive, send, forward, started)
        finally:
            gauge.dec()
            elapsed = trio.current_time() - started
            metrics.requests.labels(forward.service.value, str(status)).inc()
            metrics.latency.labels(forward.service.value).observe(elapsed)
            log.info("entry.request method=%s path=%s service=%s status=%d ms=%.1f",
                     scope["method"], scope["path"], forward.service.value, status,
                     elapsed * 1000)

    # --- the landing page ---

    async def _landing(self, scope: Scope, send) -> int:
        if scope["method"] not in ("GET", "HEAD"):
            return await _respond(send, 404, error_body(
                "NOT_FOUND", f"{scope['method']} {scope['path']}: no such route; the API is "
                "under /api, inference under /inference/v1"))
        host = next((v for k, v in scope["headers"] if k == b"host"), None)
        page = landing_page(host, scope.get("scheme", "http"))
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(page)).encode()),
            (b"cache-control", b"no-cache")]})
        await send({"type": "http.response.body", "body": page})
        return 200

    # --- proxying ---

    async def _proxy(self, scope: Scope, receive, send, forward: Forward,
                     started: float) -> int:
        service = forward.service
        base = self.upstreams.get(service)
        client = self.clients.get(service)
        if base is None or client is None:
            return await _respond(send, 503, error_body(
                "SERVICE_NOT_CONFIGURED",
                f"{DAEMONS[service]} is not configured: set COSMICAC_ENTRY__"
                f"{service.value.upper()}_URL to its base URL", service))
        length = _content_length(scope["headers"])
        if length is not None and length > self.max_body_bytes:
            return await _respond(send, 413, error_body(
                "BODY_TOO_LARGE", f"the request body ({length} bytes) is beyond the "
                f"entry point's limit of {self.max_body_bytes} bytes", service), close=True)
        chunked = any(k == b"transfer-encoding" for k, _ in scope["headers"])
        has_body = length is not None or chunked
        slot = _Slot(self._large_slots)
        if chunked or (length or 0) > self.large_body_bytes:
            try:
                self._large_slots.acquire_nowait()
            except trio.WouldBlock:
                return await _respond(send, 503, error_body(
                    "SERVER_BUSY", f"the entry point is passing on as many large request "
                    f"bodies as it allows; retry in {self.busy_retry_after_s} s", service),
                    close=True, retry_after=self.busy_retry_after_s)
            slot.held = True
        client_host = scope["client"][0] if scope.get("client") else None
        forwarded = [v for k, v in scope["headers"] if k == b"x-forwarded-for"]
        headers = request_headers(
            scope["headers"], client=forwarded_for(client_host, forwarded, self.trusted_proxies),
            scheme=scope.get("scheme", "http"), prefix=forward.prefix)
        url = httpx.URL(base)
        url = url.copy_with(raw_path=url.raw_path.rstrip(b"/") + forward.target)
        state = _Exchange()
        try:
            await self._forward(scope, receive, send, service, started, client, url,
                                headers, has_body, state, slot)
        finally:
            slot.release()
        if state.gone:
            log.info("entry.client_gone service=%s path=%s sent=%s", service.value,
                     scope["path"], state.status or "nothing")
            return 0
        return state.status

    async def _forward(self, scope: Scope, receive, send, service: Service, started: float,
                       client: httpx.AsyncClient, url: httpx.URL, headers, has_body: bool,
                       state: _Exchange, slot: _Slot) -> None:
        # Unbuffered: the pump waits until the forwarder took each chunk.
        body_in, body_out = trio.open_memory_channel[bytes](0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump, receive, body_in, nursery.cancel_scope, state)
            body = self._body(body_out, slot) if has_body else None
            request = httpx.Request(scope["method"], url, headers=headers,
                                    content=body if body is not None else b"")
            try:
                await self._exchange(client, request, send, service, started, state)
            finally:
                nursery.cancel_scope.cancel()  # the pump waits for a disconnect no one sends
                if body is not None:  # a body abandoned half-way is closed now, not at GC
                    with trio.CancelScope(shield=True):
                        await body.aclose()

    async def _body(self, chunks: trio.MemoryReceiveChannel[bytes],
                    slot: _Slot) -> AsyncGenerator[bytes, None]:
        """The client's body, as it arrives, cut short beyond ``max_body_bytes``; its
        large-body slot is given back once the last chunk was taken."""
        total = 0
        async with chunks:
            async for chunk in chunks:
                total += len(chunk)
                if total > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
                yield chunk
        slot.release()

    async def _exchange(self, client: httpx.AsyncClient, request: httpx.Request, send,
                        service: Service, started: float, state: _Exchange) -> None:
        """Send ``request`` upstream and stream its answer to the client; fill ``state``."""
        try:
            # client.send, not client.request: no default headers (Accept-Encoding
            # would make upstreams compress for a client that never asked).
            response = await client.send(request, stream=True)
        except BodyTooLarge as exc:
            state.done = True  # an error document is the whole answer
            state.status = await _respond(send, 413, error_body(
                "BODY_TOO_LARGE", f"the request body is beyond the entry point's limit of "
                f"{exc.limit} bytes", service), close=True)
            return
        except httpx.TimeoutException as exc:
            self._failed(service, "UPSTREAM_TIMEOUT", request, exc)
            state.done = True  # an error document is the whole answer
            state.status = await _respond(send, 504, error_body(
                "UPSTREAM_TIMEOUT", f"{DAEMONS[service]} at {request.url.host}:"
                f"{request.url.port} did not answer in time ({_kind(exc)}); try again",
                service))
            return
        except httpx.TransportError as exc:
            self._failed(service, "UPSTREAM_UNREACHABLE", request, exc)
            if service is Service.MONITOR:
                code, status = "SERVICE_UNAVAILABLE", 503
            else:
                code, status = "UPSTREAM_UNREACHABLE", 502
            state.done = True  # an error document is the whole answer
            state.status = await _respond(send, status, error_body(
                code, f"{DAEMONS[service]} at {request.url.host}:{request.url.port} is not "
                f"reachable ({_kind(exc)}): is it running?", service))
            return
        try:
            self.metrics.first_byte.labels(service.value).observe(trio.current_time() - started)
            state.status = response.status_code
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": response_headers(response.headers.raw)})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            # Done before the last send: hypercorn reports http.disconnect as
            # soon as a response is complete, while this send still runs.
            state.done = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.TransportError as exc:
            # Too late for an error document: leaving without the last body
            # message makes hypercorn close the connection, so the client sees
            # a cut response, never a complete-looking one.
            self._failed(service, "UPSTREAM_BROKEN", request, exc)
        finally:
            await response.aclose()

    def _failed(self, service: Service, code: str, request: httpx.Request,
                exc: Exception) -> None:
        self.metrics.upstream_errors.labels(service.value, code).inc()
        log.warning("entry.upstream_failed service=%s code=%s url=%s error=%s",
                    service.value, code, request.url.copy_with(query=None), _kind(exc))


class _Slot:
    """A large-body slot a request may hold: given back once, whichever comes first
    (the body's end, or the exchange's)."""

    __slots__ = ("_semaphore", "held")

    def __init__(self, semaphore: trio.Semaphore) -> None:
        self._semaphore = semaphore
        self.held = False

    def release(self) -> None:
        if self.held:
            self.held = False
            self._semaphore.release()


class _Exchange:
    """What one proxied request came to (shared by the forwarder and the pump)."""

    __slots__ = ("done", "gone", "status")

    def __init__(self) -> None:
        #: The status sent to the client (0: none yet).
        self.status = 0
        #: The whole answer was handed to the server.
        self.done = False
        #: The client disconnected before the answer was complete.
        self.gone = False

    def disconnected(self, scope: trio.CancelScope) -> None:
        """The client left: abandon the exchange, unless it was already complete."""
        if not self.done:
            self.gone = True
            scope.cancel()


async def _pump(receive, body: trio.MemorySendChannel[bytes], scope: trio.CancelScope,
                state: _Exchange) -> None:
    """Read ASGI ``receive`` until the client leaves: body chunks to ``body``, then wait.

    A disconnect at any point cancels ``scope`` (the whole exchange).
    """
    async with body:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                state.disconnected(scope)
                return
            chunk = message.get("body", b"")
            if chunk:
                try:
                    await body.send(chunk)
                except trio.BrokenResourceError:
                    pass  # the forwarder stopped reading (refused, or answered early): drain
            if not message.get("more_body", False):
                break
    while True:  # the body is complete; only a disconnect can come now
        message = await receive()
        if message["type"] == "http.disconnect":
            state.disconnected(scope)
            return


def _shielded(send):
    """ASGI ``send``, never interrupted by a cancellation.

    hypercorn updates its stream's state only after its write returns; a
    ``send`` cancelled half-way leaves that state behind h11's, and the error
    that follows stops the whole server (hypercorn 0.18). A write does not
    hang for a client that left: the broken socket ends it.
    """
    async def send_shielded(message) -> None:
        with trio.CancelScope(shield=True):
            await send(message)

    return send_shielded


async def _respond(send, status: int, body: bytes, *, close: bool = False,
                   retry_after: int | None = None) -> int:
    """Send a whole JSON answer; ``close``: say ``Connection: close`` (the rest of
    the request body is never read, so the connection cannot carry another request,
    and a client that pooled it would send its next request into a closing socket)."""
    headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _content_length(headers) -> int | None:
    """The declared body length (h11 refused the request already if it is not a number)."""
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return None


def _kind(exc: Exception) -> str:
    """A short name for a transport failure, with its text if it has one."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
