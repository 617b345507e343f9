"""serve_model on a real 127.0.0.1 socket: it reports its address, and a busy port is one error."""

from __future__ import annotations

import httpx
import pytest
import trio

from agents.inference.engines._demo import DemoEngine
from agents.inference.server import ModelServerBindError, serve_model


async def test_serves_health_and_refuses_a_busy_port(nursery: trio.Nursery) -> None:
    engine = DemoEngine()
    host, port = await nursery.start(
        lambda task_status: serve_model(engine, served_name="x", task_status=task_status)
    )
    assert host == "127.0.0.1" and port > 0
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=10) as client:
        health = await client.get("/health")
        assert (health.status_code, health.content) == (200, b"")
        models = (await client.get("/v1/models")).json()
        assert [card["id"] for card in models["data"]] == ["x"]
    with trio.fail_after(10), pytest.raises(ModelServerBindError) as caught:
        await serve_model(engine, port=port)
    assert f"127.0.0.1:{port}" in str(caught.value)
    nursery.cancel_scope.cancel()


async def test_a_port_out_of_range_is_a_bind_error() -> None:
    with pytest.raises(ModelServerBindError, match=r"0\.\.65535"):
        await serve_model(DemoEngine(), port=70000)
