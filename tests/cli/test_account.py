"""The real ``cosmicac`` (subprocesses) against an app-node served in-process:
login with the password on stdin, whoami, teams, logout; each failure is one line
and the documented exit code.

Real scrypt (about a second a hash): the tests log in as few times as they can.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from nodes.app_node.daemon import RunningAppNode, serve_app_node
from nodes.app_node.settings import AppNodeSettings, HttpSettings
from p2p.keys import load_or_create_keypair
from tests.cli.helpers import COSMICAC

pytestmark = pytest.mark.slow

EMAIL = "ada@example.com"
PASSWORD = "correct horse battery staple"


@dataclass
class Served:
    node: RunningAppNode
    server: str  # http://H:P (the API is at <server>/api)
    env: dict[str, str]
    config: Path

    async def cli(self, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        return await trio.run_process([*COSMICAC, *args], stdin=stdin, capture_stdout=True,
                                      capture_stderr=True, check=False, env=self.env)

    async def login(self) -> None:
        result = await self.cli("login", "--email", EMAIL, "--password-stdin",
                                stdin=f"{PASSWORD}\n".encode())
        assert result.returncode == 0, result.stderr


def cli_env(config: Path, server: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    env.update({"COSMICAC_CONFIG_DIR": str(config), "COSMICAC_SERVER": server,
                "NO_COLOR": "1", "COLUMNS": "200"})
    return env


async def serve(tmp_path: Path, nursery: trio.Nursery, **settings: Any) -> Served:
    """app-node on ``tmp_path / "app-node"`` (``settings`` added, e.g. ``ork``), with
    the first admin signed up; the CLI's config folder is ``tmp_path / "config"``."""
    node_settings = AppNodeSettings(storage=tmp_path / "app-node", host="127.0.0.1", port=0,
                                    http=HttpSettings(host="127.0.0.1", port=0), fsync=False,
                                    **settings)
    with trio.fail_after(60):
        node: RunningAppNode = await nursery.start(serve_app_node, node_settings)
    host, port = node.http_address
    server = f"http://{host}:{port}"
    async with httpx.AsyncClient(base_url=f"{server}/api", timeout=30) as api:
        signup = await api.post("/auth/signup", json={
            "email": EMAIL, "name": "Ada", "password": PASSWORD, "team_name": "core"})
    assert signup.status_code == 201, signup.text
    config = tmp_path / "config"
    return Served(node, server, cli_env(config, server), config)


@pytest.fixture
async def served(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Served]:
    yield await serve(tmp_path, nursery)
    nursery.cancel_scope.cancel()


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


async def test_login_whoami_teams_logout(served: Served) -> None:
    with trio.fail_after(120):
        login = await served.cli("login", "--email", EMAIL, "--password-stdin",
                                 stdin=f"{PASSWORD}\n".encode())
        assert login.returncode == 0, login.stderr
        session_file = served.config / "session.json"
        assert stat.S_IMODE(session_file.stat().st_mode) == 0o600
        saved = json.loads(session_file.read_text())
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

        teams = await served.cli("teams", "list", "-o", "json")
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
        assert not session_file.exists()
        after = await served.cli("whoami")
        assert after.returncode == 3
        one_error_line(after)
        # The token was revoked on the server too.
        async with httpx.AsyncClient(base_url=f"{served.server}/api") as api:
            r = await api.get("/me", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 401


async def test_wrong_password_expired_session_server_down(served: Served) -> None:
    with trio.fail_after(60):
        wrong = await served.cli("login", "--email", EMAIL, "--password-stdin",
                                 stdin=b"not the password\n")
        assert wrong.returncode == 1
        one_error_line(wrong)
        assert not (served.config / "session.json").exists()

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
