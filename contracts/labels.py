"""What a person reads for a status of the API, as the seeds name them. Free of
imports, so the CLI's tables name statuses without loading the models."""

from __future__ import annotations

__all__ = ["age_label", "heard_label", "status_label"]


def status_label(api_value: str) -> str:
    """A job's or a replica's status of the API as text: ``running`` is Active (the API
    keeps its value, contracts.model.api_status), ``queued`` Queued (the web UI and
    the CLI's tables)."""
    value = "active" if api_value == "running" else api_value
    return value.replace("_", " ").capitalize() if value else "Unknown"


def age_label(seconds: float) -> str:
    """A short age: ``45s``, ``12m``, ``3h``, ``5d`` (whole units, rounded down)."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def heard_label(heard_at: float | None, now: float) -> str:
    """A job's "last heard from its agents" (``agents_heard_at``): ``12s ago``, or ``-``
    when unknown (no agent yet, no wrk-monitor, an older server)."""
    return "-" if heard_at is None else f"{age_label(now - heard_at)} ago"
