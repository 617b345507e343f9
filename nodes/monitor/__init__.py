"""wrk-monitor: job logs live and from history, metrics for Prometheus (issue 14)."""
