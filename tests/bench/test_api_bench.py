"""Smoke test of bench/api.py: a tiny seed (4 users, 20 jobs in 2 teams), 1 s runs.

It runs the script as ``make bench`` does (a subprocess, JSON lines on
stdout): app-node and wrk-ork really start as processes and ``wrk`` really
loads them, so a broken bench shows up in ``make test``. ``wrk`` must be
installed (the bench would apt-get it, a test does not).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")]


def test_both_routes_print_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "api.py"), "--quick", "--users", "4",
         "--jobs", "20", "--teams", "2", "--duration", "1", "--warm-up", "0",
         # 300 answers: a listing now costs app-node ~0.4 ms of CPU, and /proc counts
         # CPU in 10 ms ticks, so 20 could round to none.
         "--connections", "4", "--requests", "300"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures: dict[tuple[str, str], float] = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "api", record
        figures[(record["route"], record["metric"])] = record["value"]
    for route in ("GET /api/jobs", "POST /api/apikeys"):
        for metric in ("rps_1", "rps_4", "latency_p50_1", "latency_p99_1", "latency_p50_4",
                       "latency_p99_4", "cpu_ms_per_req_1_app"):
            assert figures[(route, metric)] > 0, (route, metric)
        for metric in ("errors_1", "errors_4"):
            assert figures[(route, metric)] == 0, (route, metric)
        assert figures[(route, "latency_p50_1")] <= figures[(route, "latency_p99_1")]
    assert "GET /api/jobs" in done.stderr and "POST /api/apikeys" in done.stderr  # the table
