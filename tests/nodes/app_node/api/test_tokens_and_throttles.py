"""Who may guess what.

- A token that is no invitation or reset link answers the same, whatever else
  the request says (an email with an account or without, a session or none),
  and costs no account, no lookup and no scrypt hash.
- Failed logins back off per (email, address) with a ceiling per email that
  the addresses a user logged in from are exempt from, so no one elsewhere can
  lock the user out; reset emails and token guesses are throttled the same way.

Clients are told apart as the door tells them apart: app-node trusts
127.0.0.1 (the test client's address) as its proxy and reads X-Forwarded-For.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodes.app_node.api import _auth_routes
from nodes.app_node.ratelimit import Backoff, ThrottlePolicy

from .apis import GENEROUS, PASSWORD, Api, bearer, make_api

LIMITS = GENEROUS.model_copy(update={
    "trusted_proxies": ("127.0.0.1",),
    "login": ThrottlePolicy(per_source=Backoff(free_failures=3, base_s=10, max_s=80),
                            per_account=Backoff(free_failures=6, base_s=10, max_s=60)),
    "reset_email": ThrottlePolicy(per_source=Backoff(free_failures=2, base_s=60, max_s=600),
                                  per_account=Backoff(free_failures=4, base_s=60, max_s=600)),
    "token_guess": ThrottlePolicy(per_source=Backoff(free_failures=3, base_s=5, max_s=60),
                                  per_account=None),
})


def at(address: str, **headers: str) -> dict[str, str]:
    return {"X-Forwarded-For": address, **headers}


@pytest.fixture
async def door(tmp_path: Path) -> AsyncIterator[Api]:
    async for api in make_api(tmp_path, LIMITS):
        yield api


async def _login(api: Api, address: str, password: str = PASSWORD,
                 email: str = "admin@example.com") -> int:
    r = await api.client.post("/api/auth/login", json={"email": email, "password": password},
                              headers=at(address))
    if r.status_code == 429:
        assert r.json()["error"]["code"] == "THROTTLED" and int(r.headers["retry-after"]) >= 1
    return r.status_code


# -- unknown tokens -------------------------------------------------------------------


async def test_a_made_up_invitation_token_does_not_tell_which_emails_have_accounts(
        door: Api, monkeypatch) -> None:
    """Regression: 409 for an email with an account, 404 for one without (and a
    user created, and a scrypt hash spent, before the token was looked at)."""
    hashes: list[str] = []
    real = _auth_routes.hash_password
    monkeypatch.setattr(_auth_routes, "hash_password",
                        lambda password, **kw: hashes.append(password) or real(password, **kw))
    admin = await door.signup()
    hashes.clear()  # the admin's own
    users_before = door.services.store.users.page(limit=100).items
    answers = set()
    for i, email in enumerate(("admin@example.com", "nobody@example.com")):
        for j, headers in enumerate(({}, bearer(admin), bearer("cac_made_up"))):
            r = await door.client.post("/api/invitations/accept", json={
                "token": "made-up", "email": email, "name": "X", "password": PASSWORD},
                headers={**headers, **at(f"198.51.100.{3 * i + j}")})
            answers.add((r.status_code, r.text))
    assert len(answers) == 1, answers
    [(status, text)] = answers
    assert status == 404 and '"field":"token"' in text.replace(" ", "")
    assert door.services.store.users.page(limit=100).items == users_before
    assert hashes == []


@pytest.mark.parametrize("path", ["/api/invitations/accept", "/api/auth/password-reset/confirm"])
async def test_every_token_route_answers_the_same_for_any_made_up_token(
        door: Api, path: str) -> None:
    admin = await door.signup()
    account = ({"email": "admin@example.com", "name": "N"}, {"email": "new@example.com",
                                                            "name": "N"})
    extra = account if path.endswith("/accept") else ({},)  # confirm takes no email
    bodies = [{"token": t, "password": PASSWORD, **e}
              for t in ("x", "cac_" + "a" * 40, "🙂" * 10) for e in extra]
    answers = set()
    for i, body in enumerate(bodies):
        for headers in ({}, bearer(admin)):
            r = await door.client.post(path, json=body,
                                       headers={**headers, **at(f"203.0.113.{i}")})
            answers.add((r.status_code, r.json()["error"]["code"], r.json()["error"]["field"]))
    assert answers == {(404, "NOT_FOUND", "token")}


@pytest.mark.parametrize("path", ["/api/invitations/accept", "/api/auth/password-reset/confirm"])
async def test_token_guesses_back_off_per_address(door: Api, path: str) -> None:
    body = {"token": "guess", "password": PASSWORD}
    codes = [(await door.client.post(path, json=body, headers=at("192.0.2.9"))).status_code
             for _ in range(5)]
    assert codes == [404, 404, 404, 404, 429]  # 3 free, the 4th sets a 5 s wait
    # another address is not held back by the guesser
    r = await door.client.post(path, json=body, headers=at("192.0.2.10"))
    assert r.status_code == 404
    door.clock.now += 5
    r = await door.client.post(path, json=body, headers=at("192.0.2.9"))
    assert r.status_code == 404


# -- logins ---------------------------------------------------------------------------


async def test_failed_logins_back_off_for_the_guessing_address_only(door: Api) -> None:
    await door.signup()
    attacker, user = "192.0.2.66", "198.51.100.7"
    codes = [await _login(door, attacker, "wrong password!") for _ in range(5)]
    assert codes == [401, 401, 401, 401, 429]  # the 4th failure sets a 10 s wait
    # the right password from the attacker's address waits too: no oracle
    assert await _login(door, attacker) == 429
    assert await _login(door, user) == 200  # the real user's address is untouched
    door.clock.now += 10
    assert await _login(door, attacker, "wrong password!") == 401
    assert await _login(door, attacker) == 429  # 20 s now: the wait doubles
    door.clock.now += 20
    assert await _login(door, attacker) == 200  # a success clears its failures
    assert [await _login(door, attacker, "wrong password!") for _ in range(3)] == [401] * 3


async def test_a_botnet_cannot_lock_out_an_address_that_logged_in_before(door: Api) -> None:
    await door.signup()
    home = "198.51.100.7"
    assert await _login(door, home) == 200
    # seven addresses, one guess each: the account's ceiling (6 free) is reached
    for i in range(7):
        assert await _login(door, f"192.0.2.{i}", "wrong password!") == 401
    assert await _login(door, "192.0.2.200", "wrong password!") == 429  # strangers wait
    assert await _login(door, "203.0.113.5") == 429  # a new address of the user too
    assert await _login(door, home) == 200  # home is known: never held by the ceiling
    door.clock.now += 10
    assert await _login(door, "203.0.113.5") == 200  # the ceiling's wait is bounded


async def test_unknown_emails_are_throttled_like_wrong_passwords(door: Api) -> None:
    await door.signup()
    for email in ("admin@example.com", "nobody@example.com"):
        codes = [await _login(door, "192.0.2.1", "wrong password!", email) for _ in range(5)]
        assert codes == [401, 401, 401, 401, 429], email


async def test_made_up_bearer_tokens_buy_no_fresh_bucket(tmp_path: Path) -> None:
    """Regression: each ``Authorization: Bearer <random>`` had its own bucket."""
    from nodes.app_node.ratelimit import Rate
    tight = LIMITS.model_copy(update={"per_ip": Rate(per_second=0.001, burst=3),
                                      "per_token": Rate(per_second=0.001, burst=3)})
    async for api in make_api(tmp_path, tight):
        codes = [(await api.client.get("/api/me", headers={
            **bearer(f"cac_random_{i}"), **at("192.0.2.1")})).status_code for i in range(5)]
        assert codes == [401, 401, 401, 429, 429]
        # a client elsewhere behind the door still gets in
        r = await api.client.get("/api/openapi.json", headers=at("192.0.2.2"))
        assert r.status_code == 200


async def test_a_verified_session_has_its_own_bucket(tmp_path: Path) -> None:
    from nodes.app_node.ratelimit import Rate
    tight = LIMITS.model_copy(update={"per_ip": Rate(per_second=0.001, burst=3),
                                      "per_token": Rate(per_second=0.001, burst=5)})
    async for api in make_api(tmp_path, tight):
        token = await api.signup()  # the address's 1st request
        codes = [(await api.client.get("/api/me", headers=bearer(token))).status_code
                 for _ in range(7)]
        # the 2nd (verifies the session) counts against the address, then 5 on the token
        assert codes == [200] * 6 + [429]


# -- reset emails ---------------------------------------------------------------------


async def test_reset_emails_back_off_per_address_and_per_email(door: Api) -> None:
    await door.signup()
    home = "198.51.100.7"
    assert await _login(door, home) == 200

    async def reset(address: str, email: str = "admin@example.com") -> int:
        r = await door.client.post("/api/auth/password-reset", json={"email": email},
                                   headers=at(address))
        return r.status_code

    assert [await reset("192.0.2.1") for _ in range(4)] == [202, 202, 202, 429]
    assert await reset("192.0.2.2") == 202  # 4 for the account, within the ceiling
    assert await reset("192.0.2.3") == 202  # 5th: now past the ceiling
    assert await reset("192.0.2.4") == 429  # a stranger waits
    assert await reset(home) == 202  # the user's known address does not
    # an address with no account is throttled alike: a 429 tells nothing
    assert [await reset("192.0.2.9", "nobody@example.com")
            for _ in range(4)] == [202, 202, 202, 429]


async def test_a_throttled_login_is_logged_with_the_address_not_the_account(
        door: Api, caplog) -> None:
    import logging

    await door.signup()
    with caplog.at_level(logging.INFO, logger="nodes.app_node.api._common"):
        for _ in range(5):
            await _login(door, "192.0.2.66", "wrong password!")
    [record] = [r for r in caplog.records if r.getMessage().startswith("api.throttled")]
    assert "source=192.0.2.66" in record.getMessage()
    assert "admin@example.com" not in record.getMessage()


async def test_a_session_guessing_the_current_password_is_throttled_as_logins(
        door: Api) -> None:
    token = await door.signup()
    wrong = {"current_password": "not it at all", "password": "a new long password"}
    codes = [(await door.client.put("/api/me/password", json=wrong, headers={
        **bearer(token), **at("192.0.2.66")})).status_code for _ in range(5)]
    assert codes == [403, 403, 403, 403, 429]
    assert await _login(door, "192.0.2.66") == 429  # the same throttle as logins
    assert await _login(door, "198.51.100.7") == 200  # elsewhere: untouched
