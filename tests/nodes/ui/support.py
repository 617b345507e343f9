"""The web UI served here over a real app-node (tests/cli/support.py's ``serve``), and a
browser-like client of it: forms posted as a browser posts them (``Sec-Fetch-Site``),
redirects not followed, cookies kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import trio

from nodes.ui.daemon import RunningUi, serve_ui
from nodes.ui.settings import UiSettings
from tests.cli.support import EMAIL, PASSWORD, Served

__all__ = ["Browser", "browser_of", "sign_in", "ui_over"]

#: What a browser sends with a form posted from one of the UI's own pages.
SAME_ORIGIN = {"sec-fetch-site": "same-origin"}


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
                                 trust_env=False) as http:
        yield Browser(http)


async def sign_in(browser: Browser, email: str = EMAIL, password: str = PASSWORD) -> None:
    answer = await browser.post("/login", {"email": email, "password": password, "next": ""})
    assert answer.status_code == 303, answer.text
