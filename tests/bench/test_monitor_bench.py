"""Smoke test of bench/monitor.py: a tiny run prints every figure (as ``make bench``
runs it: a subprocess, JSON lines on stdout), and the shipper dropped nothing."""

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
        [sys.executable, str(ROOT / "bench" / "monitor.py"), "--records", "5000",
         "--rate", "2000", "--seconds", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "monitor", record
        figures[record["metric"]] = record["value"]
    for metric in ("records_per_s_flat_out", "records_per_s_paced", "delivery_ms_p50",
                   "delivery_ms_p99"):
        assert figures[metric] > 0, metric
    assert figures["shipper_dropped"] == 0
