"""Smoke test of bench/admission.py: a small flood in every leg prints every
figure (as ``make bench`` runs it: a subprocess, JSON lines on stdout), and
the configured peer got in every time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_every_figure_is_printed_and_the_peer_always_gets_in() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "admission.py"), "--sockets", "300",
         "--churn-sockets", "100", "--keys", "30", "--tries", "3", "--limit-s", "60",
         # The peer starts 0.2 s into the one-byte flood (the bench waits a second).
         "--bytes-lead-s", "0.2"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    figures: dict[tuple[str, str], float] = {}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        assert record["bench"] == "admission", record
        figures[record["leg"], record["metric"]] = record["value"]
    for leg in ("hold", "churn", "bytes"):
        for metric in ("peer_connect_ms_first", "peer_connect_ms_p50", "peer_connect_ms_max",
                       "stranger_sockets_opened", "stranger_keys_held", "refused_evicted"):
            assert figures[leg, metric] > 0, (leg, metric)
        assert figures[leg, "peer_connect_failures"] == 0, leg
        assert figures[leg, "peer_connect_ms_p50"] <= figures[leg, "peer_connect_ms_max"]
        # The reserve is no stranger's: 64 slots, 16 kept, 24 per address.
        assert figures[leg, "stranger_keys_held"] <= 48
