"""The agent's side of ``cosmicac-inference/1``: proxy requests in, model answers out.

:class:`InferenceService` is the :class:`~p2p.host.RpcService` an inference
agent hosts on its swarm (the protocol is drawn in ``contracts/inference.py``).
Its firewall admits the proxies of the agent's config (``authorized_keys``)
and the peers the agent dials itself (its worker, its relays: a firewall is
asked on outgoing dials too); every call is then authorised by the caller's
key alone, so only a proxy gets an answer.

While the model server is not healthy, ``infer`` is refused at once with
``UNAVAILABLE`` (nothing reaches the server), so the proxy retries the request
on another replica. Large bodies arrive first as ``upload`` chunks, kept per
caller and bounded in size, count and age. ``infer_whole`` answers the same
request with one reply (the proxy uses it for answers it expects whole).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import trio

from contracts.inference import (
    AGENT_STATUS,
    INFER,
    INFER_WHOLE,
    MAX_BODY,
    MAX_WHOLE_ANSWER,
    PROTOCOL,
    UPLOAD,
    UPLOAD_TTL_S,
    AgentStatus,
    Empty,
    InferFrame,
    InferRequest,
    UploadChunk,
    UploadResult,
)
from p2p.host import RpcService
from p2p.keys import format_key
from p2p.rpc import CallContext, Router, RpcError

from ._forward import ModelClient

__all__ = ["MAX_UPLOAD_BYTES", "InferenceService", "ServedModel"]

log = logging.getLogger("cosmicac.agent.inference")

#: Bytes of unfinished uploads held at once, all callers together.
MAX_UPLOAD_BYTES = 4 * MAX_BODY
#: Unfinished uploads per caller.
MAX_UPLOADS_PER_CALLER = 16


@dataclass(frozen=True)
class ServedModel:
    """What the agent serves, for ``status``."""

    job_id: str
    replica: int
    served_name: str
    model: str
    runtime: str


@dataclass
class _Upload:
    total: int
    expires_at: float
    data: bytearray = field(default_factory=bytearray)


class InferenceService(RpcService):
    """Forwards authorised proxies' requests to the model server.

    Args:
        served: what is served (for ``status`` and the logs).
        client: the model server's HTTP client (None until the plan knows its port).
        healthy: ``healthy() -> bool``; False refuses requests with ``UNAVAILABLE``.
        proxies: the keys allowed to call.
        peers: keys the agent itself connects to (worker, relays): admitted to
            the connection, refused on every call.
    """

    def __init__(self, served: ServedModel, client: ModelClient, *,
                 healthy: Callable[[], bool], proxies: Callable[[bytes], bool],
                 peers: Callable[[bytes], bool] = lambda key: False) -> None:
        router = Router()
        router.add(INFER, self._infer)
        router.add(INFER_WHOLE, self._infer_whole)
        router.add(UPLOAD, self._upload)
        router.add(AGENT_STATUS, self._status)
        super().__init__(PROTOCOL, router,
                         firewall=lambda key, how: proxies(key) or peers(key))
        self.served = served
        self.client = client
        self._healthy = healthy
        self._proxies = proxies
        self._uploads: dict[tuple[bytes, str], _Upload] = {}
        self._upload_bytes = 0
        self.in_flight = 0
        self.requests = 0

    def _caller(self, ctx: CallContext) -> bytes:
        key = ctx.remote_public_key
        if key is None or not self._proxies(key):
            raise RpcError("FORBIDDEN", "only proxy-inference may send requests to this agent")
        return key

    # -- handlers ------------------------------------------------------------------------

    async def _status(self, params: Empty, ctx: CallContext) -> AgentStatus:
        self._caller(ctx)
        s = self.served
        return AgentStatus(job_id=s.job_id, replica=s.replica, served_name=s.served_name,
                           model=s.model, runtime=s.runtime, healthy=self._healthy(),
                           in_flight=self.in_flight)

    def _admit(self, params: InferRequest, ctx: CallContext) -> bytes:
        """The request's body once the caller, its upload and the server's health pass."""
        key = self._caller(ctx)
        body = params.body
        if params.upload_id is not None:
            body = self._take_upload(key, params.upload_id)
        if not self._healthy():
            raise RpcError("UNAVAILABLE", "the model server is not healthy now")
        return body

    async def _infer(self, params: InferRequest, ctx: CallContext
                     ) -> AsyncIterator[InferFrame]:
        body = self._admit(params, ctx)
        self.in_flight += 1
        self.requests += 1
        try:
            # aclosing: an answer given up (the caller left) closes the model
            # server's connection now, not when the generator is collected.
            async with aclosing(self.client.forward(params.path, params.content_type,
                                                    body)) as frames:
                async for frame in frames:
                    yield frame
        finally:
            self.in_flight -= 1

    async def _infer_whole(self, params: InferRequest, ctx: CallContext) -> InferFrame:
        """``infer``'s answer as one frame (one reply instead of a stream's items and end).

        Raises:
            RpcError: ``infer``'s codes; ``TOO_LARGE`` past :data:`MAX_WHOLE_ANSWER`
                bytes (the proxy asks again with ``infer``).
        """
        body = self._admit(params, ctx)
        self.in_flight += 1
        self.requests += 1
        try:
            return await self.client.whole(params.path, params.content_type, body,
                                           limit=MAX_WHOLE_ANSWER)
        finally:
            self.in_flight -= 1

    async def _upload(self, params: UploadChunk, ctx: CallContext) -> UploadResult:
        key = self._caller(ctx)
        now = trio.current_time()
        self._expire(now)
        slot = (key, params.upload_id)
        upload = self._uploads.get(slot)
        if upload is None:
            if params.offset != 0:
                raise RpcError("BAD_REQUEST", f"upload {params.upload_id} is unknown "
                                              "(expired?); start again at offset 0")
            if sum(1 for owner, _ in self._uploads if owner == key) >= MAX_UPLOADS_PER_CALLER:
                raise RpcError("BAD_REQUEST", "too many unfinished uploads")
            upload = self._uploads[slot] = _Upload(total=params.total,
                                                   expires_at=now + UPLOAD_TTL_S)
        if params.total != upload.total or params.offset != len(upload.data):
            raise RpcError("BAD_REQUEST", f"upload {params.upload_id}: expected offset "
                                          f"{len(upload.data)} of {upload.total}")
        if len(upload.data) + len(params.data) > upload.total:
            raise RpcError("BAD_REQUEST", f"upload {params.upload_id} exceeds its total")
        if self._upload_bytes + len(params.data) > MAX_UPLOAD_BYTES:
            raise RpcError("BUSY", "too many uploads in progress; try again shortly")
        upload.data += params.data
        self._upload_bytes += len(params.data)
        return UploadResult(received=len(upload.data))

    def _take_upload(self, key: bytes, upload_id: str) -> bytes:
        upload = self._uploads.pop((key, upload_id), None)
        if upload is None:
            raise RpcError("BAD_REQUEST", f"upload {upload_id} is unknown or expired")
        self._upload_bytes -= len(upload.data)
        if len(upload.data) != upload.total:
            raise RpcError("BAD_REQUEST", f"upload {upload_id} is incomplete: "
                                          f"{len(upload.data)} of {upload.total} bytes")
        return bytes(upload.data)

    def _expire(self, now: float) -> None:
        for slot, upload in list(self._uploads.items()):
            if upload.expires_at <= now:
                del self._uploads[slot]
                self._upload_bytes -= len(upload.data)
                log.info("inference.upload_expired id=%s caller=%s", slot[1],
                         format_key(slot[0])[:12])
