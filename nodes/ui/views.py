"""What pages show, computed without I/O: status names as the seeds name them, ages,
and the API's errors tied to form fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from contracts.model import JobStatus

__all__ = ["FormErrors", "age", "job_row", "status_label"]

#: The API reports Active as ``running`` (contracts.model.api_status).
_API_ALIASES = {"running": JobStatus.ACTIVE.value}


def status_label(api_status: str) -> str:
    """``running`` → ``Active``, ``queued`` → ``Queued``: the seeds' names, as text."""
    value = _API_ALIASES.get(api_status, api_status)
    return value.replace("_", " ").capitalize() if value else "Unknown"


def age(seconds: float) -> str:
    """A short age: ``45s``, ``12m``, ``3h``, ``5d``."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def job_row(job: dict[str, Any], now: float) -> dict[str, Any]:
    """A job of the API as a row of the jobs list shows it."""
    spec = job.get("spec") or {}
    return {**job, "status_label": status_label(job["status"]),
            "gpus": int(spec.get("gpus", 0)) * int(spec.get("replicas", 1)),
            "age": age(now - float(job["created_at"]))}


@dataclass
class FormErrors:
    """A form's errors: per field (tied to it with ``aria-describedby``) and for the
    whole form (the focused summary)."""

    fields: dict[str, str] = field(default_factory=dict)
    form: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.fields or self.form)

    def add(self, message: str, field_name: str | None, known: frozenset[str]) -> None:
        """``message`` on ``field_name`` if the form has that field, else on the form."""
        if field_name is not None and field_name in known:
            self.fields[field_name] = message
        else:
            self.form.append(message)

    def summary(self) -> list[str]:
        return [*self.form, *self.fields.values()]
