"""Smoke test of bench/job_start.py: ``cosmicac up`` for real, one inference job
on the local backend (about 40 s), every step and mark printed, nothing left.

A subprocess as ``make bench`` runs it; the bench itself stops ``up`` with
SIGINT and counts the deployment's processes left (``leftover_processes``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_one_job_gives_every_step() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "job_start.py"), "--quick", "--poll-ms", "50"],
        capture_output=True, text=True, timeout=400, cwd=ROOT, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "job_start", record
        figures[record["metric"]] = record["value"]
    steps = ("ork", "queue", "worker", "agent_start", "health", "api_poll")
    for step in (*steps, "api"):
        assert figures[f"step_{step}"] >= 0, step
    assert figures["step_agent_start"] > 0 and figures["step_health"] > 0
    # The steps are consecutive: they add up to the total (rounding aside).
    assert abs(sum(figures[f"step_{s}"] for s in steps) - figures["total"]) < 1.0
    assert figures["at_running"] == pytest.approx(figures["total"])
    assert figures["leftover_processes"] == 0
    assert "agent_start" in done.stderr  # the table
