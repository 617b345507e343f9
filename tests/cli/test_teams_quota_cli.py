"""``cosmicac teams quota get/set``, quotas in ``teams list/get``, and team creation
for operators only, through typer's CliRunner against an
in-process app-node and wrk-ork: an operator sets a team's quotas; a member may
neither set them nor create a team; a job over the quota is refused in one line
with exit 1; bad values are usage errors (exit 2)."""

from __future__ import annotations

import json

import pytest
import trio
from typer.testing import CliRunner

from cli.main import app
from nodes.app_node.auth import hash_password

from .support import CHEAP, EMAIL, PASSWORD, ServedOrk

pytestmark = pytest.mark.slow

IMAGE = "docker://registry.local/jobs/app:1"


async def _cli(env: dict[str, str], *args: str):
    """``cosmicac *args`` in a worker thread (the CLI is synchronous; app-node runs here)."""
    return await trio.to_thread.run_sync(
        lambda: CliRunner().invoke(app, list(args), env=env))


def _one_error_line(result) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


async def test_operators_set_quotas_members_may_not(served_ork: ServedOrk) -> None:
    served = served_ork
    store = served.node.services.store
    with trio.fail_after(120):
        operator = await served.login_as(EMAIL, PASSWORD, served.config / "operator")

        def add_member() -> None:
            [(core, _)] = store.teams.of_user(store.users.by_email(EMAIL).id)
            user = store.users.create(email="m@example.com", name="m",
                                      password_hash=hash_password(PASSWORD, params=CHEAP), now=0.0)
            store.teams.add_member(core.id, user.id, "member")

        await trio.to_thread.run_sync(add_member)
        member = await served.login_as("m@example.com", PASSWORD, served.config / "member")

        # only operators create teams
        refused = await _cli(member, "teams", "create", "mine")
        assert refused.exit_code == 1
        assert "only operators create teams" in _one_error_line(refused)
        created = await _cli(operator, "teams", "create", "lab", "-o", "json")
        assert created.exit_code == 0, created.output
        lab = json.loads(created.output)
        assert lab["quota"]["gpus"] is None

        # set, get, and shown in list/get
        done = await _cli(operator, "teams", "quota", "set", "lab", "--gpus", "2",
                          "--per-user", "1", "-o", "json")
        assert done.exit_code == 0, done.output
        assert json.loads(done.output)["gpus"] == 2
        got = await _cli(operator, "teams", "quota", "get", "lab", "-o", "json")
        quota = json.loads(got.output)
        assert (quota["team"], quota["gpus"], quota["per_user_gpus"]) == (lab["id"], 2, 1)
        done = await _cli(operator, "teams", "quota", "set", "lab", "--per-user", "unlimited",
                          "-o", "json")
        assert (json.loads(done.output)["gpus"], json.loads(done.output)["per_user_gpus"]) \
            == (2, None)
        listed = await _cli(operator, "teams", "list", "-o", "json")
        by_name = {t["name"]: t for t in json.loads(listed.output)}
        assert by_name["lab"]["quota"]["gpus"] == 2 and by_name["core"]["quota"]["gpus"] is None
        table = await _cli(operator, "teams", "list")
        assert table.exit_code == 0 and "unlimited" in table.output, table.output
        one = await _cli(operator, "teams", "get", "lab")
        assert one.exit_code == 0 and "GPU QUOTA" in one.output, one.output

        # a member may not set quotas, not even of the operators' team they are in;
        # a team that is none of theirs is taken as an id, and the server says 404
        core_id = by_name["core"]["id"]
        for team in (core_id, "core", lab["id"]):
            refused = await _cli(member, "teams", "quota", "set", team, "--gpus", "64")
            assert refused.exit_code == 1, (team, refused.output)
            _one_error_line(refused)
        assert store.quotas.get(core_id).gpus is None

        # usage errors: exit 2, one line
        for args in (["--gpus", "lots"], ["--per-user", "-1"], []):
            bad = await _cli(operator, "teams", "quota", "set", "lab", *args)
            assert bad.exit_code == 2, (args, bad.output)
            _one_error_line(bad)

        # a job over the quota: one line naming it, exit 1, nothing created
        ok = await _cli(operator, "jobs", "create", "--name", "a", "--type", "container",
                        "--image", IMAGE, "--gpus", "2", "--team", "lab")
        assert ok.exit_code == 0, ok.output
        known = served.job_ids()
        over = await _cli(operator, "jobs", "create", "--name", "b", "--type", "container",
                          "--image", IMAGE, "--gpus", "1", "--team", "lab")
        assert over.exit_code == 1, over.output
        line = _one_error_line(over)
        assert "GPU quota of 2" in line and "asks for 1" in line
        assert served.job_ids() == known
