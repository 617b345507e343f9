"""Whole answers: a chat that is not a stream goes as ``infer_whole`` (one message each
way) to agents that have it, as ``infer`` to older ones; streams always as ``infer``."""

from __future__ import annotations

import pytest
import trio

from p2p.keys import KeyPair
from tests.p2p.helpers import wait_until

from .harness import CHAT, client, inference_spec, job_view, proxy_world
from .tiny_agent import TinyAgent

pytestmark = pytest.mark.slow


async def test_whole_answers_go_as_infer_whole_and_older_agents_get_infer(tmp_path):
    with trio.fail_after(60):
        async with proxy_world(tmp_path) as world:
            key_id, secret = await world.add_key()
            proxy = await world.start_proxy(replica_backoff_s=60.0)
            await world.wait_replicated()
            keys = [KeyPair.generate(), KeyPair.generate()]
            new, old = TinyAgent("new", whole=True), TinyAgent("old")
            for key, agent in zip(keys, (new, old), strict=True):
                await world.start_agent(key, [agent.service()], "j-chat")
            world.jobs.set([job_view("j-chat", inference_spec("chat"),
                                     [k.public_key for k in keys])])
            await wait_until(lambda: all(k.public_key in proxy.pool.clients for k in keys),
                             limit_s=20)
            async with client(world, secret) as http:
                for body in (CHAT, {**CHAT, "stream": False}, {**CHAT, "stream": None}):
                    for _ in range(2):  # once on each agent (they alternate)
                        response = await http.post("/chat/completions", json=body)
                        assert response.status_code == 200
                        assert response.json()["agent"] in ("new", "old")
                streamed = await http.post("/chat/completions", json={**CHAT, "stream": True})
                assert streamed.text.startswith("data: ")
                # A refusal on the whole path is retried on the other agent, as on infer
                # (of two requests one is new's turn; then new is in back-off).
                new.mode = "unavailable"
                for _ in range(2):
                    response = await http.post("/chat/completions", json=CHAT)
                    assert response.status_code == 200 and response.json()["agent"] == "old"
            assert proxy.metrics.retries.labels("chat")._value.get() == 1
            # Three of the six whole-shaped requests (they alternate), and the refused one.
            assert len(new.whole_requests) == 4
            assert len(new.requests) in (4, 5)  # _infer_whole runs _infer; the stream maybe
            assert not old.whole_requests and len(old.requests) in (5, 6)
            assert keys[1].public_key in proxy.pool._stream_only  # asked once, remembered
            await wait_until(lambda: proxy.recorder.settled, limit_s=10)
            rows = await proxy.recorder.db.usage(key_id)
            assert [r.requests for r in rows] == [9]
