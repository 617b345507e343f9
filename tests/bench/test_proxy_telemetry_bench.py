"""Smoke test of bench/proxy_telemetry.py: one short rep of both scenarios prints every
figure for both legs (as ``make bench`` runs it: a subprocess, JSON lines on stdout), no
request failed, and the ``on`` proxy really shipped records to the live wrk-monitor
(the ``retrying`` scenario's among them). The figures themselves are not checked: speed
is the bench's business, never a test's. ``wrk`` must be installed."""

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


def test_both_legs_print_every_figure_and_the_on_leg_ships() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "proxy_telemetry.py"), "--reps", "1",
         "--duration", "1", "--warm-up", "0", "--connections", "8", "--cost-records", "2000",
         # A wrk run ends once it has its answers: 300 of them take the proxy ~150 ms of
         # CPU (/proc counts 10 ms ticks) and the retrying ones log enough for a shipment
         # (a flush every 20 ms) to land within the run.
         "--requests", "300"],
        capture_output=True, text=True, timeout=240, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    figures: dict[tuple[str, str], float] = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "proxy_telemetry", record
        figures[(record["leg"], record["metric"])] = record["value"]
    for scenario in ("quiet", "retrying"):
        for leg in ("off", "on"):
            for metric in ("rps", "latency_p50", "latency_p99", "cpu_ms_per_req"):
                assert figures[(leg, f"{metric}_{scenario}")] > 0, (leg, metric, scenario)
            assert figures[(leg, f"errors_{scenario}")] == 0, (leg, scenario)
        assert figures[("both", f"rps_ratio_{scenario}")] > 0
        assert figures[("both", f"cpu_ms_ratio_{scenario}")] > 0
    # Start-up lines at least, and the retries logged on the request path.
    assert figures[("on", "records_sent_total")] > 0
    assert figures[("on", "records_shipped_retrying")] > 0
    assert "on/off" in done.stderr  # the table
