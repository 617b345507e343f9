"""The team page and the email links' pages over a real app-node: an invitation sent
from the page is accepted from its link (a new account lands in the team), a member
sees no controls and a forged action gets a readable 403, and a password reset by
its link works. Nothing here needs curl."""

from __future__ import annotations

import re

import trio

from tests.cli.support import EMAIL, emailed_token, serve

from .support import browser_of, sign_in, ui_over

LIMIT_S = 60
BOB, BOB_PASSWORD = "bob@example.com", "bob's long enough password"


async def test_an_invitation_from_the_page_is_accepted_from_its_link_by_a_new_account(
        tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    outbox = tmp_path / "app-node" / "outbox"
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as ada, browser_of(ui) as bob:
            await sign_in(ada)
            page = (await ada.get("/team")).text
            assert "<h1>Team core</h1>" in page and "Send invitation" in page
            sent = await ada.post("/team/invitations", {"email": BOB, "role": "member"})
            assert sent.status_code == 303
            assert BOB in (await ada.get("/team")).text  # pending
            token = emailed_token(outbox, BOB)
            link = await bob.get(f"/accept?token={token}")
            assert link.status_code == 200 and "Create my account and join" in link.text
            joined = await bob.post("/accept", {"token": token, "email": BOB, "name": "Bob",
                                                "password": BOB_PASSWORD})
            assert joined.status_code == 303 and joined.headers["location"] == "/team"
            team = (await bob.get("/team")).text
            assert "<h1>Team core</h1>" in team and "Your role: Member." in team
            # A member sees no control, and a forged one is refused in words.
            assert "Change role" not in team and "Send invitation" not in team
            forged = await bob.post("/team/invitations", {"email": "eve@example.com",
                                                          "role": "owner"})
            assert forged.status_code == 403 and 'role="alert"' in forged.text
            assert "{" not in forged.text.split('role="alert"')[1].split("</div>")[0]
            # The owner changes Bob's role, then removes him.
            bob_id = re.search(r'<tr id="member-([^"]+)">\s*<th scope="row">Bob<',
                               (await ada.get("/team")).text)[1]
            assert (await ada.post(f"/team/members/{bob_id}/role", {"role": "admin"})
                    ).status_code == 303
            assert "Your role: Admin." in (await bob.get("/team")).text
            assert (await ada.post(f"/team/members/{bob_id}/remove")).status_code == 303
            assert BOB not in (await ada.get("/team")).text


async def test_the_last_owner_rule_is_the_apis_message(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as ada:
            await sign_in(ada)
            ada_id = re.search(r'<tr id="member-([^"]+)">', (await ada.get("/team")).text)[1]
            refused = await ada.post(f"/team/members/{ada_id}/role", {"role": "member"})
            assert refused.status_code == 409, refused.text
            assert "owner" in refused.text.split('role="alert"')[1]


async def test_a_password_reset_by_its_link_works_and_the_old_password_does_not(
        tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    outbox = tmp_path / "app-node" / "outbox"
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            asked = await browser.post("/reset/request", {"email": EMAIL})
            assert asked.status_code == 202 and "on its way" in asked.text
            unknown = await browser.post("/reset/request", {"email": "nobody@example.com"})
            assert unknown.status_code == 202 and "on its way" in unknown.text  # says nothing
            token = await _sent(outbox, EMAIL, "reset")  # sent after the answer
            form = await browser.get(f"/reset?token={token}")
            assert 'name="token" value="' + token + '"' in form.text
            short = await browser.post("/reset", {"token": token, "password": "short"})
            assert short.status_code == 422 and 'aria-invalid="true"' in short.text
            done = await browser.post("/reset", {"token": token,
                                                 "password": "a brand new long password"})
            assert done.status_code == 303 and done.headers["location"] == "/login?reset=1"
            assert "Your password is changed" in (await browser.get("/login?reset=1")).text
            await sign_in(browser, EMAIL, "a brand new long password")


async def _sent(outbox, to: str, link: str) -> str:
    """The emailed link's token, once app-node has sent it (bounded: 20 s)."""
    for _ in range(400):
        try:
            return emailed_token(outbox, to, link)
        except AssertionError:
            await trio.sleep(0.05)
    return emailed_token(outbox, to, link)
