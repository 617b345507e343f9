"""proxy-inference over real sockets, with tiny scripted agents for the paths a real model
server cannot be made to take on demand: refusals, retries, answers broken midway, no
replica, strangers on a job's topic, large bodies. Real HTTP, a real shared database."""

from __future__ import annotations

import json
import logging

import pytest
import trio

from contracts.inference import MAX_BODY, MAX_INLINE_BODY, job_topic
from contracts.model import JobStatus
from p2p.keys import KeyPair
from tests.p2p.helpers import wait_until

from .harness import CHAT, client, inference_spec, job_view, proxy_world, two_agents
from .tiny_agent import TinyAgent

pytestmark = pytest.mark.slow


async def test_keys_models_and_bodies_are_checked_before_anything_is_forwarded(tmp_path):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            _, secret = await world.add_key("team-a")
            _, other_secret = await world.add_key("team-b")
            await world.start_proxy()
            await world.wait_replicated()
            _, agents = await two_agents(world)
            spec_b = inference_spec("chat", team="team-b")
            world.jobs.set([*world.jobs.jobs,
                            job_view("j-starting", inference_spec("later"), [],
                                     status=JobStatus.STARTING),
                            job_view("j-degraded", inference_spec("half"), [],
                                     status=JobStatus.DEGRADED),
                            job_view("j-b", spec_b, [], status=JobStatus.ACTIVE)])
            async with client(world, secret) as http:
                response = await http.get("/models")
                assert response.status_code == 200
                assert [m["id"] for m in response.json()["data"]] == ["chat"]
                assert (await http.get("/models/chat")).json()["owned_by"] == "team-a"
                for body, status, code in [
                    (b"{nope", 400, "invalid_request"),
                    (b"[1, 2]", 400, "invalid_request"),
                    (json.dumps({"messages": []}).encode(), 400, "invalid_request"),
                    (json.dumps({**CHAT, "model": "later"}).encode(), 404, "model_not_found"),
                    (json.dumps({**CHAT, "model": "gpt-9"}).encode(), 404, "model_not_found"),
                ]:
                    response = await http.post("/chat/completions", content=body)
                    assert response.status_code == status, body
                    error = response.json()["error"]
                    assert error["code"] == code and set(error) == {"message", "type", "param",
                                                                    "code"}
                # Degraded jobs take requests but are not listed; this one has no replica.
                response = await http.post("/chat/completions", json={**CHAT, "model": "half"})
                assert response.status_code == 503
                assert response.json()["error"]["code"] == "model_unavailable"
            async with client(world, "sk-nobody") as http:
                response = await http.post("/chat/completions", json=CHAT)
                assert response.status_code == 401
                assert response.json()["error"]["code"] == "invalid_api_key"
                assert (await http.get("/models")).status_code == 401
            async with client(world, None) as http:
                assert (await http.post("/chat/completions", json=CHAT)).status_code == 401
            async with client(world, other_secret) as http:  # team-b's job has no replica
                assert (await http.get("/models")).json()["data"][0]["id"] == "chat"
                response = await http.post("/chat/completions", json=CHAT)
                assert response.status_code == 503
            assert sum(len(a.requests) for a in agents) == 0


async def test_requests_alternate_and_a_refusing_replica_is_retried_elsewhere(tmp_path):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            key_id, secret = await world.add_key()
            # A back-off longer than the six requests take on the busiest machine (at
            # 0.5 s a loaded CI runner saw agent0 asked again once it had run out).
            proxy = await world.start_proxy(replica_backoff_s=60.0)
            await world.wait_replicated()
            _, agents = await two_agents(world)
            async with client(world, secret) as http:
                answered = [(await http.post("/chat/completions", json=CHAT)).json()["agent"]
                            for _ in range(6)]
                assert answered in (["agent0", "agent1"] * 3, ["agent1", "agent0"] * 3)
                agents[0].mode = "unavailable"
                for _ in range(6):
                    response = await http.post("/chat/completions", json=CHAT)
                    assert response.status_code == 200
                    assert response.json()["agent"] == "agent1"
                # agent0 was asked once, then left alone during its back-off.
                assert len(agents[0].requests) == 4
                retries = proxy.metrics.retries.labels("chat")._value.get()
                assert retries == 1
                agents[1].mode = "unavailable"
                response = await http.post("/chat/completions", json=CHAT)
                assert response.status_code == 503
            await wait_until(lambda: proxy.recorder.settled, limit_s=10)
            rows = await proxy.recorder.db.usage(key_id)
            # Every answered request counted once: 6 + 6, 3 + 2 tokens each.
            assert [(r.model, r.requests, r.prompt, r.completion, r.total) for r in rows] == [
                ("chat", 12, 36, 24, 60)]
            assert await proxy.recorder.db.last_used(key_id) is not None


async def test_a_stream_broken_midway_ends_with_an_error_event(tmp_path):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            _, secret = await world.add_key()
            await world.start_proxy()
            await world.wait_replicated()
            await two_agents(world, modes=("break",))
            async with client(world, secret) as http:
                async with http.stream("POST", "/chat/completions",
                                       json={**CHAT, "stream": True}) as response:
                    assert response.status_code == 200
                    assert response.headers["content-type"].startswith("text/event-stream")
                    body = b"".join([chunk async for chunk in response.aiter_bytes()])
                events = [line for line in body.split(b"\n\n") if line]
                assert events[0] == b'data: {"agent": "agent0"}'
                assert json.loads(events[-1].removeprefix(b"data: "))["error"]["code"] == \
                    "upstream_error"
                response = await http.post("/chat/completions", json=CHAT)
                assert response.status_code == 502
                assert response.json()["error"]["code"] == "upstream_error"


async def test_a_large_body_is_uploaded_in_chunks_before_the_request(tmp_path):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            _, secret = await world.add_key()
            await world.start_proxy()
            await world.wait_replicated()
            _, agents = await two_agents(world, modes=("ok",))
            big = {**CHAT, "messages": [{"role": "user", "content": "x" * (MAX_INLINE_BODY * 2)}]}
            body = json.dumps(big).encode()
            async with client(world, secret) as http:
                response = await http.post("/chat/completions", content=body)
            assert response.status_code == 200 and response.json()["size"] == len(body)
            (request,) = agents[0].requests
            assert request.body == b"" and request.upload_id


async def test_an_announcer_the_job_does_not_list_is_refused_before_dialling(tmp_path, caplog):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            _, secret = await world.add_key()
            proxy = await world.start_proxy()
            await world.wait_replicated()
            keys, _ = await two_agents(world, modes=("ok",))
            caplog.set_level(logging.INFO, "nodes.proxy_inference.upstream")
            stranger_key = KeyPair.generate()
            stranger = TinyAgent("stranger")
            stranger_swarm = await world.start_agent(stranger_key, [stranger.service()], "j-chat")
            await stranger_swarm.flush()  # announced on the job's topic
            await proxy.swarm.flush()  # a lookup of the job's topic has run and dialled
            assert stranger_key.public_key not in proxy.swarm.connections
            refused = [r.getMessage() for r in caplog.records if "agent_refused" in r.getMessage()]
            assert refused and stranger_key.hex[:12] in refused[0]
            pool = proxy.pool
            topic = job_topic("j-chat").hex()
            assert not pool.allows(stranger_key.public_key, f"topic:{topic}")
            assert pool.allows(keys[0].public_key, f"topic:{topic}")
            async with client(world, secret) as http:
                for _ in range(4):
                    assert (await http.post("/chat/completions", json=CHAT)).status_code == 200
            assert stranger.requests == []


async def test_a_revoked_key_is_refused_within_a_second_of_replicating(tmp_path):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            key_id, secret = await world.add_key()
            proxy = await world.start_proxy()
            await world.wait_replicated()
            await two_agents(world, modes=("ok",))
            async with client(world, secret) as http:
                assert (await http.post("/chat/completions", json=CHAT)).status_code == 200
                assert (await http.get("/models")).status_code == 200  # cached now
                await world.revoke(key_id)
                await world.wait_replicated()
                replicated_at = trio.current_time()
                while (await http.get("/models")).status_code != 401:
                    assert trio.current_time() - replicated_at < 1.0
                    await trio.sleep(0.01)
                response = await http.post("/chat/completions", json=CHAT)
                assert response.status_code == 401
                assert response.json()["error"]["type"] == "authentication_error"
            assert proxy.front.keys.refreshes >= 1


async def test_a_client_that_leaves_at_done_is_still_billed(tmp_path):
    """openai's client stops reading at ``data: [DONE]``; the usage frame comes after."""
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            key_id, secret = await world.add_key()
            proxy = await world.start_proxy()
            await world.wait_replicated()
            _, agents = await two_agents(world, modes=("ok",))
            agents[0].done_delay_s = 0.3
            async with client(world, secret) as http, http.stream(
                    "POST", "/chat/completions", json={**CHAT, "stream": True}) as response:
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        break
            # The connection is closed with the answer's last frame still to come.
            await wait_until(lambda: proxy.recorder.settled
                             and proxy.recorder.ops_written > 0, limit_s=10)
            rows = await proxy.recorder.db.usage(key_id)
            assert [(r.requests, r.total) for r in rows] == [(1, 5)]


async def send_head(stream: trio.SocketStream, secret: str, length: int,
                    path: str = "/v1/chat/completions") -> None:
    await stream.send_all(f"POST {path} HTTP/1.1\r\nHost: proxy\r\n"
                          f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {length}\r\n\r\n".encode())


async def read_answer(stream: trio.SocketStream) -> tuple[int, dict[str, str], dict]:
    """Status, headers and JSON body of one response (Content-Length framed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, "the proxy closed the connection without an answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    while len(body) < int(headers["content-length"]):
        body += await stream.receive_some(65536)
    return int(lines[0].split()[1]), headers, json.loads(body)


async def test_bodies_are_bounded_in_size_in_time_and_in_how_many_a_key_sends_at_once(tmp_path):
    """At the proxy: a body's size is refused from its declared
    length, one key cannot hold more bodies than its share while other keys go on, and
    a body trickled too slowly is dropped."""
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            _, secret = await world.add_key("team-a")
            _, other = await world.add_key("team-a")
            proxy = await world.start_proxy(http={"host": "127.0.0.1", "port": 0,
                                                  "key_bodies_reading": 1,
                                                  "body_timeout_s": 2.0})
            await world.wait_replicated()
            await two_agents(world, modes=("ok",))
            host, port = proxy.http_address
            # Declared beyond MAX_BODY: refused before a byte of it is read; the
            # connection is not kept for another request.
            async with await trio.open_tcp_stream(host, port) as stream:
                await send_head(stream, secret, MAX_BODY + 1)
                status, headers, body = await read_answer(stream)
                assert (status, body["error"]["code"]) == (413, "request_too_large")
                assert headers["connection"] == "close"
                assert await stream.receive_some(1) == b""
            async with await trio.open_tcp_stream(host, port) as slow, \
                    client(world, secret) as mine, client(world, other) as theirs:
                await send_head(slow, secret, 1000)
                await slow.send_all(b'{"model": "chat", ')
                await wait_until(lambda: proxy.front.bodies.reading == 1, limit_s=10)
                # The key's one body being read is taken; another key is served.
                response = await mine.post("/chat/completions", json=CHAT)
                assert response.status_code == 429
                assert response.json()["error"]["code"] == "too_many_bodies"
                assert (await theirs.post("/chat/completions", json=CHAT)).status_code == 200
                # The slow body ends with a 408 at body_timeout_s; its room comes back.
                status, _, body = await read_answer(slow)
                assert (status, body["error"]["code"]) == (408, "body_timeout")
                assert (await mine.post("/chat/completions", json=CHAT)).status_code == 200
            bodies = proxy.front.bodies  # given back once each answer has ended
            await wait_until(lambda: (bodies.held, bodies.reading) == (0, 0), limit_s=10)
            assert proxy.front.bodies.refused == {"request_too_large": 1,
                                                  "too_many_bodies": 1, "body_timeout": 1}


async def test_json_nested_100000_deep_is_a_400_with_a_code_and_no_traceback(tmp_path, caplog):
    """Regression, at the proxy: it was a RecursionError, a 500."""
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            _, secret = await world.add_key()
            await world.start_proxy()
            await world.wait_replicated()
            _, agents = await two_agents(world, modes=("ok",))
            caplog.set_level(logging.DEBUG)
            async with client(world, secret) as http:
                for body in (b"[" * 100_000 + b"]" * 100_000,
                             b'{"model": "chat", "messages": ' + b"[" * 100_000 + b"}"):
                    response = await http.post("/chat/completions", content=body)
                    assert response.status_code == 400
                    assert response.json()["error"]["code"] == "json_too_deep"
                assert (await http.post("/chat/completions", json=CHAT)).status_code == 200
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
            assert len(agents[0].requests) == 1


async def test_an_answer_without_usage_is_billed_as_counted_counted_and_logged(tmp_path, caplog):
    """A 200 without usage is never recorded as free in silence."""
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            key_id, secret = await world.add_key()
            proxy = await world.start_proxy()
            await world.wait_replicated()
            await two_agents(world, modes=("nousage",))
            caplog.set_level(logging.WARNING, "nodes.proxy_inference.app")
            async with client(world, secret) as http:
                response = await http.post("/chat/completions", json={**CHAT, "stream": True})
                assert response.status_code == 200
                assert (await http.post("/chat/completions", json=CHAT)).status_code == 200
            assert proxy.metrics.usage_missing.labels("chat")._value.get() == 2
            warned = [r.getMessage() for r in caplog.records
                      if r.getMessage().startswith("proxy.usage_missing")]
            assert len(warned) == 2 and f"key={key_id}" in warned[0]
            await wait_until(lambda: proxy.recorder.settled, limit_s=10)
            rows = await proxy.recorder.db.usage(key_id)
            assert [(r.requests, r.total) for r in rows] == [(2, 0)]


async def test_a_request_waits_for_a_replica_the_proxy_is_still_reaching(tmp_path):
    """A job Active before the proxy has reached its agent (what `jobs create --wait`
    then a chat meets, the agent behind a relay): the request waits for the
    connection and is answered; a listed agent that never comes is a 503 after
    replica_connect_wait_s, and no wait at all when nothing is being reached."""
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            _, secret = await world.add_key("team-a")
            await world.start_proxy(replica_connect_wait_s=2.0)
            await world.wait_replicated()
            late, never = KeyPair.generate(), KeyPair.generate()
            world.jobs.set([job_view("j-late", inference_spec("late"), [late.public_key]),
                            job_view("j-never", inference_spec("never"),
                                     [never.public_key])])
            pool = world.proxy.pool
            await wait_until(lambda: {late.public_key, never.public_key} <= set(
                pool._keepers), limit_s=10)
            answers = {}

            async def ask(model: str) -> None:
                async with client(world, secret) as http:
                    started = trio.current_time()
                    response = await http.post("/chat/completions",
                                               json={**CHAT, "model": model})
                    answers[model] = (response, trio.current_time() - started)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, "late")
                nursery.start_soon(ask, "never")
                await trio.sleep(0.5)
                assert late.public_key not in pool.clients and not answers
                await world.start_agent(late, [TinyAgent("late", "ok").service()], "j-late")
            response, _ = answers["late"]
            assert response.status_code == 200, response.text
            response, waited = answers["never"]
            assert response.status_code == 503 and waited >= 2.0
            assert response.json()["error"]["code"] == "model_unavailable"
