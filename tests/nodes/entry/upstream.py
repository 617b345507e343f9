"""Tiny upstreams for the entry point's tests: Starlette apps served over real sockets.

One app stands for app-node or proxy-inference. It answers:

- ``/…/echo`` (any method): what it received, as JSON (raw path, query,
  headers, body length and sha256);
- ``/…/events``: Server-Sent Events ``0..n-1``, one every ``gap_s``; before
  the last it waits for ``Upstream.first_seen`` (set by the test once the client
  got event 0), so the last is never sent before the client saw the first;
- ``/…/forever``: events until the client goes; ``Upstream.stream_ended`` is
  set when the generator is closed;
- ``/…/slow``: answers after ``slow_s``;
- ``/…/hop``: a response carrying hop-by-hop headers.
"""

from __future__ import annotations

import functools
import hashlib
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from p2p.http import ServerBindError, serve_asgi

ALL = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@dataclass
class Upstream:
    """One tiny upstream: its name, its address once serving, and what the tests wait on."""

    name: str
    events: int = 5
    gap_s: float = 0.05
    slow_s: float = 5.0
    url: str = ""
    first_seen: trio.Event = field(default_factory=trio.Event)
    stream_started: trio.Event = field(default_factory=trio.Event)
    stream_ended: trio.Event = field(default_factory=trio.Event)
    #: trio.current_time() when each event of /events was sent.
    sent_at: list[float] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/{rest:path}/echo", self.echo, methods=ALL),
            Route("/{rest:path}/events", self.sse, methods=["GET", "POST"]),
            Route("/{rest:path}/forever", self.forever, methods=["GET"]),
            Route("/{rest:path}/slow", self.slow, methods=["GET"]),
            Route("/{rest:path}/hop", self.hop, methods=["GET"]),
            Route("/{rest:path}", self.echo, methods=ALL),
        ])

    async def echo(self, request: Request) -> Response:
        digest, length = hashlib.sha256(), 0
        async for chunk in request.stream():
            digest.update(chunk)
            length += len(chunk)
        return JSONResponse({
            "upstream": self.name, "method": request.method,
            "raw_path": request.scope["raw_path"].decode(),
            "query": request.scope["query_string"].decode(),
            "headers": [[k.decode(), v.decode()] for k, v in request.scope["headers"]],
            "length": length, "sha256": digest.hexdigest()})

    async def sse(self, request: Request) -> Response:
        async def events():
            for i in range(self.events):
                if i == self.events - 1:
                    with trio.fail_after(10):
                        await self.first_seen.wait()
                elif i:
                    await trio.sleep(self.gap_s)
                self.sent_at.append(trio.current_time())
                yield f"data: {i}\n\n".encode()
        return StreamingResponse(events(), media_type="text/event-stream")

    async def forever(self, request: Request) -> Response:
        async def events():
            self.stream_started.set()
            try:
                for i in range(10_000):  # bounded: 10,000 events, 10 ms apart
                    yield f"data: {i}\n\n".encode()
                    await trio.sleep(0.01)
            finally:
                self.stream_ended.set()
        return StreamingResponse(events(), media_type="text/event-stream")

    async def slow(self, request: Request) -> Response:
        await trio.sleep(self.slow_s)
        return JSONResponse({"late": True})

    async def hop(self, request: Request) -> Response:
        return Response(b"hop", headers={"Keep-Alive": "timeout=5", "Proxy-Authenticate": "x",
                                         "X-Kept": "yes"})


@asynccontextmanager
async def serving(*upstreams: Upstream):
    """Serve each upstream on 127.0.0.1 (a free port); set its ``url``."""
    async with trio.open_nursery() as nursery:
        for upstream in upstreams:
            host, port = await nursery.start(functools.partial(
                serve_asgi, upstream.app(), host="127.0.0.1", port=0,
                bind_error=ServerBindError))
            upstream.url = f"http://{host}:{port}"
        yield upstreams
        nursery.cancel_scope.cancel()
