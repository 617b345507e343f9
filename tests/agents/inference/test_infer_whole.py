"""``infer_whole``: the agent's answer as one reply, or TOO_LARGE past one message."""

from __future__ import annotations

import json

import pytest

from agents.inference._forward import ModelClient
from agents.inference._service import InferenceService, ServedModel
from contracts.inference import MAX_WHOLE_ANSWER, InferFrame, InferRequest, Usage
from p2p.rpc import CallContext, RpcError

from .test_http_pool import raw_server

PROXY = b"p" * 32
CHAT = "/v1/chat/completions"
BODY = b'{"model":"chat","messages":[{"role":"user","content":"hi"}]}'


def answer_with(content_type: bytes, body: bytes, *, chunked: bool = False):
    async def answer(stream, index):
        if chunked:
            framed = b"".join(b"%x\r\n%s\r\n" % (len(event + b"\n\n"), event + b"\n\n")
                              for event in body.split(b"\n\n") if event) + b"0\r\n\r\n"
            head = b"transfer-encoding: chunked"
        else:
            framed, head = body, b"content-length: %d" % len(body)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\n%s\r\n\r\n%s"
                              % (content_type, head, framed))
    return answer


async def test_a_whole_answer_is_one_frame_with_its_usage() -> None:
    answer = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                  "total_tokens": 5}}).encode()
    async with raw_server(answer_with(b"application/json", answer)) as (port, _):
        client = ModelClient("127.0.0.1", port)
        frame = await client.whole(CHAT, "application/json", BODY, limit=MAX_WHOLE_ANSWER)
        await client.aclose()
    assert (frame.status, frame.data, frame.done) == (200, answer, True)
    assert frame.usage == Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)


async def test_a_stream_nobody_asked_for_is_joined_and_billed_by_its_usage_chunk() -> None:
    events = (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,'
              b'"total_tokens":2}}\n\ndata: [DONE]\n\n')
    async with raw_server(answer_with(b"text/event-stream", events, chunked=True)) as (port, _):
        client = ModelClient("127.0.0.1", port)
        frame = await client.whole(CHAT, "application/json", BODY, limit=MAX_WHOLE_ANSWER)
        await client.aclose()
    assert frame.content_type == "text/event-stream" and frame.done
    assert frame.data.endswith(b"data: [DONE]\n\n")
    assert frame.usage == Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)


@pytest.mark.parametrize("kind", [b"application/json", b"text/event-stream"])
async def test_an_answer_larger_than_one_message_is_too_large(kind: bytes) -> None:
    big = b"data: " + b"x" * 200 + b"\n\n"
    async with raw_server(answer_with(kind, big * 20, chunked=kind != b"application/json")
                          ) as (port, _):
        client = ModelClient("127.0.0.1", port)
        with pytest.raises(RpcError) as caught:
            await client.whole(CHAT, "application/json", BODY, limit=1000)
        await client.aclose()
    assert caught.value.code == "TOO_LARGE"


async def test_a_body_the_agent_refuses_is_a_400_frame() -> None:
    client = ModelClient("127.0.0.1", 9)  # never reached
    frame = await client.whole(CHAT, "application/json", b"[1]", limit=MAX_WHOLE_ANSWER)
    assert frame.status == 400 and frame.done and client.refused == 1


class Whole:
    """A model client double answering every request with ``frame``."""

    def __init__(self, frame: InferFrame) -> None:
        self.frame = frame

    async def whole(self, path, content_type, body, *, limit):
        assert limit == MAX_WHOLE_ANSWER
        return self.frame


def service(frame: InferFrame) -> InferenceService:
    served = ServedModel(job_id="j", replica=0, served_name="chat", model="demo",
                         runtime="local")
    return InferenceService(served, Whole(frame), healthy=lambda: True,  # type: ignore[arg-type]
                            proxies=lambda key: key == PROXY)


def context(key: bytes) -> CallContext:
    return CallContext(request_id=1, method="infer_whole", name="t", remote_public_key=key,
                       connection=None)


async def test_the_service_answers_proxies_with_the_clients_frame() -> None:
    frame = InferFrame(status=200, content_type="application/json", data=b"{}", done=True)
    agent = service(frame)
    request = InferRequest(path=CHAT, body=BODY)
    assert await agent._infer_whole(request, context(PROXY)) == frame
    assert agent.in_flight == 0 and agent.requests == 1
    with pytest.raises(RpcError) as caught:
        await agent._infer_whole(request, context(b"s" * 32))
    assert caught.value.code == "FORBIDDEN"
