"""A job's Logs tab over a real app-node and wrk-monitor (in process): the page, and
its topic on the live stream: the records wrk-monitor holds, then live ones, each
numbered, each batch's last cursor as the event id, and a stream opened again
after that cursor: nothing missing, nothing twice; the workload's text escaped;
another team's job: nothing of it."""

from __future__ import annotations

import re

import trio

from contracts.monitor import APPLICATION, make_record
from tests.cli.support import serve_ork

from .support import browser_of, sign_in, stream, ui_over
from .test_job_pages import FORM

LIMIT_S = 60


def _append(served, job: str, *texts: str, source: str = "System") -> None:
    served.log_buffer.append([make_record(text, service="agent-inference", source=source,
                                          job_id=job, replica=0) for text in texts])


def _numbers(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-seq="(\d+)"', html)]


async def test_the_logs_tab_streams_numbered_lines_and_resumes_after_its_cursor(
        tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=True)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            job = (await browser.post("/jobs", FORM)).headers["location"].removeprefix("/jobs/")
            page = await browser.get(f"/jobs/{job}/logs")
            assert page.status_code == 200
            assert 'role="log"' in page.text and f"cosmicac jobs logs {job} -f" in page.text
            assert f"data-topics='[\"logs:{job}\"]'" in page.text
            assert 'aria-current="page">Logs<' in page.text
            _append(served, job, "pulling the image", "<script>alert(1)</script>")
            async with stream(browser, f"logs:{job}") as live:
                first = await live.event()
                assert first.topic == f"logs:{job}" and _numbers(first.html) == [1, 2]
                assert "&lt;script&gt;alert(1)&lt;/script&gt;" in first.html
                assert "<script>" not in first.html  # the workload's text is text
                assert first.id and first.id.endswith(":2")
                _append(served, job, "GET /v1/models 200", source=APPLICATION)
                second = await live.event()
                assert _numbers(second.html) == [3] and "log-application" in second.html
                cursor = second.id
            _append(served, job, "while away")
            async with stream(browser, f"logs:{job} {cursor}") as live:
                resumed = await live.event()
                assert _numbers(resumed.html) == [4]  # only what came after the cursor
                assert "while away" in resumed.html
            bad = await browser.get("/ui/stream", params={"topic": f"logs:{job} nonsense"})
            assert "could not be resumed" in bad.text and "event: done" in bad.text


async def test_a_logs_topic_of_a_job_gone_or_without_wrk_monitor_says_so_and_ends(
        tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            job = (await browser.post("/jobs", FORM)).headers["location"].removeprefix("/jobs/")
            for topic, says in ((f"logs:{job}", "wrk-monitor is not configured"),
                                ("logs:j-none", "does not exist, or it was deleted")):
                answer = await browser.get("/ui/stream", params={"topic": topic})
                assert answer.status_code == 200, answer.text
                assert says in answer.text and "event: done" in answer.text
            assert (await browser.get("/jobs/j-none/logs")).status_code == 404
