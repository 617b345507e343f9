"""Streams billed 0, as a class: every body the model server streams is billed with the
usage the server counts (the same as its non-streamed answer reports), for chat and
completions, whatever shape its ``stream`` takes. The agent's side for real: its
:class:`ModelClient` against the ``demo`` model server in a subprocess."""

from __future__ import annotations

import json
import select
import subprocess
import sys

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.inference._forward import ModelClient
from contracts.inference import Usage
from tests.examples import examples

from .stream_bodies import CHAT, COMPLETIONS, CONTENT_TYPES, request_bodies

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> str:
    """The demo model server serving ``m``: its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "agents.inference.server", "--model", "demo",
                             "--port", "0", "--served-name", "m"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("listening http://"), f"the model server said {line!r}"
        yield line.split()[1]
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def http():
    """One client for the module: ``httpx.post`` builds a client, and its TLS context
    (certifi's bundle read and parsed, tens of ms of CPU), for every request."""
    with httpx.Client(timeout=30) as client:
        yield client


def through_the_agent(url: str, path: str, kind: str, body: bytes) -> list:
    host, _, port = url.removeprefix("http://").rpartition(":")

    async def forward() -> list:
        client = ModelClient(host, int(port))
        try:
            with trio.fail_after(30):
                return [frame async for frame in client.forward(path, kind, body)]
        finally:
            await client.aclose()

    return trio.run(forward)


def usage_chunks(stream: bytes) -> list[dict]:
    """The usage-only events (``choices: []``) of an SSE stream."""
    return [chunk for event in stream.decode().split("\n\n")
            if event.startswith("data:") and event[5:].strip() != "[DONE]"
            and (chunk := json.loads(event[5:])).get("choices") == []]


@settings(max_examples=examples(60), deadline=None)
@given(st.sampled_from([CHAT, COMPLETIONS]).flatmap(
    lambda path: st.tuples(st.just(path), request_bodies(path), st.sampled_from(CONTENT_TYPES))))
def test_every_body_the_server_streams_is_billed_as_its_whole_answer(server, http, case):
    path, body, kind = case
    headers = {"content-type": kind} if kind else {}
    direct = http.post(server + path, content=body, headers=headers)
    frames = through_the_agent(server, path, kind, body)
    billed = frames[-1].usage
    if not direct.headers.get("content-type", "").startswith("text/event-stream"):
        if direct.status_code == 200:  # a whole answer: billed as it says
            assert billed == Usage(**direct.json()["usage"])
        return
    # The server streams this body: through the agent it streams too, and is billed.
    assert frames[0].status == 200 and frames[0].content_type.startswith("text/event-stream")
    request = json.loads(body)
    request.pop("stream_options", None)
    whole = http.post(server + path, json={**request, "stream": False})
    assert billed == Usage(**whole.json()["usage"]) and billed.total_tokens > 0
    # The client sees the usage chunk only if it asked (the server's own rule).
    passed_on = usage_chunks(b"".join(frame.data for frame in frames))
    assert len(passed_on) == len(usage_chunks(direct.content))
