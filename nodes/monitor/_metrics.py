"""``/metrics`` of wrk-monitor's own work: its buffer, its followers and its Loki pushes.

Read on each scrape from plain integers the service and the Loki holder keep
(:mod:`nodes.kit.metrics`), so a scrape never races the ingestion.
"""

from __future__ import annotations

from nodes.kit.metrics import Family, Snapshot

from .loki import LokiPusherStatistics
from .observability import ObservabilityHolder
from .service import MonitorService

__all__ = ["monitor_snapshot"]


def monitor_snapshot(service: MonitorService,
                     loki: ObservabilityHolder | LokiPusherStatistics | None) -> Snapshot:
    """The counters ``/metrics`` shows (read on each scrape: plain integers).

    The Loki counters are summed over every Loki in force so far (they never go
    back on a swap) and shown whenever a holder is given, at 0 before any Loki.
    """
    stats = service.buffer.stats
    families = {
        "monitor_records_received": Family("Records accepted into the buffer",
                                           stats.received, counter=True),
        "monitor_records_evicted": Family("Records evicted from the buffer by its bounds",
                                          stats.evicted, counter=True),
        "monitor_followers_lagged": Family("Followers cut off for falling behind",
                                           stats.followers_lagged, counter=True),
        "monitor_bad_batches": Family("Pushed batches refused as malformed",
                                      service.bad_batches, counter=True),
        "monitor_buffer_records": Family("Records in the buffer", stats.records),
        "monitor_buffer_bytes": Family("Estimated bytes in the buffer", stats.bytes),
        "monitor_followers": Family("Followers attached (RPC and HTTP)",
                                    service.buffer.followers),
    }
    if loki is not None:
        stats_loki = loki if isinstance(loki, LokiPusherStatistics) else loki.statistics()
        families.update({
            "monitor_loki_pushed": Family("Records Loki accepted", stats_loki.pushed, counter=True),
            "monitor_loki_failed": Family("Records given up after retries", stats_loki.failed,
                                          counter=True),
            "monitor_loki_dropped": Family("Records dropped while Loki was behind (or cut "
                                           "when a replaced Loki's grace ran out)",
                                           stats_loki.dropped, counter=True),
            "monitor_loki_rejected": Family("Records Loki refused (4xx)", stats_loki.rejected,
                                            counter=True),
            "monitor_loki_retries": Family("Pushes retried", stats_loki.retries, counter=True),
            "monitor_loki_buffered": Family("Records waiting for Loki", stats_loki.buffered),
        })
    return Snapshot(families=families)
