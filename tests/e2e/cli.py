"""The ``cosmicac`` command as the end-to-end tests drive it (tests/e2e, tests/vm)."""

from __future__ import annotations

import json
import subprocess

import trio

from ..cli.support import Ran, cosmicac, cosmicac_process

__all__ = ["CLI_LIMIT_S", "Cli"]


#: Every CLI call; a --wait is bounded by the CLI's own --timeout below it.
CLI_LIMIT_S = 240


class Cli:
    """``cosmicac`` against the running ``up``: in this process (a command costs what
    it does), or as a real process where the quick start's own lines are run
    (``process=True``: login, creating a job; and shells, which write to the
    terminal's file descriptors, out of CliRunner's reach), as a user types them."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    async def __call__(self, *args: str, stdin: bytes = b"", ok: bool = True,
                       process: bool = False) -> subprocess.CompletedProcess | Ran:
        with trio.fail_after(CLI_LIMIT_S):
            if process:
                result = await cosmicac_process(*args, stdin=stdin, env=self.env)
            else:
                result = await cosmicac(*args, stdin=stdin, env=dict(self.env))
        if ok:
            assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result

    async def json(self, *args: str) -> object:
        return json.loads((await self(*args, "-o", "json")).stdout)
