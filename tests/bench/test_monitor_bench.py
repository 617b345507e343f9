"""Smoke test of bench/monitor.py: a tiny run prints every figure (as ``make bench``
runs it: a subprocess, JSON lines on stdout), the shipper dropped nothing, and
in the run with Loki every paced record reached the Loki server, none dropped
or given up by the pusher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_every_figure_is_printed() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "monitor.py"), "--records", "2000",
         "--rate", "2000", "--seconds", "0.25", "--warmup", "1000"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = {}
    extras = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "monitor", record
        figures[record["metric"]] = record["value"]
        extras[record["metric"]] = record
    for metric in ("records_per_s_flat_out", "records_per_s_paced", "delivery_ms_p50",
                   "delivery_ms_p99", "records_per_s_paced_with_loki",
                   "delivery_ms_p50_with_loki", "delivery_ms_p99_with_loki",
                   "loki_records_per_s", "loki_delay_ms_p50", "loki_delay_ms_p99"):
        assert figures[metric] > 0, metric
    for metric in ("shipper_dropped", "shipper_dropped_with_loki", "follower_missing",
                   "follower_missing_with_loki", "loki_dropped", "loki_failed",
                   "loki_rejected", "loki_buffered"):
        assert figures[metric] == 0, metric
    assert extras["loki_records_per_s"]["received"] == extras["loki_records_per_s"]["paced"] == 500
