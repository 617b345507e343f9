"""Smoke test of bench/cli_startup.py: one run of each command (no warm-up run), every
figure printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_every_command_gets_both_figures() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "cli_startup.py"), "--runs",
                           "1", "--warm-runs", "0"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    commands = {r["command"] for r in records}
    assert {"--help", "whoami", "jobs list"} <= commands
    assert {(r["command"], r["metric"]) for r in records} == {
        (c, m) for c in commands for m in ("wall_ms", "cpu_ms")}
    assert all(r["value"] > 0 and r["unit"] == "ms" for r in records)
