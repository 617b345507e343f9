"""The agent's own figures, sent with each heartbeat: cheap, O(1), off the request path.

Every heartbeat (``contracts.agent_report.Heartbeat.metrics``) carries a
snapshot built when it is sent, from counters the agent and its workload
already keep; nothing here runs on a request or a shell's keystroke. The
worker labels them with the VMI's job, replica and node rank and forwards
them to wrk-monitor, which shows ``cosmicac_agent_<name>``.

========================================  =========================================
name                                      what
========================================  =========================================
``process_resident_memory_bytes``         the agent's RSS (``/proc/self/statm``;
                                          peak RSS from ``getrusage`` elsewhere)
``process_cpu_seconds_total``             user + system CPU of the agent process
``uptime_seconds``                        since the agent started
``report_sessions_total``                 sessions with the worker that said hello
========================================  =========================================

A workload adds its own (``Workload.metrics()``, optional): the inference
workload its model server's up, restarts, failures and probe latency and
the calls it serves; the container job's shell service its sessions. A name
ending in ``_total`` is a counter, any other a gauge.
"""

from __future__ import annotations

import math
import os
import re
import resource
import sys
import time
from collections.abc import Callable, Mapping

from contracts.agent_report import MAX_AGENT_METRICS

__all__ = ["MetricsSource", "clean", "process_metrics"]

#: ``() -> {name: value}``: a workload's figures now (synchronous, O(1)).
MetricsSource = Callable[[], Mapping[str, float]]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STARTED = time.monotonic()
#: ``contracts.agent_report.MetricName``'s pattern.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")


def _rss_bytes() -> float:
    """Resident memory now: ``/proc/self/statm`` (Linux), else peak RSS from getrusage."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(peak if sys.platform == "darwin" else peak * 1024)


def process_metrics(started: float = _STARTED) -> dict[str, float]:
    """The agent process's memory, CPU and uptime (a few syscalls)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "process_resident_memory_bytes": _rss_bytes(),
        "process_cpu_seconds_total": usage.ru_utime + usage.ru_stime,
        "uptime_seconds": max(0.0, time.monotonic() - started),
    }


def clean(values: Mapping[str, float]) -> dict[str, float]:
    """``values`` within ``Heartbeat.metrics``' bounds: non-finite or negative
    figures and bad names left out, at most :data:`MAX_AGENT_METRICS` kept (the
    first ones), so one odd figure never costs the heartbeat itself."""
    out: dict[str, float] = {}
    for name, value in values.items():
        if len(out) >= MAX_AGENT_METRICS:
            break
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if (math.isfinite(value) and 0 <= value <= 2.0**63 and type(name) is str
                and _NAME.fullmatch(name)):
            out[name] = value
    return out
