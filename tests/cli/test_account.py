"""``cosmicac`` (run in this process) against an app-node served in-process:
login with the password on stdin, whoami, teams, logout; each failure is one line
and the documented exit code.

Real scrypt (about a second a hash): the tests log in as few times as they can.
"""

from __future__ import annotations

import json
import socket
import stat

import httpx
import pytest
import trio

from p2p.keys import load_or_create_keypair

from .support import EMAIL, PASSWORD, Served, cosmicac, emailed_token, one_error_line, shared_tls

pytestmark = pytest.mark.slow


async def test_login_whoami_teams_logout(served: Served) -> None:
    with trio.fail_after(120):
        login = await served.cli("login", "--email", EMAIL, "--password-stdin",
                                 stdin=f"{PASSWORD}\n".encode())
        assert login.returncode == 0, login.stderr
        contexts_file = served.config / "contexts.json"
        assert stat.S_IMODE(contexts_file.stat().st_mode) == 0o600
        contexts = json.loads(contexts_file.read_text())
        saved = contexts["contexts"][contexts["current"]]
        assert saved["server"] == served.server and saved["email"] == EMAIL

        who = await served.cli("whoami", "-o", "json")
        assert who.returncode == 0, who.stderr
        me = json.loads(who.stdout)
        assert me["user"]["email"] == EMAIL
        # The CLI's identity is registered, so shells into the team's jobs work.
        assert me["user"]["cli_public_key"] == \
            load_or_create_keypair(served.config / "user").hex
        [team] = me["teams"]
        assert team["name"] == "core" and team["role"] == "owner"

        # the teams group's smoke test: a real process
        teams = await served.cli("teams", "list", "-o", "json", process=True)
        [listed] = json.loads(teams.stdout)
        assert {key: listed[key] for key in team} == team
        assert listed["quota"]["gpus"] is None  # the first admin's team: no quota
        members = await served.cli("teams", "members", "core", "-o", "json")
        assert [m["user"]["email"] for m in json.loads(members.stdout)] == [EMAIL]

        created = await served.cli("teams", "create", "research", "-o", "json")
        assert created.returncode == 0, created.stderr
        research = json.loads(created.stdout)
        assert research["name"] == "research" and research["role"] == "owner"
        used = await served.cli("teams", "use", "research")
        assert used.returncode == 0, used.stderr
        who = await served.cli("whoami", "-o", "json")
        assert json.loads(who.stdout)["active_team"] == research["id"]
        unknown = await served.cli("teams", "members", "nope")
        assert unknown.returncode == 1
        one_error_line(unknown)

        invalid = await served.cli("teams", "invite", "core", "bob@example.com", "--role",
                                   "king")
        assert invalid.returncode == 2
        one_error_line(invalid)

        token = saved["token"]
        logout = await served.cli("logout")
        assert logout.returncode == 0, logout.stderr
        # The context stays (its server and account), its token is forgotten.
        contexts = json.loads(contexts_file.read_text())
        assert contexts["contexts"][contexts["current"]]["token"] is None
        after = await served.cli("whoami", process=True)  # the smoke test: a real process
        assert after.returncode == 3
        one_error_line(after)
        # The token was revoked on the server too.
        async with httpx.AsyncClient(base_url=f"{served.server}/api", verify=shared_tls()) as api:
            r = await api.get("/me", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 401


async def test_wrong_password_expired_session_server_down(served: Served) -> None:
    with trio.fail_after(60):
        wrong = await served.cli("login", "--email", EMAIL, "--password-stdin",
                                 stdin=b"not the password\n")
        assert wrong.returncode == 1
        one_error_line(wrong)
        assert not (served.config / "contexts.json").exists()

        # (a session.json, as an older cosmicac kept it, is taken in as a context)
        (served.config / "session.json").write_text(json.dumps({
            "server": served.server, "token": "t", "expires_at": 1.0, "email": EMAIL}))
        expired = await served.cli("apikeys", "list")
        assert expired.returncode == 3 and "expired" in one_error_line(expired)

        with socket.socket() as closed:  # a port nothing listens on
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
        down = await served.cli("login", "--email", EMAIL, "--password-stdin",
                                "--server", f"http://127.0.0.1:{port}", stdin=b"x\n")
        assert down.returncode == 4
        assert "cannot reach" in one_error_line(down)


async def test_accept_role_and_remove_are_the_team_pages_twins(served: Served) -> None:
    bob = "bob@example.com"
    outbox = served.config.parent / "app-node" / "outbox"
    with trio.fail_after(60):
        await served.login()
        assert (await served.cli("teams", "invite", "core", bob)).returncode == 0
        async with httpx.AsyncClient(base_url=f"{served.server}/api", verify=shared_tls()) as api:
            joined = await api.post("/invitations/accept", json={
                "token": emailed_token(outbox, bob), "email": bob, "name": "Bob",
                "password": "another long password"})
        assert joined.status_code in (200, 201), joined.text
        created = await served.cli("teams", "create", "research")
        assert created.returncode == 0, created.stderr
        assert (await served.cli("teams", "invite", "research", bob)).returncode == 0
        bob_env = await served.login_as(bob, "another long password",
                                        served.config.parent / "bob")
        accepted = await cosmicac("teams", "accept", emailed_token(outbox, bob), env=bob_env)
        assert accepted.returncode == 0, accepted.stderr
        assert "joined team" in accepted.stderr.decode()

        promoted = await served.cli("teams", "role", bob, "admin", "--team", "research")
        assert promoted.returncode == 0, promoted.stderr
        listed = json.loads((await served.cli("teams", "members", "research", "-o",
                                              "json")).stdout)
        assert {m["user"]["email"]: m["role"] for m in listed} == {EMAIL: "owner",
                                                                   bob: "admin"}
        last_owner = await served.cli("teams", "role", EMAIL, "member", "--team", "research")
        assert last_owner.returncode == 1 and "owner" in one_error_line(last_owner)
        stranger = await served.cli("teams", "remove", "carol@example.com", "--team",
                                    "research")
        assert stranger.returncode == 1 and "not a member" in one_error_line(stranger)
        removed = await served.cli("teams", "remove", bob, "--team", "research")
        assert removed.returncode == 0, removed.stderr
        listed = json.loads((await served.cli("teams", "members", "research", "-o",
                                              "json")).stdout)
        assert [m["user"]["email"] for m in listed] == [EMAIL]
