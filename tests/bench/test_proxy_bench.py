"""Smoke test of bench/proxy.py: the ``direct`` leg alone, shortest settings.

It runs the script as ``make bench`` does (a subprocess, JSON lines on
stdout) so a broken bench shows up in ``make test``, not in the next
benchmark run. LiteLLM (its own venv, minutes to install) and the ``ours``
deployment are left out; ``wrk`` must be installed (the bench would apt-get it,
a test does not).
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


def test_direct_leg_prints_every_figure() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "proxy.py"), "--quick", "--legs", "direct",
         "--duration", "1", "--streams", "16", "--stream-clients", "4", "--warm-up", "0",
         "--requests", "20"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "proxy" and record["leg"] == "direct", record
        figures[record["metric"]] = record["value"]
    for metric in ("latency_p50_1", "latency_p99_1", "rps_1", "rps_64", "latency_p50_64",
                   "latency_p99_64", "stream_chunks_per_s_1", "stream_chunks_per_s_4",
                   "ttfc_p50_1", "ttfc_p99_1", "stream_chunks"):
        assert figures[metric] > 0, metric
    for metric in ("errors_1", "errors_64", "stream_errors_1", "stream_errors_4"):
        assert figures[metric] == 0, metric
    assert figures["latency_p50_1"] <= figures["latency_p99_1"]
    assert figures["stream_chunks"] >= 20  # the longest demo answer, as SSE events
    assert "direct" in done.stderr  # the table
