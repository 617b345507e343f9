"""The API keys page over a real app-node: a new key's secret is shown once, revoking
asks first and sticks, and a bad name is tied to its field."""

from __future__ import annotations

import re

import trio

from tests.cli.support import serve

from .support import browser_of, sign_in, ui_over

LIMIT_S = 60


async def test_a_new_keys_secret_is_shown_once_then_only_its_prefix(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            empty = await browser.get("/apikeys")
            assert empty.status_code == 200 and "No keys yet." in empty.text
            created = await browser.post("/apikeys", {"name": "ci"})
            assert created.status_code == 303 and created.headers["location"] == "/apikeys"
            assert "sk" not in created.headers["location"]  # never in a URL
            shown = (await browser.get("/apikeys")).text
            secret = re.search(r'<code id="new-secret">([^<]+)</code>', shown)[1]
            prefix = re.search(r"only its prefix <code>([^<]+)</code>", shown)[1]
            assert secret.startswith(prefix) and len(secret) > len(prefix) + 16
            again = (await browser.get("/apikeys")).text
            assert secret not in again and f"<code>{prefix}</code>" in again
            key_id = re.search(r'<tr id="key-([^"]+)">', again)[1]
            assert 'command="show-modal">Revoke' in again
            revoked = await browser.post(f"/apikeys/{key_id}/revoke")
            assert revoked.status_code == 303
            after = (await browser.get("/apikeys")).text
            assert "<td>Revoked</td>" in after and "Revoke key" not in after
            usage = await browser.get(f"/apikeys/{key_id}")
            assert usage.status_code == 200 and "Not used yet." in usage.text


async def test_a_bad_name_is_tied_to_its_field(tmp_path, nursery):
    served = await serve(tmp_path, nursery)
    ui = await ui_over(nursery, served)
    with trio.fail_after(LIMIT_S):
        async with browser_of(ui) as browser:
            await sign_in(browser)
            answer = await browser.post("/apikeys", {"name": "x" * 200})
            assert answer.status_code == 422, answer.text
            assert re.search(r'id="f-name"[^>]*aria-invalid="true"', answer.text)
            assert 'role="alert"' in answer.text
