"""Contexts against two app-nodes served in this process: one configuration logged
in to both, switched with ``--context``, ``$COSMICAC_CONTEXT`` and ``context use``;
``--server`` overriding a context's server for one command; ``logout`` forgetting
one context's token only; a session kept by an older cosmicac taken in; and
``--context`` after the command on a real process's command line (main's pre-parse)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx
import pytest
import trio

from .support import (
    EMAIL,
    PASSWORD,
    Served,
    cosmicac,
    cosmicac_process,
    one_error_line,
    serve,
    shared_tls,
)

pytestmark = pytest.mark.slow


def _env(config: Path, **extra: str) -> dict[str, str]:
    """No $COSMICAC_SERVER: it would override every context's server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    env.update({"COSMICAC_CONFIG_DIR": str(config), "NO_COLOR": "1", "COLUMNS": "200",
                **extra})
    return env


async def _login(env: dict[str, str], *args: str) -> str:
    """``cosmicac [--context NAME] login ... ARGS``; the line login printed."""
    before = list(args[:2]) if args[:1] == ("--context",) else []
    result = await cosmicac(*before, "login", *args[len(before):], "--email", EMAIL,
                            "--password-stdin", env=env, stdin=f"{PASSWORD}\n".encode())
    assert result.returncode == 0, result.stderr
    return result.stderr.decode()


async def _whoami(env: dict[str, str], *args: str, server: str | None = None) -> dict:
    """``cosmicac ARGS whoami -o json [--server SERVER]``, parsed."""
    result = await cosmicac(*args, "whoami", "-o", "json",
                            *(["--server", server] if server else []), env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def _token_works(server: str, token: str) -> bool:
    async with httpx.AsyncClient(base_url=f"{server}/api", timeout=30, verify=shared_tls()) as api:
        answer = await api.get("/me", headers={"authorization": f"Bearer {token}"})
    return answer.status_code == 200


async def test_one_configuration_two_servers(tmp_path: Path, nursery: trio.Nursery) -> None:
    with trio.fail_after(120):
        one = await serve(tmp_path / "one", nursery)
        two = await serve(tmp_path / "two", nursery)
    config = tmp_path / "config"
    env = _env(config)
    path = config / "contexts.json"
    host_two = two.server.removeprefix("http://")
    with trio.fail_after(180):
        said = await _login(env, "--context", "staging", "--server", one.server)
        assert "(context staging)" in said
        said = await _login(env, "--server", two.server)  # named after the server
        assert f"(context {host_two})" in said
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        saved = json.loads(path.read_text())
        assert saved["current"] == host_two
        assert {name: c["server"] for name, c in saved["contexts"].items()} == \
            {"staging": one.server, host_two: two.server}

        # The current context, then --context, then $COSMICAC_CONTEXT, --context over it.
        assert (await _whoami(env))["context"] == {"name": host_two, "server": two.server}
        assert (await _whoami(env, "--context", "staging"))["context"]["name"] == "staging"
        staging_env = _env(config, COSMICAC_CONTEXT="staging")
        assert (await _whoami(staging_env))["context"]["server"] == one.server
        assert (await _whoami(staging_env, "--context", host_two))["context"]["server"] == \
            two.server
        # whoami names the context on stderr too, beside the table on stdout
        table = await cosmicac("--context", "staging", "whoami", env=env)
        assert f"context staging ({one.server})" in table.stderr.decode()
        assert EMAIL in table.stdout.decode()

        # Each server knows its own session: the tokens are not mixed up.
        tokens = {name: c["token"] for name, c in saved["contexts"].items()}
        assert await _token_works(one.server, tokens["staging"])
        assert not await _token_works(one.server, tokens[host_two])

        # --server (and $COSMICAC_SERVER) overrides the context's server for one command.
        moved = await cosmicac("--context", "staging", "whoami", "--server", two.server,
                               env=env)
        assert moved.returncode == 3  # staging's token, sent to two: refused there
        assert f"context staging ({two.server})" not in one_error_line(moved)
        wrong = await cosmicac("--context", host_two, "whoami",
                               env={**env, "COSMICAC_SERVER": one.server})
        assert wrong.returncode == 3  # two's token, sent to one
        one_error_line(wrong)
        spelled = await _whoami(env, "--context", "staging", server=f"{one.server}/api/")
        assert spelled["context"] == {"name": "staging", "server": one.server}

        # context use: the current one changes, commands follow.
        used = await cosmicac("context", "use", "staging", env=env)
        assert used.returncode == 0, used.stderr
        assert (await _whoami(env))["context"]["name"] == "staging"

        # Logging in again to the current context: the same one, its account remembered.
        again = await cosmicac("login", "--password-stdin", env=env,
                               stdin=f"{PASSWORD}\n".encode())
        assert again.returncode == 0, again.stderr
        assert f"on {one.server} (context staging)" in again.stderr.decode()
        assert sorted(json.loads(path.read_text())["contexts"]) == sorted(["staging",
                                                                           host_two])

        # logout: that context's token forgotten here and revoked there; the other stays.
        staging_token = json.loads(path.read_text())["contexts"]["staging"]["token"]
        out = await cosmicac("logout", env=env)
        assert out.returncode == 0, out.stderr
        assert "(context staging)" in out.stderr.decode()
        saved = json.loads(path.read_text())
        assert saved["contexts"]["staging"]["token"] is None
        assert saved["contexts"]["staging"]["server"] == one.server
        assert not await _token_works(one.server, staging_token)
        listed = json.loads((await cosmicac("context", "list", "-o", "json", env=env)).stdout)
        assert {c["name"]: c["logged_in"] for c in listed} == {"staging": False,
                                                                host_two: True}
        after = await cosmicac("whoami", env=env)
        assert after.returncode == 3 and "'staging'" in one_error_line(after)
        assert (await _whoami(env, "--context", host_two))["context"]["name"] == host_two

        # --context before the command (here, as the root option), and after it: a real
        # process, where main takes it out of any command (test_contexts.py has its
        # pre-parse on every position); an unknown one is a usage error.
        before = await cosmicac("--context", host_two, "whoami", "-o", "json", env=env)
        assert before.returncode == 0, before.stderr
        assert json.loads(before.stdout)["context"]["server"] == two.server
        ran = await cosmicac_process("whoami", "-o", "json", "--context", host_two, env=env)
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout)["context"]["server"] == two.server
        unknown = await cosmicac("--context", "nope", "jobs", "list", env=env)
        assert unknown.returncode == 2 and "'nope'" in one_error_line(unknown)


async def test_a_session_kept_by_an_older_cosmicac_keeps_working(served: Served) -> None:
    with trio.fail_after(120):
        env = await served.login_as(EMAIL, PASSWORD, served.config)  # writes session.json
        assert (await cosmicac("whoami", env=env)).returncode == 0
        assert not (served.config / "session.json").exists()
        saved = json.loads((served.config / "contexts.json").read_text())
        name = served.server.removeprefix("http://")
        assert saved["current"] == name
        assert saved["contexts"][name]["server"] == served.server
