"""What pages show, computed without I/O: status names as the seeds name them, ages,
and the API's errors tied to form fields."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from contracts.labels import age_label, heard_label, status_label

__all__ = ["JOB_FIELDS", "FormErrors", "age", "form_field", "job_body", "job_form", "job_row",
           "job_view", "status_label"]

#: The new-job form's fields, in the order it shows them.
JOB_FIELDS = ("type", "name", "runtime", "model", "served_name", "server_args", "server_env",
              "image", "gpus", "replicas", "location")
_NUMBERS = ("gpus", "replicas")
#: The fields a job of each type sends (the API's own rules do the rest).
_SENT = {"inference": ("name", "runtime", "model", "served_name", "image", "gpus",
                       "replicas", "location"),
         "container": ("name", "image", "gpus", "location")}
#: The API's names of the fields the form shows under other names.
_FORM_FIELD = {"runtime_settings": "server_args", "runtime_settings.args": "server_args",
               "runtime_settings.env": "server_env"}


def form_field(api_field: str | None) -> str | None:
    """The new-job form's field an API error names."""
    return _FORM_FIELD.get(api_field or "", api_field)

#: A short age: ``45s``, ``12m``, ``3h``, ``5d`` (the CLI's too).
age = age_label


def job_row(job: dict[str, Any], now: float) -> dict[str, Any]:
    """A job of the API as a row of the jobs list shows it."""
    spec = job.get("spec") or {}
    return {**job, "status_label": status_label(job["status"]),
            "gpus": int(spec.get("gpus", 0)) * int(spec.get("replicas", 1)),
            "age": age(now - float(job["created_at"])),
            "heard": heard_label(job.get("agents_heard_at"), now)}


def job_view(job: dict[str, Any], now: float) -> dict[str, Any]:
    """A job of the API as its page shows it: the row's fields, its creation time and
    each replica's status named."""
    created = datetime.fromtimestamp(float(job["created_at"]), tz=UTC)
    return {**job_row(job, now), "created_iso": created.isoformat(timespec="seconds"),
            "replicas": [{**replica, "status_label": status_label(replica["status"])}
                         for replica in job.get("replicas", ())]}


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


def job_body(form: dict[str, str]) -> tuple[dict[str, Any], FormErrors]:
    """The API's ``POST /jobs`` body from the new-job form, and what is wrong with it
    before asking (a type to choose, numbers that are not numbers). An empty field
    is left out: the model's default (or the API's) applies."""
    errors = FormErrors()
    known = frozenset(JOB_FIELDS)
    kind = form.get("type", "")
    if kind not in _SENT:
        errors.add("choose Managed inference or GPU container", "type", known)
        return {}, errors
    body: dict[str, Any] = {"type": kind}
    for name in _SENT[kind]:
        value = form.get(name, "").strip()
        if not value:
            continue
        if name in _NUMBERS:
            if not value.isdigit() or len(value) > 6:
                errors.add(f"{name}: a whole number, like 1", name, known)
                continue
            body[name] = int(value)
        else:
            body[name] = value
    if kind == "inference":
        settings = _runtime_settings(form, errors, known)
        if settings:
            body["runtime_settings"] = settings
    if "name" not in body and not errors.fields.get("name"):
        errors.add("name: give the job a name", "name", known)
    return body, errors


def _runtime_settings(form: dict[str, str], errors: FormErrors,
                      known: frozenset[str]) -> dict[str, Any]:
    """The model server's arguments and environment, written as on a shell's command
    line (``--max-model-len 4096``; ``NAME=value OTHER='a b'``)."""
    settings: dict[str, Any] = {}
    try:
        args = shlex.split(form.get("server_args", ""))
    except ValueError as exc:
        errors.add(f"server arguments: {exc} (quote as in a shell)", "server_args", known)
        args = []
    if args:
        settings["args"] = args
    try:
        pairs = shlex.split(form.get("server_env", ""))
    except ValueError as exc:
        errors.add(f"server environment: {exc} (quote as in a shell)", "server_env", known)
        pairs = []
    env = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            errors.add(f"server environment: {pair!r} is not NAME=value", "server_env", known)
            break
        env[name] = value
    if env:
        settings["env"] = env
    return settings


def job_form(job: dict[str, Any] | None) -> dict[str, str]:
    """The new-job form's values: empty, or every field of ``job`` (Duplicate) with a
    new name."""
    if job is None:
        return {**dict.fromkeys(JOB_FIELDS, ""), "type": "inference"}
    spec = job.get("spec") or {}
    values = {name: "" if spec.get(name) is None else str(spec[name]) for name in JOB_FIELDS}
    values["type"] = str(spec.get("type", job.get("type", "inference")))
    values["name"] = f"{job.get('name', 'job')}-copy"[:100]
    settings = spec.get("runtime_settings") or {}
    values["server_args"] = shlex.join(settings.get("args") or ())
    values["server_env"] = " ".join(shlex.quote(f"{name}={value}")
                                    for name, value in (settings.get("env") or {}).items())
    return values
