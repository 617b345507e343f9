"""Shared by the API tests: the API on a real socket with a server-sent events
reader, job bodies, and the routes open without a token."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import trio

from nodes.app_node.api import create_app
from p2p.http import serve_asgi

from .apis import CHEAP, IMAGE, Api, bearer

BOX = {"name": "box", "type": "container", "image": IMAGE, "gpus": 1}


@asynccontextmanager
async def served(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    """The API on a real socket, on the lean server as the daemon serves it; a client of it."""
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(
            lambda task_status: serve_asgi(
                create_app(api.services, password_params=CHEAP),
                host="127.0.0.1",
                port=0,
                bind_error=lambda h, p, exc: exc,
                lean=True,
                task_status=task_status,
            )
        )
        # verify=False: plain HTTP, so no CA bundle to load (~20 ms of CPU per client).
        async with httpx.AsyncClient(
            base_url=f"http://{host}:{port}/api", timeout=httpx.Timeout(10.0), verify=False
        ) as client:
            yield client
        nursery.cancel_scope.cancel()


class Events:
    """An SSE reader: ``await next()`` is ``(event, data)``; comments are counted;
    ``last_id`` is the last ``id:`` seen."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.aiter_lines()
        self.comments = 0
        self.last_id: str | None = None

    async def next(self) -> tuple[str, dict]:
        event, data = "message", ""
        with trio.fail_after(10):
            async for line in self.lines:
                if line.startswith(":"):
                    self.comments += 1
                elif line.startswith("event:"):
                    event = line.partition(":")[2].strip()
                elif line.startswith("data:"):
                    data += line.partition(":")[2].strip()
                elif line.startswith("id:"):
                    self.last_id = line.partition(":")[2].strip()
                elif not line and data:
                    return event, json.loads(data)
        raise AssertionError("the stream ended")

    async def ended(self) -> bool:
        with trio.fail_after(10):
            async for line in self.lines:
                assert not line or line.startswith(":"), line
        return True


@asynccontextmanager
async def events(
    client: httpx.AsyncClient, path: str, token: str, headers: dict[str, str] | None = None
) -> AsyncIterator[Events]:
    async with client.stream("GET", path, headers={**bearer(token), **(headers or {})}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Events(response)


async def _create(api: Api, token: str) -> dict:
    r = await api.client.post("/api/jobs", headers=bearer(token), json=BOX)
    assert r.status_code == 201, r.text
    return r.json()


def _inference(**extra) -> dict:
    return {
        "name": "llm",
        "type": "inference",
        "image": IMAGE,
        "gpus": 1,
        "replicas": 2,
        "runtime": "vllm",
        "model": "demo",
        **extra,
    }


#: The routes anyone may call: the account's way in.
OPEN = {
    ("POST", "/auth/signup"),
    ("POST", "/auth/login"),
    ("POST", "/invitations/accept"),
    ("POST", "/auth/password-reset"),
    ("POST", "/auth/password-reset/confirm"),
}
