"""The platform the browser tests use: one ``cosmicac up`` in a subprocess on free
ports, for the whole session (its start costs every daemon's start-up)."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.cli.helpers import COSMICAC, UP, _children, free_base_port, kill_all, pids_using
from tests.cli.support import CHEAP

__all__ = ["Platform", "platform_starting"]

#: Bounded wait for up's "cosmicac is up at URL".
START_LIMIT_S = 120


@dataclass
class Platform:
    """A running ``up``: its URL, its admin and where it writes."""

    url: str
    email: str
    password: str
    storage: Path
    #: The CLI's environment, logged in as the admin (up did it).
    env: dict[str, str]
    stdout: Path
    stderr: Path
    #: up's process (a test may stop it as a user does, with Ctrl-C).
    process: subprocess.Popen | None = None

    def interrupt(self, limit_s: float) -> float:
        """Ctrl-C to up, as in its terminal: how long it took to exit (0 is its status)."""
        assert self.process is not None
        began = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=limit_s)
        assert code == 0, f"up exited with {code}: {self.stderr.read_text()[-2000:]}"
        return time.monotonic() - began

    def logs(self, tail: int = 6000) -> str:
        """up's own output and the end of each daemon's log, for a failure's report."""
        parts = [f"--- up stdout ---\n{self.stdout.read_text(errors='replace')[-tail:]}",
                 f"--- up stderr ---\n{self.stderr.read_text(errors='replace')[-tail:]}"]
        for log in sorted((self.storage / "logs").glob("*.log")):
            parts.append(f"--- {log.name} ---\n{log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)


@contextmanager
def platform_starting(folder: Path) -> Iterator[Callable[[], Platform]]:
    """``cosmicac up`` started in ``folder``: yields a function that waits until it
    is up (the first call; later calls return the same) and returns it, so the caller
    can do something else while its daemons start. Killed with every process it
    started on the way out."""
    storage, config = folder / "up", folder / "config"
    stdout, stderr = folder / "up.stdout", folder / "up.stderr"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    env.update(COSMICAC_CONFIG_DIR=str(config), NO_COLOR="1")
    # app-node's scrypt cost, through its settings (up's daemons inherit up's
    # environment): the same code path as OWASP's floor for a thousandth of the CPU,
    # as tests/cli/support.py's app-nodes hash. At the floor every hash and check
    # (up's admin and CLI login, each sign-in, an invited account) is 128 MiB and
    # 0.3-1 s of a busy CPU; the cost is no business of the browser tests.
    env.update({f"COSMICAC_APP_NODE__PASSWORD_HASH__{name.upper()}": str(value)
                for name, value in (("ln", CHEAP.ln), ("r", CHEAP.r), ("p", CHEAP.p))})
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [*COSMICAC, "up", "--storage", str(storage), "--no-table", "--base-port",
             str(free_base_port())], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            env=env)

    @functools.cache
    def ready() -> Platform:
        url = _wait_for_url(proc, stdout, stderr)
        creds = json.loads((storage / "credentials.json").read_text())
        return Platform(url, creds["email"], creds["password"], storage,
                        {**env, "COSMICAC_SERVER": url}, stdout, stderr, proc)

    try:
        yield ready
    finally:
        children = _children(proc.pid) if proc.poll() is None else []
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # up stops its daemons and their agents
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        kill_all({*children, *pids_using(storage)})


def _wait_for_url(proc: subprocess.Popen, stdout: Path, stderr: Path) -> str:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        found = re.search(UP.pattern, stdout.read_text(errors="replace"))
        if found:
            return found[1]
        if proc.poll() is not None:
            raise AssertionError(f"up exited with {proc.returncode}: "
                                 f"{stderr.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"up did not say it was up in {START_LIMIT_S} s: "
                         f"{stderr.read_text(errors='replace')[-3000:]}")
