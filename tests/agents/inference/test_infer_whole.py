"""``infer_whole``: the agent's answer as one reply, or TOO_LARGE past one message."""

from __future__ import annotations

import pytest

from agents.inference._service import InferenceService, ServedModel
from contracts.inference import MAX_WHOLE_ANSWER, InferFrame, InferRequest, Usage
from p2p.rpc import CallContext, RpcError

PROXY = b"p" * 32


class Frames:
    """A model client double: answers every request with ``frames``."""

    def __init__(self, frames: list[InferFrame]) -> None:
        self.frames = frames
        self.closed = False

    async def forward(self, path, content_type, body):
        try:
            for frame in self.frames:
                yield frame
        finally:
            self.closed = True


def service(frames: list[InferFrame]) -> tuple[InferenceService, Frames]:
    client = Frames(frames)
    served = ServedModel(job_id="j", replica=0, served_name="chat", model="demo",
                         runtime="local")
    return InferenceService(served, client, healthy=lambda: True,  # type: ignore[arg-type]
                            proxies=lambda key: key == PROXY), client


CTX = CallContext(request_id=1, method="infer_whole", name="t", remote_public_key=PROXY,
                  connection=None)
REQUEST = InferRequest(path="/v1/chat/completions", body=b"{}")


async def test_a_whole_answer_is_its_one_frame() -> None:
    frame = InferFrame(status=200, content_type="application/json", data=b"{}",
                       usage=Usage(prompt_tokens=1, total_tokens=1), done=True)
    agent, _ = service([frame])
    assert await agent._infer_whole(REQUEST, CTX) == frame
    assert agent.in_flight == 0 and agent.requests == 1


async def test_a_streamed_answer_is_joined_into_one_frame() -> None:
    agent, _ = service([
        InferFrame(status=200, content_type="text/event-stream", data=b"data: 1\n\n"),
        InferFrame(data=b"data: 2\n\n"),
        InferFrame(data=b"", usage=Usage(completion_tokens=2, total_tokens=2), done=True)])
    whole = await agent._infer_whole(REQUEST, CTX)
    assert (whole.status, whole.content_type, whole.data, whole.usage, whole.done) == (
        200, "text/event-stream", b"data: 1\n\ndata: 2\n\n",
        Usage(completion_tokens=2, total_tokens=2), True)


async def test_an_answer_larger_than_one_message_is_too_large() -> None:
    piece = b"x" * (MAX_WHOLE_ANSWER // 2 + 1)
    agent, client = service([InferFrame(status=200, content_type="text/event-stream",
                                        data=piece), InferFrame(data=piece),
                             InferFrame(done=True)])
    with pytest.raises(RpcError) as caught:
        await agent._infer_whole(REQUEST, CTX)
    assert caught.value.code == "TOO_LARGE"
    assert client.closed and agent.in_flight == 0  # the model's answer is given up at once


async def test_an_answer_without_its_end_is_upstream() -> None:
    agent, _ = service([InferFrame(status=200, content_type="text/event-stream", data=b"a")])
    with pytest.raises(RpcError) as caught:
        await agent._infer_whole(REQUEST, CTX)
    assert caught.value.code == "UPSTREAM"


async def test_only_proxies_may_ask() -> None:
    agent, _ = service([InferFrame(status=200, done=True)])
    stranger = CallContext(request_id=1, method="infer_whole", name="t",
                           remote_public_key=b"s" * 32, connection=None)
    with pytest.raises(RpcError) as caught:
        await agent._infer_whole(REQUEST, stranger)
    assert caught.value.code == "FORBIDDEN"
