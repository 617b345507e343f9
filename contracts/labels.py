"""What a person reads for a status of the API, as the seeds name them. Free of
imports, so the CLI's tables name statuses without loading the models."""

from __future__ import annotations

__all__ = ["status_label"]


def status_label(api_value: str) -> str:
    """A job's or a replica's status of the API as text: ``running`` is Active (the API
    keeps its value, contracts.model.api_status), ``queued`` Queued (the web UI and
    the CLI's tables)."""
    value = "active" if api_value == "running" else api_value
    return value.replace("_", " ").capitalize() if value else "Unknown"
