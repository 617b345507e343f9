"""``cosmicac status``: the control plane's health now and over the last hour (operators only).

One table from ``GET /api/health``: each service app-node watches (wrk-ork,
wrk-monitor when configured, the shared database's replica, app-node itself,
its email), whether it answers now, its version, queue depth, how long ago it
last heard from what reports to it, the probe's latency, and over the last
hour its uptime and a sparkline of twelve 5-minute slices (▁ all down … █ all
up, · no probe). Ages are measured on app-node's clock, not this machine's.
``-o json`` prints the API's answer as it is.

The exit code says whether the question was answered, not how healthy the
platform is: read ``status`` in the JSON (``ok``, ``degraded``, ``unknown``).
"""

from __future__ import annotations

import sys
from typing import Any

from contracts.labels import heard_label

from ._console import out
from ._help import add_note
from ._output import Column, Output, no_headers_option, query_option
from .session import EXIT_CODES_HELP, api_for, emit, output_option, server_option

__all__ = ["age", "sparkline", "status"]

_BLOCKS = "▁▂▃▄▅▆▇█"
_ASCII = "_.-=#"


def sparkline(buckets: list[float | None], *, ascii_only: bool = False) -> str:
    """One character per bucket: its share of probes up; ``·`` (``?``) without a probe."""
    steps = _ASCII if ascii_only else _BLOCKS
    empty = "?" if ascii_only else "·"
    return "".join(empty if b is None else steps[round(b * (len(steps) - 1))]
                   for b in buckets)


def age(then: float | None, now: float) -> str:
    """``then`` as a short age before ``now`` (``-`` for none)."""
    return heard_label(then, now)


def _ascii_terminal() -> bool:
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower()
    return "utf" not in encoding


def _row(service: dict[str, Any], now: float, ascii_only: bool) -> tuple:
    last = service["last"] or {}
    hour = service["last_hour"]
    reachable = {"up": "yes", "error": "yes (refused)", "down": "no",
                 "stale": "stale", "unknown": "not probed yet"}.get(service["state"],
                                                                    service["state"])
    latency = last.get("latency_ms")
    uptime = hour["uptime"]
    return (service["service"], reachable, last.get("version") or "-",
            "-" if last.get("queue_depth") is None else last["queue_depth"],
            age(last.get("last_report_at"), now),
            "-" if latency is None else f"{latency:.0f} ms",
            "-" if uptime is None else f"{uptime * 100:.1f}%",
            f"{hour['up']}/{hour['down']}",
            sparkline(hour["buckets"], ascii_only=ascii_only),
            last.get("error") or "")


_COLUMNS = (Column("service"), Column("reachable"), Column("version", drop=3),
            Column("queue", drop=5), Column("last report", drop=4), Column("latency", drop=6),
            Column("uptime 1h", drop=2), Column("up/down", drop=7), Column("last hour", drop=1),
            Column("error", cut=True))


def status(server: str | None = server_option(), output: str = output_option(),
           no_headers: bool = no_headers_option(),
           query: str | None = query_option()) -> None:
    """The control plane's health: each service now and over the last hour.

    Example: cosmicac status -o json
    """
    shown = Output.of(output, no_headers, query)
    health = api_for(server).get("/health")
    ascii_only = _ascii_terminal()
    rows = [_row(s, health["at"], ascii_only) for s in health["services"]]
    if output == "table":
        out.print(f"control plane: {health['status']} (probed every "
                  f"{health['interval_s']:g} s)")
    emit(shown, health, _COLUMNS, rows)


add_note((status,), EXIT_CODES_HELP)
