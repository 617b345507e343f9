"""`cosmicac inference ...` (run in this process) against a small OpenAI-compatible
server the test runs (hypercorn on 127.0.0.1, port 0). Two tests run a real process:
tokens reach stdout as they arrive, and Ctrl-C ends a stream with 130.

The fake checks the bearer and records each request's body; it streams SSE
token by token and, for the ordering test, holds the rest of the answer until
the test has read the first token from the CLI's stdout: the CLI must write
tokens as they arrive, not at the end. The last test puts the real app-node
and the entry point in front (``/api`` → app-node, ``/inference`` → the fake,
whose keys are checked in app-node's shared database) for the key the CLI
creates for itself. Real time, every wait bounded.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import stat
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from cli.inference import sse_data
from nodes.entry.daemon import serve_entry
from nodes.entry.settings import EntrySettings
from p2p.http import serve_asgi
from tests.cli.helpers import process, read_until
from tests.cli.support import EMAIL, PASSWORD, Ran, Served, cli_env, cosmicac, one_error_line

LIMIT_S = 30
KEY = "sk-test-0123456789"
TOKENS = ["Hel", "lo", ", ", "world"]


@dataclass
class Fake:
    """An OpenAI-compatible server: what it saw, and the knobs of each test."""

    #: The bearer check: None if the secret is good, else the error message.
    check: Callable[[str], Awaitable[str | None]]
    requests: list[dict[str, Any]] = field(default_factory=list)
    #: Set by the test once it read the first token; the stream waits for it.
    gate: trio.Event | None = None
    #: Set when a streaming client went away.
    disconnected: trio.Event = field(default_factory=trio.Event)
    url: str = ""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope["path"].removeprefix("/inference")
        scheme, _, secret = headers.get("authorization", "").partition(" ")
        problem = await self.check(secret) if scheme == "Bearer" else "no bearer"
        if problem is not None:
            return await _json(send, 401, _error(problem, "invalid_api_key"))
        if path == "/v1/audio/transcriptions":
            return await self._transcribe(headers, body, send)
        request = json.loads(body)
        self.requests.append({"path": path, "body": request})
        model = request.get("model")
        if model == "missing":
            return await _json(send, 404, _error(f"The model {model!r} does not exist.",
                                                 "model_not_found"))
        if model == "busy":
            return await _json(send, 503, _error("no replica can answer now",
                                                 "model_unavailable"))
        if model == "bad":
            return await _json(send, 400, _error("max_tokens is too large", "invalid_request"))
        if path == "/v1/embeddings":
            data = [{"object": "embedding", "index": i,
                     "embedding": [round(0.125 * (i + j), 4) for j in range(8)]}
                    for i, _ in enumerate(request["input"])]
            return await _json(send, 200, {"object": "list", "data": data, "model": model,
                                           "usage": {"prompt_tokens": 2, "total_tokens": 2}})
        chat = path == "/v1/chat/completions"
        if not request.get("stream"):
            choice = ({"message": {"role": "assistant", "content": "".join(TOKENS)}}
                      if chat else {"text": "".join(TOKENS)})
            return await _json(send, 200, {"id": "x", "object": "chat.completion",
                                           "choices": [{"index": 0, **choice}],
                                           "usage": {"prompt_tokens": 3,
                                                     "completion_tokens": 4,
                                                     "total_tokens": 7}})
        await self._stream(model, chat, receive, send)

    async def _stream(self, model: str, chat: bool, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})

        async def event(data: str) -> None:
            await send({"type": "http.response.body", "body": f"data: {data}\n\n".encode(),
                        "more_body": True})

        def chunk(token: str) -> str:
            choice = {"delta": {"content": token}} if chat else {"text": token}
            return json.dumps({"choices": [{"index": 0, **choice}]})

        await send({"type": "http.response.body", "body": b": keep-alive\n\n",
                    "more_body": True})
        await event(chunk(TOKENS[0]))
        if model == "slow":  # until the client leaves
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
            return
        if model == "broken":
            await event(json.dumps(_error("the model server failed midway", "upstream_error")))
            await send({"type": "http.response.body", "body": b""})
            return
        if self.gate is not None:
            await self.gate.wait()
        for token in TOKENS[1:]:
            await event(chunk(token))
        await event(json.dumps({"choices": [], "usage": {"total_tokens": 7}}))
        await event("[DONE]")
        await send({"type": "http.response.body", "body": b""})

    async def _transcribe(self, headers: dict[str, str], body: bytes, send) -> None:
        message = BytesParser(policy=HTTP).parsebytes(
            b"content-type: " + headers["content-type"].encode() + b"\r\n\r\n" + body)
        parts = {part.get_param("name", header="content-disposition"): part
                 for part in message.iter_parts()}
        audio = parts["file"]
        self.requests.append({"path": "/v1/audio/transcriptions", "body": {
            "model": parts["model"].get_content(), "filename": audio.get_filename(),
            "audio": audio.get_payload(decode=True)}})
        await _json(send, 200, {"text": "hello there"})


def _error(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": code}}


async def _json(send, status: int, document: Any) -> None:
    body = json.dumps(document).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _key_is(secret: str) -> str | None:
    return None if secret == KEY else "Incorrect API key provided."


async def start_fake(nursery: trio.Nursery, check=_key_is) -> Fake:
    fake = Fake(check)
    host, port = await nursery.start(lambda task_status: serve_asgi(
        fake, host="127.0.0.1", port=0, bind_error=lambda h, p, c: c, task_status=task_status))
    fake.url = f"http://{host}:{port}"
    return fake


@pytest.fixture
async def fake(nursery: trio.Nursery) -> Fake:
    return await start_fake(nursery)


def env_for(tmp_path: Path, server: str, *, key: str | None = KEY) -> dict[str, str]:
    env = cli_env(tmp_path / "config", server)
    if key is not None:
        env["COSMICAC_API_KEY"] = key
    return env


async def run(env: dict[str, str], *args: str, stdin: bytes = b"") -> Ran:
    with trio.fail_after(LIMIT_S):
        return await cosmicac("inference", *args, env=env, stdin=stdin)


# -- the SSE reader ---------------------------------------------------------------


def test_sse_data_joins_data_lines_and_skips_comments_and_other_fields() -> None:
    lines = [": hi", "event: x", "data: a", "data:b", "", "", "id: 3", "data: [DONE]"]
    assert list(sse_data(lines)) == ["a\nb", "[DONE]"]


_LINE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"))


@given(st.lists(st.lists(_LINE, min_size=1, max_size=3), max_size=5))
def test_sse_data_gives_back_every_event_it_is_sent(events: list[list[str]]) -> None:
    lines: list[str] = []
    for event in events:
        lines += [": comment"] + [f"data: {line}" for line in event] + [""]
    assert list(sse_data(lines)) == ["\n".join(event) for event in events]


# -- against the fake -------------------------------------------------------------


async def test_chat_sends_its_options_and_prints_the_streamed_tokens_in_order(
        tmp_path, fake: Fake) -> None:
    """(That each token shows as it arrives, a real process on a pipe: the Ctrl-C test.)"""
    result = await run(env_for(tmp_path, fake.url), "chat", "--model", "demo", "--system",
                       "be brief", "--max-tokens", "16", "--temperature", "0.5", "Say hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"Hello, world\n"
    [seen] = fake.requests
    assert seen["path"] == "/v1/chat/completions"
    assert seen["body"] == {"model": "demo", "stream": True, "max_tokens": 16,
                            "temperature": 0.5, "messages": [
                                {"role": "system", "content": "be brief"},
                                {"role": "user", "content": "Say hi"}]}


async def test_chat_without_streaming_and_as_json(tmp_path, fake: Fake) -> None:
    env = env_for(tmp_path, fake.url)
    whole = await run(env, "chat", "--model", "demo", "--no-stream", "Say hi")
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout == b"Hello, world\n"
    as_json = await run(env, "chat", "--model", "demo", "-", "-o", "json", stdin=b"from stdin\n")
    assert as_json.returncode == 0, as_json.stderr
    answer = json.loads(as_json.stdout)
    assert answer["usage"]["total_tokens"] == 7
    assert answer["choices"][0]["message"]["content"] == "Hello, world"
    assert [r["body"]["stream"] for r in fake.requests] == [False, False]
    assert fake.requests[1]["body"]["messages"] == [{"role": "user",
                                                     "content": "from stdin\n"}]


async def test_complete_streams_the_text(tmp_path, fake: Fake) -> None:
    result = await run(env_for(tmp_path, fake.url), "complete", "--model", "demo", "Once")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"Hello, world\n"
    assert fake.requests[0]["path"] == "/v1/completions"
    assert fake.requests[0]["body"] == {"model": "demo", "prompt": "Once", "stream": True}


async def test_embed_prints_dims_and_first_values_or_the_whole_json(tmp_path, fake: Fake
                                                                    ) -> None:
    env = env_for(tmp_path, fake.url)
    table = await run(env, "embed", "--model", "minilm", "a cat", "a dog")
    assert table.returncode == 0, table.stderr
    text = table.stdout.decode()
    assert "DIMS" in text and "0.1250, 0.2500, 0.3750, 0.5000, …" in text
    as_json = await run(env, "embed", "--model", "minilm", "a cat", "-o", "json")
    vectors = [d["embedding"] for d in json.loads(as_json.stdout)["data"]]
    assert vectors == [[0.125 * j for j in range(8)]]
    assert fake.requests[0]["body"] == {"model": "minilm", "input": ["a cat", "a dog"],
                                        "encoding_format": "float"}


async def test_transcribe_sends_the_file_as_multipart(tmp_path, fake: Fake) -> None:
    audio = tmp_path / "talk.wav"
    audio.write_bytes(b"RIFF\x00\x01fake audio\r\n--not-a-boundary")
    result = await run(env_for(tmp_path, fake.url), "transcribe", str(audio),
                       "--model", "parakeet")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"hello there\n"
    [seen] = fake.requests
    assert seen["body"] == {"model": "parakeet", "filename": "talk.wav",
                            "audio": audio.read_bytes()}


@pytest.mark.parametrize("model, code, needle", [
    ("missing", 1, "cosmicac jobs list"),
    ("busy", 1, "model_unavailable"),
    ("bad", 2, "max_tokens is too large"),
    ("broken", 1, "failed midway"),
])
async def test_proxy_errors_are_one_line_with_their_exit_code(tmp_path, fake: Fake, model,
                                                              code, needle) -> None:
    result = await run(env_for(tmp_path, fake.url), "chat", "--model", model, "hi")
    assert result.returncode == code, result.stderr
    assert needle in one_error_line(result)


async def test_a_refused_key_an_unreachable_server_and_no_key_at_all(tmp_path, fake: Fake
                                                                     ) -> None:
    wrong = await run(env_for(tmp_path, fake.url, key="sk-wrong"), "chat", "--model", "demo",
                      "hi")
    assert wrong.returncode == 1
    assert "COSMICAC_API_KEY" in one_error_line(wrong)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    down = await run(env_for(tmp_path, f"http://127.0.0.1:{port}"), "chat", "--model", "demo",
                     "hi")
    assert down.returncode == 4
    assert "cannot reach" in one_error_line(down)
    nobody = await run(env_for(tmp_path, fake.url, key=None), "chat", "--model", "demo", "hi")
    assert nobody.returncode == 3
    assert "cosmicac login" in one_error_line(nobody)
    empty = await run(env_for(tmp_path, fake.url), "chat", "--model", "demo", "-", stdin=b"")
    assert empty.returncode == 2
    assert fake.requests == []


async def test_proxy_inference_down_behind_the_entry_point_is_unreachable(
        tmp_path, nursery: trio.Nursery) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    entry = await nursery.start(serve_entry, EntrySettings(
        host="127.0.0.1", port=0, api_url=dead, inference_url=dead))
    result = await run(env_for(tmp_path, entry.url), "chat", "--model", "demo", "hi")
    assert result.returncode == 4
    line = one_error_line(result)
    assert "unreachable" in line and "UPSTREAM_UNREACHABLE" in line


async def test_a_token_shows_as_it_arrives_and_ctrl_c_mid_stream_exits_130_closing_it(
        tmp_path, fake: Fake) -> None:
    """A real process on a pipe: the first token is on its stdout while the server still
    holds the rest (the "slow" model sends nothing more until the client leaves); Ctrl-C
    then ends it with 130, no traceback, and closes the request."""
    with trio.fail_after(LIMIT_S):
        async with process("inference", "chat", "--model", "slow", "hi",
                           stdout=subprocess.PIPE, env=env_for(tmp_path, fake.url)) as proc:
            await read_until(proc.stdout, re.compile("^Hel"))
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 130
            await fake.disconnected.wait()
            rest = await proc.stderr.receive_some()
    assert b"Traceback" not in rest


# -- the CLI's own key, through the entry point and a real app-node ---------------


@pytest.mark.slow
async def test_the_cli_creates_keeps_and_renews_its_own_key(tmp_path, served: Served,
                                                             nursery: trio.Nursery) -> None:
    db = served.node.services.database
    lagging: set[str] = set()

    async def in_the_shared_database(secret: str) -> str | None:
        key = await db.api_key_by_secret(secret)
        if key is None:
            return "Incorrect API key provided."
        if key.revoked:
            return "This API key has been revoked."
        if secret not in lagging:  # as a proxy whose replica has not seen it yet
            lagging.add(secret)
            return "Incorrect API key provided."
        return None

    fake = await start_fake(nursery, in_the_shared_database)
    entry = await nursery.start(serve_entry, EntrySettings(
        host="127.0.0.1", port=0, api_url=served.server, inference_url=fake.url))
    env = cli_env(served.config, entry.url)
    with trio.fail_after(120):
        login = await cosmicac("login", "--email", EMAIL, "--password-stdin", env=env,
                               stdin=f"{PASSWORD}\n".encode())
        assert login.returncode == 0, login.stderr

        first = await run(env, "chat", "--model", "demo", "hi")
        assert first.returncode == 0, first.stderr
        assert first.stdout == b"Hello, world\n"
        assert b"created API key" in first.stderr
        path = served.config / "inference-key.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        saved = json.loads(path.read_text())["keys"][entry.url]
        assert saved["name"] == f"cosmicac-cli {socket.gethostname()}"
        assert saved["email"] == EMAIL

        again = await run(env, "chat", "--model", "demo", "--no-stream", "hi")
        assert again.returncode == 0 and again.stderr == b"", again.stderr

        revoke = await cosmicac("apikeys", "revoke", saved["id"], env=env)
        assert revoke.returncode == 0, revoke.stderr
        renewed = await run(env, "chat", "--model", "demo", "hi")
        assert renewed.returncode == 0, renewed.stderr
        assert b"was refused" in renewed.stderr and b"created API key" in renewed.stderr
        assert renewed.stdout == b"Hello, world\n"
        new = json.loads(path.read_text())["keys"][entry.url]
        assert new["id"] != saved["id"]

        # A key given on the command line is never replaced.
        given = await run({**env, "COSMICAC_API_KEY": saved["key"]}, "chat", "--model",
                          "demo", "hi")
        assert given.returncode == 1
        assert "revoked" in one_error_line(given)
        assert json.loads(path.read_text())["keys"][entry.url]["id"] == new["id"]

        # Logging out revokes the CLI's own key and forgets it.
        logout = await cosmicac("logout", env=env)
        assert logout.returncode == 0, logout.stderr
        assert json.loads(path.read_text())["keys"] == {}
        assert (await db.api_key(new["id"])).revoked
