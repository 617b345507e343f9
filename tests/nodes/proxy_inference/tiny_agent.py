"""A tiny scripted ``cosmicac-inference/1`` agent, for the proxy's error paths only.

The real agent (agents/inference) forwards to a real model server; the
integration tests use it. This one answers from a script, so a test can make
a replica refuse (``UNAVAILABLE``), break off mid-answer, or answer with fixed
frames, and count what it was asked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import trio

from contracts.inference import (
    INFER,
    INFER_WHOLE,
    PROTOCOL,
    UPLOAD,
    InferFrame,
    InferRequest,
    UploadChunk,
    UploadResult,
    Usage,
)
from p2p.host import RpcService
from p2p.rpc import CallContext, Router, RpcError


@dataclass
class TinyAgent:
    """``mode``: ``ok`` (a JSON answer, or SSE when the body asks to stream),
    ``unavailable`` (refuse before the first frame), ``break`` (first frame, then fail),
    ``nousage`` (as ``ok``, with no usage on the last frame)."""

    name: str
    mode: str = "ok"
    #: A stream's last frame (usage, done) comes this long after ``[DONE]``.
    done_delay_s: float = 0.0
    requests: list[InferRequest] = field(default_factory=list)
    uploads: dict[str, bytearray] = field(default_factory=dict)
    #: Serves ``infer_whole`` too (as today's agents do); False: an older agent.
    whole: bool = False
    #: The requests that came as ``infer_whole``.
    whole_requests: list[InferRequest] = field(default_factory=list)

    def service(self) -> RpcService:
        router = Router()
        router.add(INFER, self._infer)
        router.add(UPLOAD, self._upload)
        if self.whole:
            router.add(INFER_WHOLE, self._infer_whole)
        return RpcService(PROTOCOL, router)

    async def _infer_whole(self, request: InferRequest, ctx: CallContext) -> InferFrame:
        self.whole_requests.append(request)
        frames = [frame async for frame in self._infer(request, ctx)]
        return InferFrame(status=frames[0].status, content_type=frames[0].content_type,
                          data=b"".join(frame.data for frame in frames),
                          usage=frames[-1].usage, done=True)

    async def _upload(self, chunk: UploadChunk, ctx: CallContext) -> UploadResult:
        buffer = self.uploads.setdefault(chunk.upload_id, bytearray())
        buffer[chunk.offset:chunk.offset + len(chunk.data)] = chunk.data
        return UploadResult(received=len(buffer))

    async def _infer(self, request: InferRequest, ctx: CallContext) -> AsyncIterator[InferFrame]:
        self.requests.append(request)
        if self.mode == "unavailable":
            raise RpcError("UNAVAILABLE", "the model server is not healthy")
        body = request.body or bytes(self.uploads.pop(request.upload_id or "", b""))
        usage = Usage() if self.mode == "nousage" else \
            Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
        if b'"stream": true' in body or b'"stream":true' in body:
            yield InferFrame(status=200, content_type="text/event-stream",
                             data=b'data: {"agent": "%s"}\n\n' % self.name.encode())
            if self.mode == "break":
                await trio.lowlevel.checkpoint()
                raise RpcError("UPSTREAM", "the model server closed mid-answer")
            yield InferFrame(data=b"data: [DONE]\n\n")
            await trio.sleep(self.done_delay_s)
            yield InferFrame(usage=usage, done=True)
            return
        if self.mode == "break":
            yield InferFrame(status=200, content_type="application/json", data=b'{"par')
            raise RpcError("UPSTREAM", "the model server closed mid-answer")
        yield InferFrame(status=200, content_type="application/json",
                         data=b'{"agent": "%s", "size": %d}' % (self.name.encode(), len(body)),
                         usage=usage, done=True)
