"""Nothing of a team reaches a user of another team through the UI: not by page,
fragment, stream or guessed URL. (app-node decides; this proves the UI adds no
path around it, asking for another team's job, key and usage.)"""

from __future__ import annotations

import re

import httpx
import trio

from tests.cli.support import emailed_token, serve_ork

from .support import TLS, browser_of, sign_in, stream, ui_over
from .test_job_pages import FORM

LIMIT_S = 60
EVE, EVE_PASSWORD = "eve@example.com", "eve's long enough password"


async def test_another_teams_user_gets_nothing_of_a_teams_jobs_keys_or_streams(
        tmp_path, nursery):
    served = await serve_ork(tmp_path, nursery, monitor=False)
    ui = await ui_over(nursery, served)
    outbox = tmp_path / "app-node" / "outbox"
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as ada:
            await sign_in(ada)
            job = (await ada.post("/jobs", {**FORM, "name": "secret-job"})
                   ).headers["location"].removeprefix("/jobs/")
            await ada.post("/apikeys", {"name": "secret-key"})
            key = re.search(r'<tr id="key-([^"]+)">', (await ada.get("/apikeys")).text)[1]
            # Eve: a team of her own (made by the operator), none of core's.
            await served.login()
            assert (await served.cli("teams", "create", "elsewhere")).returncode == 0
            assert (await served.cli("teams", "invite", "elsewhere", EVE)).returncode == 0
            async with httpx.AsyncClient(base_url=f"{served.server}/api", verify=TLS) as api:
                joined = await api.post("/invitations/accept", json={
                    "token": emailed_token(outbox, EVE), "email": EVE, "name": "Eve",
                    "password": EVE_PASSWORD})
            assert joined.status_code == 200, joined.text
        async with browser_of(ui) as eve:
            await sign_in(eve, EVE, EVE_PASSWORD)
            listed = (await eve.get("/jobs")).text
            assert "secret-job" not in listed and job not in listed
            for path in (f"/jobs/{job}", f"/jobs/{job}/logs", f"/jobs/new?from={job}",
                         f"/apikeys/{key}"):
                answer = await eve.get(path)
                assert answer.status_code in (403, 404), (path, answer.status_code)
                assert "secret-job" not in answer.text and "secret-key" not in answer.text
            for topic in (f"job:{job}", f"logs:{job}"):  # as a deleted job: nothing of it
                gone = await eve.get("/ui/stream", params={"topic": topic})
                assert "secret-job" not in gone.text and "event: done" in gone.text
            async with stream(eve, "jobs") as own:
                assert "secret-job" not in await own()
            for path, data in ((f"/jobs/{job}/restart", {}), (f"/jobs/{job}/delete", {}),
                               (f"/apikeys/{key}/revoke", {})):
                answer = await eve.post(path, data)
                assert answer.status_code in (403, 404), (path, answer.status_code)
            assert served.job_ids() == {job}  # still there
        async with browser_of(ui) as ada:
            await sign_in(ada)
            row = re.search(rf'<tr id="key-{key}">.*?</tr>', (await ada.get("/apikeys")).text,
                            re.S)[0]
            assert "<td>Active</td>" in row  # Eve's revoke did nothing
