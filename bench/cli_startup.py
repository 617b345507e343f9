"""CLI start-up benchmark: how long a ``cosmicac`` command takes before it does anything.

Each command runs as a user runs it (the console script, a fresh process, a
configuration folder of its own with no session), ``--runs`` times; a command
that needs a session stops right after its imports with "not logged in", so
its time is the start-up a logged-in user pays before the first request.

Figures (JSON lines), per command: ``wall_ms`` (median, with min/max/n) and
``cpu_ms`` (median user+system CPU of the process). Target (issue 26):
``--help`` and ``whoami`` within 250 ms on the 2-core machine.

usage: python bench/cli_startup.py [--runs 15] [--warm-runs 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import emit, summary

COMMANDS = (
    ("--help",),
    ("whoami",),
    ("jobs", "list"),
    ("models", "list"),
    ("inference", "models"),
    ("shell", "--help"),
)


def cosmicac() -> str:
    found = Path(sys.executable).with_name("cosmicac")
    return str(found) if found.exists() else (shutil.which("cosmicac") or "cosmicac")


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms) of one run of ``argv``.

    ``os.wait4`` blocks until the exit and gives the child's own CPU: a
    ``subprocess.run(timeout=…)`` polls with sleeps up to 50 ms, which would round
    every figure to them. A timer kills a run that hangs (bounded: 60 s).
    """
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    watchdog = threading.Timer(60.0, process.kill)
    watchdog.start()
    try:
        _, _, usage = os.wait4(process.pid, 0)
    finally:
        watchdog.cancel()
        process.returncode = 0  # reaped above; Popen must not wait for it again
    wall = (time.perf_counter() - started) * 1000
    return wall, (usage.ru_utime + usage.ru_stime) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--warm-runs", type=int, default=1,
                        help="unmeasured runs of each command first (the page cache)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "COSMICAC_CONFIG_DIR": folder,
               "COSMICAC_SERVER": "http://127.0.0.1:9"}
        env.pop("COSMICAC_API_KEY", None)
        for command in COMMANDS:
            argv = [cosmicac(), *command]
            # Unmeasured runs first: the page cache warm, as for a user's second command.
            for _ in range(args.warm_runs):
                run_once(argv, env)
            walls, cpus = [], []
            for _ in range(args.runs):
                wall, cpu = run_once(argv, env)
                walls.append(wall)
                cpus.append(cpu)
            name = " ".join(command)
            emit("cli_startup", "wall_ms", summary(walls)["median"], "ms", command=name,
                 **{k: v for k, v in summary(walls).items() if k != "median"})
            emit("cli_startup", "cpu_ms", summary(cpus)["median"], "ms", command=name)


if __name__ == "__main__":
    main()
