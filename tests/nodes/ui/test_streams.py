"""The pages' live streams over a real app-node and wrk-ork (the worker played by the
test): a snapshot first, then each change as a fragment, for the user's team only."""

from __future__ import annotations

import re
from contextlib import asynccontextmanager

import trio

from runtime.sse import SseReader
from tests.cli.support import serve_ork
from tests.p2p.helpers import wait_until

from .support import Browser, browser_of, sign_in, ui_over

LIMIT_S = 60


@asynccontextmanager
async def stream(browser: Browser, path: str):
    """The fragments of one page's stream, one ``data`` per call of the returned reader."""
    async with browser.http.stream("GET", path, timeout=30) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        reader, lines = SseReader(), response.aiter_lines()

        async def next_fragment() -> str:
            async for line in lines:
                got = reader.line(line)
                if got is not None and got[0]:
                    return got[1]
            raise AssertionError("the stream ended")

        yield next_fragment


async def test_the_jobs_stream_starts_with_the_list_then_adds_changes_and_removes(
        tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        await served.login()
        async with browser_of(ui) as browser:
            await sign_in(browser)
            async with stream(browser, "/ui/stream/jobs") as next_fragment:
                snapshot = await next_fragment()
                assert snapshot.startswith('<tbody id="jobs-body" hx-swap-oob="true">')
                assert "No jobs yet." in snapshot
                created = await served.cli("jobs", "create", "--name", "<b>chat</b>",
                                           "--type", "inference", "--runtime", "local",
                                           "--model", "demo", "--image",
                                           "docker://registry.local/agent:1", "--gpus", "1")
                assert created.returncode == 0, created.stderr
                job = created.stdout.decode().strip()
                added = await next_fragment()
                assert 'hx-swap-oob="afterbegin:#jobs-body"' in added  # newest first
                assert f'<tr id="job-{job}">' in added
                assert "&lt;b&gt;chat&lt;/b&gt;" in added and "<b>chat" not in added
                assert '<tr id="jobs-empty" hx-swap-oob="delete">' in added
                served.drive(job, "active")
                seen = []
                while "Active" not in seen:  # bounded by fail_after
                    change = await next_fragment()
                    found = re.fullmatch(
                        rf'<span class="status status-\w+" id="job-{job}-status" '
                        r'hx-swap-oob="true">(\w+)</span>', change.strip())
                    assert found, change
                    seen.append(found[1])
                deleted = await served.cli("jobs", "delete", job)
                assert deleted.returncode == 0, deleted.stderr
                served.drive(job, "deleted")
                while True:
                    change = await next_fragment()
                    if "delete" in change:
                        break
                assert change.strip() == f'<tr id="job-{job}" hx-swap-oob="delete"></tr>'


async def test_a_stream_without_a_session_is_refused(tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            answer = await browser.get("/ui/stream/jobs")
            assert answer.status_code == 401


async def test_with_app_node_down_a_stream_is_an_error_so_the_page_backs_off(nursery):
    """Not a stream that ends at once (htmx would reconnect every half second and the
    page would never say it is reconnecting)."""
    import socket

    from nodes.ui.daemon import serve_ui
    from nodes.ui.sessions import COOKIE
    from nodes.ui.settings import UiSettings

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with trio.fail_after(LIMIT_S):
        ui = await nursery.start(serve_ui, UiSettings(host="127.0.0.1", port=0,
                                                      api_url=dead))
        session = ui.app.sessions.open("token", "a@example.com", 10**10, ui.app.clock())
        async with browser_of(ui) as browser:
            browser.http.cookies.set(COOKIE, session.id)
            for path in ("/ui/stream/jobs", "/ui/stream/jobs/j-1"):
                answer = await browser.get(path)
                assert answer.status_code == 502, (path, answer.text)
                assert "app-node" in answer.text


async def test_live_pages_beyond_max_streams_are_refused_until_one_closes(tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served, max_streams=2)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            async with stream(browser, "/ui/stream/jobs") as first, \
                    stream(browser, "/ui/stream/jobs") as second:
                await first()
                await second()
                refused = await browser.get("/ui/stream/jobs")
                assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
                assert (await browser.get("/jobs")).status_code == 200  # pages still load
            await wait_until(lambda: ui.app.streams_open == 0)  # the closed ones counted out
            async with stream(browser, "/ui/stream/jobs") as third:
                assert (await third()).startswith('<tbody id="jobs-body"')
