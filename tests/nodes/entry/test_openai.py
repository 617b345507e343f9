"""The official ``openai`` package through the entry point: base URL ``<entry>/inference/v1``.

The upstream is our own local model server (``agents.inference.server`` with
the deterministic ``demo`` engine), standing where proxy-inference stands:
what the entry point passes on must be exactly what the server said.
"""

from __future__ import annotations

import functools
from contextlib import asynccontextmanager

import pytest
import trio

from agents.inference.engines import load_engine
from agents.inference.server import serve_model
from nodes.entry import EntrySettings, serve_entry
from tests.ports import free_port

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Say something about trio."}]


@asynccontextmanager
async def model_behind_entry():
    """(client through the entry point, client straight to the model server)."""
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(
                functools.partial(serve_model, load_engine("demo"), served_name="demo")
            )
            entry = await nursery.start(
                serve_entry,
                EntrySettings(
                    port=0,
                    inference_url=f"http://{host}:{port}",
                    api_url=f"http://127.0.0.1:{free_port()}",
                ),
            )
            through = openai.OpenAI(
                base_url=f"{entry.url}/inference/v1", api_key="sk-test", max_retries=0, timeout=30
            )
            direct = openai.OpenAI(
                base_url=f"http://{host}:{port}/v1", api_key="sk-test", max_retries=0, timeout=30
            )
            try:
                yield through, direct
            finally:
                through.close()
                direct.close()
                nursery.cancel_scope.cancel()


async def test_chat_and_streamed_chat_through_the_entry_point_match_the_model_server():
    run = trio.to_thread.run_sync
    async with model_behind_entry() as (through, direct):

        def chat(client):
            return client.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=16)

        def streamed(client):
            return list(
                client.chat.completions.create(
                    model="demo",
                    messages=MESSAGES,
                    max_tokens=16,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )

        answer, expected = await run(chat, through), await run(chat, direct)
        assert answer.choices[0].message.content == expected.choices[0].message.content
        assert answer.usage == expected.usage and answer.usage.completion_tokens > 0

        chunks = await run(streamed, through)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == answer.choices[0].message.content
        assert len([c for c in chunks if c.choices]) > 1  # streamed, not one block
        usage = [c.usage for c in chunks if c.usage is not None]
        assert usage == [answer.usage]

        assert [m.id for m in (await run(through.models.list)).data] == ["demo"]
        completion = await run(
            lambda: through.completions.create(
                model="demo", prompt="Once upon a time", max_tokens=8
            )
        )
        assert completion.choices[0].text
        embedding = await run(lambda: through.embeddings.create(model="demo", input="hi"))
        assert embedding.data[0].embedding


async def test_the_model_servers_errors_reach_the_openai_client_unchanged():
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)

    async with model_behind_entry() as (through, _):
        with pytest.raises(openai.NotFoundError):
            await trio.to_thread.run_sync(
                lambda: through.chat.completions.create(model="no-such-model", messages=MESSAGES)
            )


async def test_an_inference_upstream_that_is_down_is_a_502_the_client_can_read():
    import openai  # here, not at the top: every xdist worker collects this module (0.5 s)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            entry = await nursery.start(
                serve_entry, EntrySettings(port=0, inference_url=f"http://127.0.0.1:{free_port()}")
            )
            client = openai.OpenAI(
                base_url=f"{entry.url}/inference/v1", api_key="sk-test", max_retries=0, timeout=10
            )
            with pytest.raises(openai.InternalServerError) as failed:
                await trio.to_thread.run_sync(
                    lambda: client.chat.completions.create(model="demo", messages=MESSAGES)
                )
            client.close()
            nursery.cancel_scope.cancel()
    assert failed.value.status_code == 502
    assert failed.value.code == "UPSTREAM_UNREACHABLE"
    assert "proxy-inference" in failed.value.message
