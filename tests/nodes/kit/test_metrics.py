"""Daemon metrics come from a snapshot: labelled gauges and counters in Prometheus text."""

from __future__ import annotations

from prometheus_client import generate_latest

from nodes.kit.metrics import Family, Snapshot, snapshot_registry


def test_a_scrape_shows_the_latest_snapshot_with_labels_and_counters():
    current = Snapshot({"ork_jobs": Family("Jobs by status", {"active": 2, "pending": 1},
                                           "status"),
                        "ork_outbox": Family("Unpublished operations", 3)})
    registry = snapshot_registry(lambda: current)
    text = generate_latest(registry).decode()
    assert 'ork_jobs{status="active"} 2.0' in text
    assert 'ork_jobs{status="pending"} 1.0' in text
    assert "ork_outbox 3.0" in text
    current = Snapshot({"ork_reports": Family("Reports", {"applied": 5}, "outcome",
                                              counter=True)})
    text = generate_latest(registry).decode()
    assert "# TYPE ork_reports_total counter" in text or "# TYPE ork_reports counter" in text
    assert 'ork_reports_total{outcome="applied"} 5.0' in text
    assert "ork_jobs" not in text
