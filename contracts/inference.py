"""How proxy-inference reaches a Managed Inference Job's agents: RPC protocol
``cosmicac-inference/1`` and the job's DHT topic.

Finding the agents
------------------
An agent-inference announces itself on :func:`job_topic` (derived from the
job id) while its model server is healthy, and leaves the topic when it is
not. proxy-inference looks the topic up to learn where the job's agents are.
A DHT record proves only that its announcer holds some key, so the proxy
talks to an announcer only if wrk-ork lists that key among the job's agents
(the worker learns it from the agent's ``hello`` and reports it with the
replica's state; ``ReplicaView.agents``). The agent, in turn, serves only the
proxy keys in its config's ``authorized_keys``.

The protocol
------------
The agent serves it on its swarm; the proxy opens one channel per connection.
Every message is a msgpack map (p2p/rpc README, "Wire format")::

    infer(InferRequest)        => InferFrame, InferFrame, ...
    infer_whole(InferRequest)  -> InferFrame
    upload(UploadChunk)        -> UploadResult
    status(Empty)              -> AgentStatus

``infer_whole`` is ``infer`` for an answer the proxy expects whole (a chat or
completion that is not a stream, its body inline): one reply, the whole
answer as one frame (``done``), one message each way instead of a stream's
items, end and credit. An answer whose data would pass
:data:`MAX_WHOLE_ANSWER` is refused with ``TOO_LARGE`` (the proxy asks again
with ``infer``); an agent without the method answers ``UNKNOWN_METHOD``
(the proxy uses ``infer`` with it from then on).

``infer`` carries one OpenAI request: its path, content type and body (the
bytes the client sent; the agent passes them to the model server, a chat's or
a completion's as a canonical body it builds: agents/inference/README.md,
"What is billed"). A body
larger than :data:`MAX_INLINE_BODY` (an audio file) is sent first in
``upload`` chunks of at most :data:`MAX_INLINE_BODY` bytes under an
``upload_id`` the proxy picks, and ``infer`` names that id with an empty body;
an upload is the caller's alone and is dropped after the ``infer`` that uses
it or after :data:`UPLOAD_TTL_S`.

The answer is a stream of frames. The first frame has the model server's
``status`` and ``content_type``; frames carry ``data`` (the response body, or
for a streamed response whole SSE events, ``data: {...}\\n\\n``, as the model
server sent them); the last frame has ``usage`` (the token counts or audio
duration the model server reported; for a stream that reported none, the
completion pieces the agent counted; all zero when nothing could be counted)
and ``done``. A request that failed before the first frame was sent has done
nothing the client could see: the proxy may retry it on another replica.

Error codes (``RpcError.code``): ``FORBIDDEN`` (not an authorised proxy),
``UNAVAILABLE`` (the model server is not healthy: nothing was sent to it),
``BAD_REQUEST`` (a path the agent does not forward, a body too large, an
unknown upload), ``UPSTREAM`` (the model server failed or closed mid-answer),
``BUSY`` (too many requests in flight; the RPC layer's own), ``TOO_LARGE``
(``infer_whole``'s answer does not fit one message).
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from p2p.rpc import Method, StreamMethod

__all__ = [
    "AGENT_STATUS",
    "FORWARDED_PATHS",
    "INFER",
    "INFER_WHOLE",
    "MAX_BODY",
    "MAX_INLINE_BODY",
    "MAX_WHOLE_ANSWER",
    "PROTOCOL",
    "UPLOAD",
    "UPLOAD_TTL_S",
    "AgentStatus",
    "Empty",
    "InferFrame",
    "InferRequest",
    "UploadChunk",
    "UploadResult",
    "Usage",
    "job_topic",
]

PROTOCOL = "cosmicac-inference/1"

#: The OpenAI paths an agent forwards to its model server (``/v1/models`` is
#: answered by the proxy from the job table, never forwarded).
FORWARDED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                   "/v1/audio/transcriptions")
ForwardedPath = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                        "/v1/audio/transcriptions"]

#: Largest body sent inside ``infer`` (a mux message is at most 512 KiB).
MAX_INLINE_BODY = 256 << 10
#: Largest request body at all (OpenAI's limit for an audio file is 25 MB).
MAX_BODY = 32 << 20
#: An upload that no ``infer`` used is dropped after this long.
UPLOAD_TTL_S = 60.0

_TOPIC_DOMAIN = b"cosmicac/inference-job/v1\x00"


def job_topic(job_id: str) -> bytes:
    """The 32-byte DHT topic a job's agents announce themselves on."""
    return hashlib.blake2b(_TOPIC_DOMAIN + job_id.encode("utf-8"), digest_size=32).digest()


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Empty(_Message):
    pass


class Usage(_Message):
    """What one request used, as the model server counted it."""

    prompt_tokens: int = Field(default=0, ge=0, le=2**53 - 1)
    completion_tokens: int = Field(default=0, ge=0, le=2**53 - 1)
    total_tokens: int = Field(default=0, ge=0, le=2**53 - 1)
    #: Audio transcribed, in milliseconds (speech-to-text).
    audio_ms: int = Field(default=0, ge=0, le=2**53 - 1)


class InferRequest(_Message):
    """One OpenAI request, as the client sent it."""

    path: ForwardedPath
    content_type: str = Field(default="application/json", max_length=256)
    body: bytes = Field(default=b"", max_length=MAX_INLINE_BODY)
    #: The body was uploaded beforehand under this id (``body`` is then empty).
    upload_id: str | None = Field(default=None, min_length=1, max_length=64)
    #: The proxy's request id, for both sides' logs.
    request_id: str = Field(default="", max_length=64)


class InferFrame(_Message):
    """One piece of the answer (see the module doc for their order)."""

    status: int | None = Field(default=None, ge=100, le=599)
    content_type: str | None = Field(default=None, max_length=256)
    data: bytes = b""
    usage: Usage | None = None
    done: bool = False


class UploadChunk(_Message):
    """A piece of a large body, at ``offset``; ``total`` is the whole body's size."""

    upload_id: str = Field(min_length=1, max_length=64)
    offset: int = Field(ge=0, le=MAX_BODY)
    total: int = Field(ge=1, le=MAX_BODY)
    data: bytes = Field(min_length=1, max_length=MAX_INLINE_BODY)


class UploadResult(_Message):
    received: int


class AgentStatus(_Message):
    """What an agent serves and whether its model server is healthy now."""

    job_id: str
    replica: int
    served_name: str
    model: str
    runtime: str
    healthy: bool
    in_flight: int


INFER = StreamMethod("infer", params=InferRequest, item=InferFrame)
#: Most bytes of data in ``infer_whole``'s one frame (a mux message is 512 KiB).
MAX_WHOLE_ANSWER = 256 << 10
INFER_WHOLE = Method("infer_whole", params=InferRequest, result=InferFrame)
UPLOAD = Method("upload", params=UploadChunk, result=UploadResult)
AGENT_STATUS = Method("status", params=Empty, result=AgentStatus)
