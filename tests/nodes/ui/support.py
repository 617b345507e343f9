"""The web UI served here over a real app-node (tests/cli/support.py's ``serve``), and a
browser-like client of it: forms posted as a browser posts them (``Sec-Fetch-Site``),
redirects not followed, cookies kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import trio

from nodes.kit.tls import client_tls
from nodes.ui.daemon import RunningUi, serve_ui
from nodes.ui.settings import UiSettings
from runtime.sse import SseReader
from tests.cli.support import EMAIL, PASSWORD, Served

__all__ = ["TLS", "Browser", "LiveReader", "browser_of", "sign_in", "stream", "ui_over"]

#: What a browser sends with a form posted from one of the UI's own pages.
SAME_ORIGIN = {"sec-fetch-site": "same-origin"}

#: One TLS context for every client these tests make (``verify=TLS``), the daemons'
#: own: httpx builds one per client otherwise, reading and parsing certifi's bundle
#: (20-70 ms of CPU each), though every client here speaks plain HTTP to 127.0.0.1.
TLS = client_tls()


async def ui_over(nursery: trio.Nursery, served: Served, **settings) -> RunningUi:
    """The UI on 127.0.0.1 (port 0) over ``served``'s app-node."""
    ui_settings = UiSettings(host="127.0.0.1", port=0, api_url=served.server, **settings)
    with trio.fail_after(30):
        return await nursery.start(serve_ui, ui_settings)


@dataclass
class Browser:
    """A client with its own cookies, as one browser profile."""

    http: httpx.AsyncClient

    async def get(self, path: str, **options) -> httpx.Response:
        return await self.http.get(path, **options)

    async def post(self, path: str, data: dict[str, str] | None = None, *,
                   headers: dict[str, str] | None = None) -> httpx.Response:
        """A form posted from one of the UI's pages (``headers`` replace the browser's)."""
        return await self.http.post(path, data=data or {},
                                    headers=SAME_ORIGIN if headers is None else headers)


@asynccontextmanager
async def browser_of(ui: RunningUi) -> AsyncIterator[Browser]:
    async with httpx.AsyncClient(base_url=ui.url, follow_redirects=False, timeout=30,
                                 trust_env=False, verify=TLS) as http:
        yield Browser(http)


async def sign_in(browser: Browser, email: str = EMAIL, password: str = PASSWORD) -> None:
    answer = await browser.post("/login", {"email": email, "password": password, "next": ""})
    assert answer.status_code == 303, answer.text


@dataclass
class LiveEvent:
    """One event of the live stream: its name (``message`` for a fragment), topic,
    HTML and the stream's last ``id``."""

    event: str
    topic: str
    html: str
    id: str | None


class LiveReader:
    """The events of one live stream (``/ui/stream``), in order."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines, self._reader = lines, SseReader()

    async def event(self) -> LiveEvent:
        async for line in self._lines:
            got = self._reader.line(line)
            if got is not None and got[0]:
                event, data = got
                topic, _, html = data.partition("\n")
                return LiveEvent(event, topic, html, self._reader.last_id)
        raise AssertionError("the stream ended")

    async def __call__(self) -> str:
        """The next fragment's HTML (skipping ``done``)."""
        while True:
            got = await self.event()
            if got.event == "message":
                return got.html


@asynccontextmanager
async def stream(browser: Browser, *topics: str) -> AsyncIterator[LiveReader]:
    """The browser's live stream of ``topics`` (``jobs``, ``job:ID``...)."""
    params = [("topic", topic) for topic in topics]
    async with browser.http.stream("GET", "/ui/stream", params=params, timeout=30) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield LiveReader(response.aiter_lines())
