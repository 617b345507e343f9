"""The job pages over a real app-node and wrk-ork: the form (and Duplicate), a job's
page, its actions and its live overview."""

from __future__ import annotations

import re

import trio

from tests.cli.support import serve_ork
from tests.p2p.helpers import wait_until

from .support import TLS, browser_of, sign_in, stream, ui_over

LIMIT_S = 60
IMAGE = "docker://registry.local/agent:1"
FORM = {"type": "inference", "name": "chat", "runtime": "local", "model": "demo",
        "served_name": "", "image": IMAGE, "gpus": "1", "replicas": "2", "location": ""}


async def test_the_form_creates_a_job_and_opens_its_page(tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            form = await browser.get("/jobs/new")
            assert form.status_code == 200 and "<h1>New job</h1>" in form.text
            assert 'name="type" value="inference" checked' in form.text
            created = await browser.post("/jobs", FORM)
            assert created.status_code == 303, created.text
            job = created.headers["location"].removeprefix("/jobs/")
            assert served.job_ids() == {job}
            page = await browser.get(f"/jobs/{job}")
            assert page.status_code == 200
            assert "<h1>chat</h1>" in page.text
            assert f"data-topics='[\"job:{job}\"]'" in page.text
            assert page.text.count('<tr id="replica-') == 2
            # Replica actions only while a replica is queued, pending or starting.
            assert f'action="/jobs/{job}/replicas/0/restart"' in page.text
            served.drive(job, "active")
            page = await browser.get(f"/jobs/{job}")
            assert f'action="/jobs/{job}/replicas/0/restart"' not in page.text
            assert ">Active<" in page.text
            assert "/inference/v1" in page.text and "chat/completions" in page.text


async def test_a_bad_form_creates_nothing_marks_its_fields_and_keeps_the_values(
        tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            for fields, field in (({"gpus": "two"}, "gpus"), ({"name": ""}, "name"),
                                  ({"gpus": "999"}, "gpus"),
                                  ({"server_args": "--port 9"}, "server_args"),
                                  ({"server_args": "--x 'open"}, "server_args"),
                                  ({"server_env": "HF_ENDPOINT=https://x"}, "server_env"),
                                  ({"server_env": "NOEQUALS"}, "server_env")):
                answer = await browser.post("/jobs", {**FORM, **fields})
                assert answer.status_code in (409, 422), answer.text
                assert re.search(rf'id="f-{field}"[^>]*aria-invalid="true"', answer.text,
                                 re.S), field
                assert f'aria-describedby="f-{field}-hint f-{field}-error"' in answer.text \
                    or f'aria-describedby="f-{field}-error"' in answer.text
                assert 'role="alert"' in answer.text
                assert f'value="{IMAGE}"' in answer.text  # what was typed stays
            assert served.job_ids() == set()


async def test_duplicate_carries_every_field_and_a_new_name(tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            job = (await browser.post("/jobs", {
                **FORM, "served_name": "chatty", "location": "default",
                "server_args": "--max-model-len 64 --note 'two words'",
                "server_env": "OMP_NUM_THREADS=2 GREETING='hello there'"})
                   ).headers["location"].removeprefix("/jobs/")
            form = (await browser.get(f"/jobs/new?from={job}")).text
            assert "<h1>Duplicate chat</h1>" in form
            for name, value in (("name", "chat-copy"), ("model", "demo"),
                                ("served_name", "chatty"), ("image", IMAGE), ("gpus", "1"),
                                ("replicas", "2"), ("location", "default"),
                                ("server_args", "--max-model-len 64 --note &#39;two words&#39;"),
                                ("server_env",
                                 "OMP_NUM_THREADS=2 &#39;GREETING=hello there&#39;")):
                assert re.search(rf'id="f-{name}" name="{name}"[^>]*value="{value}"', form) \
                    or re.search(rf'name="{name}" value="{value}"', form), name
            assert '<option value="local" selected>' in form


async def test_restart_refused_shows_the_apis_message_and_delete_leaves_a_page_that_says_so(
        tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            job = (await browser.post("/jobs", FORM)).headers["location"].removeprefix("/jobs/")
            deleted = await browser.post(f"/jobs/{job}/delete")
            assert deleted.status_code == 303 and deleted.headers["location"] == "/jobs"
            refused = await browser.post(f"/jobs/{job}/restart")  # while it is deleted
            assert refused.status_code == 409, refused.text
            alert = refused.text.split('role="alert"')[1].split("</div>")[0]
            assert "<p>" in alert and "{" not in alert  # the API's message, never raw JSON
            served.drive(job, "deleted")
            for _ in range(500):  # until app-node has the worker's word (bounded: 10 s)
                gone = await browser.get(f"/jobs/{job}")
                if gone.status_code == 404:
                    break
                await trio.sleep(0.02)
            assert gone.status_code == 404 and "does not exist, or it was deleted" in gone.text


async def test_a_jobs_stream_sends_its_overview_then_each_change(tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            job = (await browser.post("/jobs", FORM)).headers["location"].removeprefix("/jobs/")
            async with stream(browser, f"job:{job}") as next_fragment:
                first = await next_fragment()
                assert first.startswith('<section id="job-overview"')
                assert 'hx-swap-oob="true"' in first
                served.drive(job, "active")
                while ">Active<" not in (change := await next_fragment()):
                    pass
                assert "/inference/v1" in change
                await browser.post(f"/jobs/{job}/delete")
                served.drive(job, "deleted")
                while "This job was deleted." not in (change := await next_fragment()):
                    pass


async def test_the_list_pages_its_jobs_and_each_page_streams_its_own(tmp_path, nursery):
    import httpx

    from tests.cli.support import EMAIL, PASSWORD

    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with httpx.AsyncClient(base_url=f"{served.server}/api", timeout=30,
                                     verify=TLS) as api:
            token = (await api.post("/auth/login", json={"email": EMAIL,
                                                         "password": PASSWORD})).json()["token"]
            for n in range(51):
                made = await api.post("/jobs", headers={"authorization": f"Bearer {token}"},
                                      json={"name": f"job-{n:02}", "type": "inference",
                                            "runtime": "local", "model": "demo",
                                            "served_name": f"demo-{n:02}", "image": IMAGE,
                                            "gpus": 1})
                assert made.status_code == 201, made.text
        async with browser_of(ui) as browser:
            await sign_in(browser)
            first = (await browser.get("/jobs")).text
            assert first.count('<tr id="job-') == 50
            older = re.search(r'<a href="(/jobs\?cursor=[^"]+)">Older jobs</a>', first)[1]
            second = (await browser.get(older.replace("&amp;", "&"))).text
            assert second.count('<tr id="job-') == 1 and ">job-00<" in second
            assert '<a href="/jobs">Newest jobs</a>' in second
            assert "data-topics='[\"jobs:" in second


async def test_the_list_and_the_job_page_say_when_its_agents_were_last_heard_from(
        tmp_path, nursery):
    from contracts.monitor import AgentMetrics, AgentMetricsReport

    served = await serve_ork(tmp_path, nursery, monitor=True)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            job = (await browser.post("/jobs", FORM)).headers["location"].removeprefix("/jobs/")
            assert "<dt>Agents last heard</dt><dd>-</dd>" in (await browser.get(
                f"/jobs/{job}")).text
            service = served.monitor_service
            service.agent_metrics.accept(b"\x06" * 32, AgentMetricsReport(agents=(
                AgentMetrics(job_id=job, replica=0, node_rank=0, service="agent-inference",
                             values={"heard_age_seconds": 125.0}),)), service.clock())
            monitor = served.node.services.monitor
            await wait_until(lambda: monitor.connected)
            page = (await browser.get(f"/jobs/{job}")).text
            assert "<dt>Agents last heard</dt><dd>2m ago</dd>" in page
            assert "<td>2m ago</td>" in (await browser.get("/jobs")).text
