"""The UI's pages over a real app-node, as a browser meets them (no browser here:
route-level; tests/ui drives Chromium)."""

from __future__ import annotations

import re

import httpx
import trio

from nodes.ui.sessions import COOKIE
from tests.cli.support import EMAIL, PASSWORD, serve, serve_ork

from .support import TLS, browser_of, sign_in, ui_over

LIMIT_S = 60


async def test_a_page_asks_to_sign_in_first_and_comes_back_after(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            first = await browser.get("/jobs")
            assert first.status_code == 303
            assert first.headers["location"] == "/login?next=/jobs"
            page = await browser.get("/login?next=/jobs")
            assert page.status_code == 200
            assert '<input type="hidden" name="next" value="/jobs">' in page.text
            assert page.text.count("<h1>") == 1 and 'href="#main"' in page.text
            answer = await browser.post("/login", {"email": EMAIL, "password": PASSWORD,
                                                   "next": "/jobs"})
            assert answer.status_code == 303 and answer.headers["location"] == "/jobs"
            cookie = answer.headers["set-cookie"]
            assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie
            assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
            assert "Secure" not in cookie  # plain HTTP on loopback
            jobs = await browser.get("/jobs")
            assert jobs.status_code == 200, jobs.text
            assert "<h1>Jobs</h1>" in jobs.text and "No jobs yet." in jobs.text
            assert EMAIL in jobs.text and "cosmicac jobs list" in jobs.text


async def test_a_wrong_password_marks_the_form_keeps_the_email_and_sets_no_cookie(
        tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            answer = await browser.post("/login", {"email": EMAIL, "password": "nope"})
            assert answer.status_code == 401
            assert "set-cookie" not in answer.headers
            assert 'role="alert"' in answer.text and "email or password is wrong" in answer.text
            assert f'value="{EMAIL}"' in answer.text
            assert 'type="password" value=""' in answer.text  # never echoed


async def test_over_https_the_cookie_is_secure(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            answer = await browser.post(
                "/login", {"email": EMAIL, "password": PASSWORD},
                headers={"sec-fetch-site": "same-origin", "x-forwarded-proto": "https"})
            assert "Secure" in answer.headers["set-cookie"]


async def test_a_cross_site_or_originless_post_is_refused_with_a_readable_page(
        tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            for headers in ({"sec-fetch-site": "cross-site"}, {"origin": "https://evil.example"},
                            {}):
                answer = await browser.post("/logout", headers=headers)
                assert answer.status_code == 403, headers
                assert "text/html" in answer.headers["content-type"]
                assert 'role="alert"' in answer.text and "refused" in answer.text
            # Still signed in: nothing was done.
            assert (await browser.get("/jobs")).status_code == 200
            # The browser's own form from the entry point's address passes.
            same = await browser.post("/logout", headers={
                "origin": "http://127.0.0.1:5173", "x-forwarded-host": "127.0.0.1:5173"})
            assert same.status_code == 303


async def test_every_answer_carries_the_security_headers(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            for answer in (await browser.get("/login"), await browser.get("/jobs"),
                           await browser.get("/static/app.css"),
                           await browser.post("/logout", headers={}),
                           await browser.get("/no-such-page")):
                policy = answer.headers["content-security-policy"]
                assert "script-src 'self'" in policy, answer.url
                assert answer.headers["x-frame-options"] == "DENY"


async def test_sign_out_ends_the_session_here_and_the_token_at_app_node(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            [session] = ui.app.sessions._sessions.values()
            answer = await browser.post("/logout")
            assert answer.status_code == 303 and answer.headers["location"] == "/login"
            assert len(ui.app.sessions) == 0
            assert (await browser.get("/jobs")).status_code == 303
            async with httpx.AsyncClient(base_url=f"{served.server}/api", verify=TLS) as api:
                me = await api.get("/me", headers={"authorization": f"Bearer {session.token}"})
            assert me.status_code == 401


async def test_a_forged_or_stolen_looking_cookie_is_no_session(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            real = browser.http.cookies[COOKIE]
        async with browser_of(ui) as stranger:
            for forged in (real[:-1] + ("A" if real[-1] != "A" else "B"), "x" * 43, "",
                           "' OR 1=1 --"):
                stranger.http.cookies.set(COOKIE, forged)
                answer = await stranger.get("/jobs")
                assert answer.status_code == 303, forged
                assert answer.headers["location"].startswith("/login")


async def test_sign_in_never_sends_the_browser_to_another_site(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            for target in ("//evil.example/x", "https://evil.example", "/\\evil.example",
                           "javascript:alert(1)", "jobs"):
                browser.http.cookies.clear()
                answer = await browser.post("/login", {"email": EMAIL, "password": PASSWORD,
                                                       "next": target})
                assert answer.headers["location"] == "/jobs", target


async def test_sign_up_is_closed_once_a_user_exists(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            answer = await browser.post("/signup", {
                "email": "eve@example.com", "name": "Eve", "team_name": "evil",
                "password": "a long enough password"})
            assert answer.status_code == 409 and "set-cookie" not in answer.headers
            assert "already has its admin" in answer.text


async def test_a_jobs_untrusted_name_is_text_and_statuses_are_the_seeds_names(
        tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    hostile = "<script>alert(1)</script>"
    with trio.fail_after(LIMIT_S):
        await served.login()
        created = await served.cli("jobs", "create", "--name", hostile, "--type",
                                   "inference", "--runtime", "local", "--model", "demo",
                                   "--image", "docker://registry.local/agent:1",
                                   "--gpus", "2", "--replicas", "2")
        assert created.returncode == 0, created.stderr
        async with browser_of(ui) as browser:
            await sign_in(browser)
            page = (await browser.get("/jobs")).text
    assert hostile not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    row = re.search(r'<tr id="job-[^"]+">.*?</tr>', page, re.S)
    assert row is not None
    cells = re.findall(r"<td>(.*?)</td>", row[0], re.S)
    # type, model health (no wrk-monitor here: unknown), GPUs (2 per replica), replicas
    assert cells[0] == "Managed inference" and cells[2:5] == ["Unknown", "4", "2"]
    assert re.search(r'class="status status-\w+"[^>]*>(Queued|Pending|Starting|Creating)<',
                     row[0]), row[0]


async def test_a_throttled_sign_in_says_when_to_try_again_never_raw_json(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            for _ in range(30):  # bounded: app-node's login throttle answers 429 soon
                answer = await browser.post("/login", {"email": EMAIL, "password": "wrong"})
                if answer.status_code == 429:
                    break
            assert answer.status_code == 429, answer.text
            alert = answer.text.split('role="alert"')[1].split("</div>")[0]
            assert re.search(r"try again in \d+ s", alert), alert
            assert "{" not in alert


async def test_app_node_limits_each_browser_behind_the_ui_not_the_ui_as_one_client(
        tmp_path, nursery):
    """The UI passes on the browser's address (as the door gave it) to app-node, which
    trusts the UI: one browser over its rate leaves another unharmed."""
    from nodes.app_node.ratelimit import Limits, Rate

    served = await serve(tmp_path, nursery, limits=Limits(
        per_ip=Rate(per_second=0.001, burst=4), trusted_proxies=("127.0.0.1",)))
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as greedy, browser_of(ui) as other:
            greedy_at = {"sec-fetch-site": "same-origin", "x-forwarded-for": "203.0.113.1"}
            other_at = {"sec-fetch-site": "same-origin", "x-forwarded-for": "203.0.113.2"}
            for _ in range(8):  # over its 4 (bounded)
                last = await greedy.post("/login", {"email": EMAIL, "password": "x"},
                                         headers=greedy_at)
            assert last.status_code == 429, last.text
            answer = await other.post("/login", {"email": EMAIL, "password": PASSWORD},
                                      headers=other_at)
            assert answer.status_code == 303, answer.text
