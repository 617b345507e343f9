"""Smoke test of bench/punch.py, as ``make bench`` runs it (a subprocess, JSON lines on
stdout): with one NAT-lab pair and few trials, it prints that pair's rate and times, and
the throughput of a punched connection beside a direct and a relayed one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.netns.topology import unavailable_reason

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_every_figure_is_printed() -> None:
    lab = unavailable_reason() is None
    argv = [sys.executable, str(ROOT / "bench" / "punch.py"), "--mib", "1", "--reps", "1"]
    # One trial of one pair, each side beaming 256 KiB over 0.3 s (the bench's 1 MiB over
    # 1.5 s only keeps the beams open longer: they stay open until the punch settles).
    argv += ["--trials", "1", "--pair", "eim/open", "--trial-kib", "256",
             "--trial-seconds", "0.3"] if lab else ["--skip-lab"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "punch", record
        figures[(record["metric"], record.get("pair"))] = record
    for path in ("direct", "punched", "relayed"):
        assert figures[(f"{path}_throughput", None)]["value"] > 0
    assert figures[("punched_throughput", None)]["ratio_to_direct"] > 0
    if lab:
        assert figures[("direct_rate", "eim/open")]["value"] == 1.0
        assert figures[("intact_rate", "eim/open")]["value"] == 1.0
        assert figures[("time_to_direct_p50", "eim/open")]["value"] >= 0
