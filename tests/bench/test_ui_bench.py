"""Smoke test of bench/ui.py: a small run prints every figure (as ``make bench`` runs it:
a subprocess, JSON lines on stdout). The figures themselves are the bench's business."""

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
        [sys.executable, str(ROOT / "bench" / "ui.py"), "--jobs", "60", "--pages", "5",
         "--subscribers", "3", "--changes", "1"],
        capture_output=True, text=True, timeout=240, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "ui", record
        figures[record["metric"]] = record["value"]
    for metric in ("jobs_page_p50", "jobs_page_p99", "jobs_page_bytes", "stream_connect_s",
                   "stream_status_p50", "stream_status_p99", "stream_status_max"):
        assert figures[metric] > 0, metric
    assert figures["jobs_page_p50"] <= figures["jobs_page_p99"]
    assert "streams connected" in done.stderr  # the summary line
