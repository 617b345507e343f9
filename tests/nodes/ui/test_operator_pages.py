"""The operators' pages over a real app-node and wrk-ork: racks and nodes (reserve,
release), users and health; nobody else sees them or gets them."""

from __future__ import annotations

import re

import httpx
import trio

from tests.cli.support import EMAIL, emailed_token, serve_ork

from .support import TLS, browser_of, sign_in, ui_over

LIMIT_S = 60


async def test_an_operator_reserves_and_releases_a_node_and_sees_users_and_health(
        tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            jobs = (await browser.get("/jobs")).text
            for link in ('href="/racks"', 'href="/users"', 'href="/health"'):
                assert link in jobs, link
            racks = (await browser.get("/racks")).text
            assert "<h1>Racks and nodes</h1>" in racks
            rack = re.search(r'name="rack" value="([0-9a-f]{64})"', racks)[1]
            node = re.search(r'name="node" value="([^"]+)"', racks)[1]
            team = re.search(r'<option value="([^"]+)">core</option>', racks)[1]
            reserved = await browser.post("/nodes/reserve", {"rack": rack, "node": node,
                                                             "team": team})
            assert reserved.status_code == 303, reserved.text
            racks = (await browser.get("/racks")).text
            row = re.search(rf'<th scope="row">{re.escape(node)}</th>.*?</tr>', racks, re.S)[0]
            assert "<td>core</td>" in row and "Release" in row
            released = await browser.post("/nodes/release", {"rack": rack, "node": node})
            assert released.status_code == 303
            assert EMAIL in (await browser.get("/users")).text
            health = await browser.get("/health")
            assert health.status_code in (200, 503), health.text
            assert "<h1>" in health.text


async def test_a_member_sees_no_operator_page_and_gets_a_readable_refusal(tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    outbox = tmp_path / "app-node" / "outbox"
    with trio.fail_after(LIMIT_S):
        await served.login()
        assert (await served.cli("teams", "invite", "core", "m@example.com")).returncode == 0
        async with httpx.AsyncClient(base_url=f"{served.server}/api", verify=TLS) as api:
            accepted = await api.post("/invitations/accept", json={
                "token": emailed_token(outbox, "m@example.com"), "email": "m@example.com",
                "name": "M", "password": "a member's long password"})
        assert accepted.status_code == 200, accepted.text
        async with browser_of(ui) as member:
            await sign_in(member, "m@example.com", "a member's long password")
            jobs = (await member.get("/jobs")).text
            assert 'href="/racks"' not in jobs and 'href="/users"' not in jobs
            for path in ("/racks", "/users", "/health"):
                refused = await member.get(path)
                assert refused.status_code == 403, path
                assert "platform operators" in refused.text and 'role="alert"' in refused.text
            forged = await member.post("/nodes/reserve", {"rack": "ab" * 32, "node": "n0",
                                                          "team": "x"})
            assert forged.status_code == 403 and "platform operators" in forged.text
            live = await member.get("/ui/stream", params={"topic": "racks"})
            assert live.status_code == 403 and "GPUs" not in live.text


async def test_the_racks_page_is_live_as_jobs_claim_gpus(
        tmp_path, nursery):
    from .support import stream
    from .test_job_pages import FORM

    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            assert "data-topics='[\"racks\"]'" in (await browser.get("/racks")).text
            async with stream(browser, "racks") as live:
                first = await live()
                assert first.startswith('<div id="racks-body" hx-swap-oob="true">')
                assert "16 of 16 GPUs free" in first
                created = await browser.post("/jobs", {**FORM, "replicas": "1"})
                assert created.status_code == 303, created.text
                assert "15 of 16 GPUs free" in await live()
