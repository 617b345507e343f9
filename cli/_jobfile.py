"""``cosmicac jobs create -f FILE``: a job file (YAML or JSON, ``-`` for stdin) read
into the body of ``POST /api/jobs``.

A file holds either form, told apart by a ``spec`` mapping:

- the create body itself: ``name``, ``type``, ``image``, ``gpus``, ``replicas``,
  ``runtime``, ``model``, ``served_name``, ``location``, ``runtime_settings``,
  ``isolated_network``, ``team_id`` (the API's ``JobIn``);
- a job document as ``jobs get JOB -o yaml|json`` prints it (or ``jobs create
  --dry-run -o yaml``): its ``name``, ``type`` and ``spec`` are taken (``spec.team``
  becomes ``team_id``), what only the server sets is ignored: the read-only
  fields (``id``, ``status``, ``reason``, ``created_by``, ``created_at``,
  ``deleted_at``, ``rack``, ``replicas``, ``model_health``, ``agents_heard_at``;
  ``team`` where ``spec.team`` says the same) and the spec's ``authorized_keys``
  (the team members' CLI keys when the job is created) and ``model_settings``
  (copied from the model's master when the job is created: the copy gets the
  master's settings of now).

Nothing is dropped silently: a field neither form has is an error naming it
(and its line, from YAML's parser), as is a key given twice, ``name``/``type``/
``team`` saying one thing at the top and another in ``spec``, an alias (a job
file needs none; aliases can make a small file a huge document), a file
over :data:`MAX_FILE_BYTES`, text that is not UTF-8, or a document that is not a
mapping. Values are checked with the contract's own bounds (``contracts.model.
JobSpec``'s fields) and exact types (``gpus: "2"`` is text, not a number), so a
typo is reported with its line before any request; the API still checks what
only it can (a model master's defaults, the image default, a container job with
a model) and its 422 names the field.

YAML is read with PyYAML's safe loader only: ``yaml.safe_load`` for the values and
``yaml.compose(text, Loader=yaml.SafeLoader)`` for the lines of keys (composing
builds nodes, never objects). This module is imported only on the ``-f`` and
``--dry-run`` paths, so ``jobs create`` without them loads neither YAML nor
pydantic for it. :func:`print_preview` prints ``--dry-run``'s answer.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, BinaryIO, Literal, TextIO

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr, ValidationError
from pydantic import Field as PydanticField

from contracts.model import IMAGE_PATTERN, JobSpec, JobType, Runtime
from contracts.runtime_settings import RuntimeSettings

__all__ = ["BODY_FIELDS", "DOCUMENT_FIELDS", "MAX_FILE_BYTES", "SPEC_FIELDS", "JobFileError",
           "ask_preview", "body_of", "load", "parse", "print_preview", "read"]

#: A job file is a few hundred bytes; past this it is refused before parsing.
MAX_FILE_BYTES = 1 << 20

#: The create body's fields (``nodes/app_node/api/_models.JobIn``; a test keeps them equal).
BODY_FIELDS = ("name", "type", "image", "gpus", "replicas", "runtime", "model", "served_name",
               "location", "runtime_settings", "isolated_network", "team_id")
#: A job document's top-level fields (``JobOut``; a test keeps them equal).
DOCUMENT_FIELDS = ("id", "team", "name", "type", "status", "reason", "created_by",
                   "created_at", "deleted_at", "rack", "replicas", "spec", "model_health",
                   "agents_heard_at")
#: A document's spec fields (``contracts.model.JobSpec``; a test keeps them equal).
SPEC_FIELDS = ("name", "team", "type", "image", "gpus", "replicas", "runtime", "model",
               "served_name", "authorized_keys", "location", "runtime_settings",
               "model_settings", "isolated_network")
#: Spec fields only the server sets: ignored when a document is read back.
_SPEC_READ_ONLY = frozenset({"authorized_keys", "model_settings"})
#: Spec fields a document may also have at its top (the top one wins when equal).
_BOTH = {"name": "name", "type": "type", "team": "team_id"}

Path = tuple[str | int, ...]


class JobFileError(Exception):
    """What is wrong with a job file: ``message`` is the whole one-line error,
    ``FILE[:LINE]: field: what is wrong``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def load(name: str, stdin: BinaryIO) -> dict[str, Any]:
    """The create body of the job file ``name`` (``-``: ``stdin``), checked.

    Raises:
        JobFileError: what is wrong, as ``FILE[:LINE]: field: what``.
    """
    document, lines = parse(read(name, stdin), name)
    return body_of(document, name, lines)


# -- reading ------------------------------------------------------------------------


def read(name: str, stdin: BinaryIO) -> str:
    """The text of the file ``name`` (``-``: ``stdin``), at most :data:`MAX_FILE_BYTES`.

    Raises:
        JobFileError: it cannot be read, is too large or is not UTF-8.
    """
    try:
        if name == "-":
            raw = stdin.read(MAX_FILE_BYTES + 1)
        else:
            with open(name, "rb") as file:
                raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise JobFileError(f"{_label(name)}: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise JobFileError(f"{_label(name)}: larger than {MAX_FILE_BYTES // (1 << 20)} MiB; "
                           "a job file is a few hundred bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JobFileError(f"{_label(name)}: not UTF-8 text (byte {exc.start})") from None


def _label(name: str) -> str:
    return "stdin" if name == "-" else name


# -- parsing ------------------------------------------------------------------------


def parse(text: str, name: str) -> tuple[dict[str, Any], Any]:
    """The file's mapping, and what finds a key's line in it (None for JSON).

    JSON when the text starts with ``{`` (after blanks), else YAML.

    Raises:
        JobFileError: not JSON/YAML, several documents, duplicate keys, anchors or
            aliases, non-text keys, or not a mapping.
    """
    label = _label(name)
    if text.lstrip().startswith("{"):
        try:
            document = json.loads(text, object_pairs_hook=_unique_pairs)
        except _DuplicateKey as exc:
            raise JobFileError(f"{label}: {exc.key}: given twice") from None
        except ValueError as exc:  # json.JSONDecodeError
            raise JobFileError(f"{label}: not valid JSON: {exc}") from None
        except RecursionError:
            raise JobFileError(f"{label}: nested too deeply for a job file") from None
        lines = None
    else:
        import yaml  # here: only -f pays for it

        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
            lines = _Lines(root, label)
            document = yaml.safe_load(text)
        except yaml.MarkedYAMLError as exc:
            where = f":{exc.problem_mark.line + 1}" if exc.problem_mark else ""
            what = "; ".join(part for part in (exc.context, exc.problem) if part)
            raise JobFileError(f"{label}{where}: not valid YAML: {what or exc}") from None
        except yaml.YAMLError as exc:
            raise JobFileError(f"{label}: not valid YAML: {exc}") from None
        except RecursionError:
            raise JobFileError(f"{label}: nested too deeply for a job file") from None
    if not isinstance(document, dict):
        what = "empty" if document is None else f"a {_kind(document)}"
        raise JobFileError(f"{label}: a job file holds one mapping (name: ..., type: ...), "
                           f"this one is {what}")
    return document, lines


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise _DuplicateKey(key)
        found[key] = value
    return found


def _kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number",
            bool: "boolean"}.get(type(value), type(value).__name__)


class _Lines:
    """Where each key of a composed YAML document is (1-based lines), by its path;
    refuses what :func:`yaml.safe_load` would take silently: a key given twice (the
    last wins there), a key that is not text, an anchor or alias."""

    def __init__(self, root: Any, label: str) -> None:
        self.label = label
        self.at: dict[Path, int] = {}
        if root is not None:
            self._walk(root, (), set())

    def _walk(self, node: Any, path: Path, seen: set[int]) -> None:
        import yaml

        if id(node) in seen:
            # An alias is the anchored node again: stop at once (an alias bomb
            # would otherwise be walked exponentially often).
            line = self.line(path) or node.start_mark.line + 1
            raise JobFileError(f"{self.label}:{line}: {_dotted(path) or 'the document'}: "
                               "aliases (*name) are not accepted in a job file")
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[str] = set()
            for key, value in node.value:
                if not isinstance(key, yaml.ScalarNode) or key.tag != "tag:yaml.org,2002:str":
                    raise JobFileError(f"{self.label}:{key.start_mark.line + 1}: "
                                       f"{_dotted(path) + ': ' if path else ''}keys are "
                                       "field names (text)")
                if key.value in keys:
                    raise JobFileError(f"{self.label}:{key.start_mark.line + 1}: "
                                       f"{_dotted((*path, key.value))}: given twice")
                keys.add(key.value)
                self.at[(*path, key.value)] = key.start_mark.line + 1
                self._walk(value, (*path, key.value), seen)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.at[(*path, index)] = item.start_mark.line + 1
                self._walk(item, (*path, index), seen)

    def line(self, path: Path) -> int | None:
        """The line of ``path``, or of its nearest parent the file has."""
        while path:
            if path in self.at:
                return self.at[path]
            path = path[:-1]
        return None


def _dotted(path: Iterable[str | int]) -> str:
    return ".".join(str(part) for part in path)


# -- checking -----------------------------------------------------------------------


def _bounded(field: str, base: Any) -> Any:
    """``base`` (an exact type) with JobSpec's bounds of ``field``, or None."""
    return Annotated[base, *JobSpec.model_fields[field].metadata] | None


_TYPES = tuple(t.value for t in JobType)
_RUNTIMES = tuple(r.value for r in Runtime)


class _Body(BaseModel):
    """The create body as a file may give it: every field optional (an option may
    give it), exact types, the contract's bounds."""

    model_config = ConfigDict(extra="forbid")

    name: _bounded("name", StrictStr) = None  # type: ignore[valid-type]
    type: Literal[_TYPES] | None = None  # type: ignore[valid-type]
    image: Annotated[StrictStr, PydanticField(max_length=512,
                                              pattern=IMAGE_PATTERN.pattern)] | None = None
    gpus: _bounded("gpus", StrictInt) = None  # type: ignore[valid-type]
    replicas: _bounded("replicas", StrictInt) = None  # type: ignore[valid-type]
    runtime: Literal[_RUNTIMES] | None = None  # type: ignore[valid-type]
    model: _bounded("model", StrictStr) = None  # type: ignore[valid-type]
    served_name: _bounded("served_name", StrictStr) = None  # type: ignore[valid-type]
    location: _bounded("location", StrictStr) = None  # type: ignore[valid-type]
    runtime_settings: RuntimeSettings | None = None
    isolated_network: StrictBool | None = None
    team_id: Annotated[StrictStr, PydanticField(min_length=1, max_length=64)] | None = None


def _problem(error: Mapping[str, Any]) -> str:
    """One pydantic error in a job file's words."""
    kind, context = error["type"], error.get("ctx") or {}
    value = error.get("input")
    shown = ""
    if isinstance(value, str | int | float | bool):
        text = json.dumps(value, ensure_ascii=False)
        shown = f", not {text}" if len(text) <= 40 else ""
    if kind in ("int_type", "int_parsing", "greater_than_equal", "less_than_equal"):
        field = error["loc"][0] if error["loc"] else ""
        bounds = {m.__class__.__name__: m for m in JobSpec.model_fields[field].metadata} \
            if field in JobSpec.model_fields else {}
        low = getattr(bounds.get("Ge"), "ge", None)
        high = getattr(bounds.get("Le"), "le", None)
        if low is not None and high is not None:
            return f"must be an integer ≥ {low} and ≤ {high}{shown}"
        return f"must be an integer{shown}"
    if kind == "string_type":
        return f"must be text (in YAML, quote it){shown}"
    if kind == "bool_type":
        return f"must be true or false{shown}"
    if kind == "literal_error":
        return f"must be {context.get('expected', 'one of the listed values')}{shown}"
    if kind == "extra_forbidden":
        return "not a field of a job"
    if kind == "string_pattern_mismatch" and error["loc"] == ("image",):
        return "must be a registry image, docker://host[:port]/repo[:tag]" + shown
    message = str(error["msg"]).removeprefix("Value error, ")
    return message[:1].lower() + message[1:] + shown


def body_of(document: Mapping[str, Any], name: str, lines: Any = None) -> dict[str, Any]:
    """The create body of a parsed job file (either form: see the module).

    Args:
        document: the file's mapping (:func:`parse`).
        name: the file's name as given (``-``: stdin), for messages.
        lines: :func:`parse`'s line finder (None: no lines in messages).

    Returns:
        The fields the file gives, checked; a field it leaves out is absent.

    Raises:
        JobFileError: ``FILE[:LINE]: field: what is wrong``.
    """
    label = _label(name)

    def error(path: Path, message: str) -> JobFileError:
        line = lines.line(path) if lines is not None else None
        where = f"{label}:{line}" if line else label
        return JobFileError(f"{where}: {_dotted(path)}: {message}")

    spec = document.get("spec")
    if spec is None:
        origin: dict[str, Path] = {key: (key,) for key in document}
        for key in document:
            if key not in BODY_FIELDS:
                raise error((key,), _unknown(key, BODY_FIELDS, DOCUMENT_FIELDS))
        body = dict(document)
    else:
        body, origin = _from_document(document, error)
    try:
        checked = _Body.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        path = (*origin.get(str(loc[0]), (str(loc[0]),)), *loc[1:]) if loc else ()
        raise error(path, _problem(first)) from None
    return checked.model_dump(exclude_unset=True, mode="json")


def _from_document(document: Mapping[str, Any], error: Any
                   ) -> tuple[dict[str, Any], dict[str, Path]]:
    """A job document's body: its name, type and spec; the read-only fields left."""
    for key in document:
        if key not in DOCUMENT_FIELDS:
            raise error((key,), _unknown(key, DOCUMENT_FIELDS, BODY_FIELDS))
    spec = document["spec"]
    if not isinstance(spec, dict):
        raise error(("spec",), f"must be a mapping of the job's fields, not a {_kind(spec)}")
    body: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    for key, value in spec.items():
        if key not in SPEC_FIELDS:
            raise error(("spec", key), _unknown(key, SPEC_FIELDS, ()))
        if key in _SPEC_READ_ONLY:
            continue
        field = _BOTH.get(key, key)
        body[field], origin[field] = value, ("spec", key)
    for key, field in _BOTH.items():
        if key not in document:
            continue
        if field in body and body[field] != document[key]:
            raise error(origin[field], f"says {body[field]!r} and the document's {key} "
                                       f"says {document[key]!r}; keep one")
        body[field], origin[field] = document[key], (key,)
    return body, origin


def _unknown(key: str, fields: tuple[str, ...], other: tuple[str, ...]) -> str:
    hint = ""
    if key in other:
        hint = (" (a job document's field: a document has a spec mapping)"
                if "spec" in other else " (a create body's field: in a job document it "
                "goes under spec)")
    return f"not a field of a job file{hint}; the fields are {', '.join(fields)}"


# -- --dry-run ----------------------------------------------------------------------


def ask_preview(api: Any, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /api/jobs?dry_run=true``: the would-be job, nothing created.

    An app-node older than ``dry_run`` ignores the query and creates the job (its
    answer has an ``id``): it is deleted again at once and the command fails, so a
    dry run never leaves a job behind.
    """
    from urllib.parse import quote

    from ._console import fail

    preview = api.request("POST", "/jobs", json_body=body, params={"dry_run": "true"})
    if isinstance(preview, dict) and "id" in preview:
        job = str(preview["id"])
        api.request("DELETE", f"/jobs/{quote(job, safe='')}")
        fail(f"the server at {api.server} is older than --dry-run and created job {job}; "
             "it was deleted again. Upgrade app-node for dry runs")
    return preview


def print_preview(shown: Any, preview: dict[str, Any], stream: TextIO | None = None) -> None:
    """``jobs create --dry-run``: the server's would-be job (``POST /api/jobs?dry_run=true``)
    as its document (``-o json|yaml``), or as a job table, a replica table and what
    would happen, on stdout.

    Args:
        shown: the command's :class:`~cli._output.Output`.
        preview: the API's answer (``JobPreviewOut``).
    """
    from contracts.labels import status_label

    from ._output import Column, emit

    stream = stream or sys.stdout
    if shown.is_document or shown.mode == "name":
        emit(shown, preview, names=[preview["name"]], stream=stream)
        return
    spec = preview["spec"]
    runs = f"{spec['runtime']}:{spec['model']}" if spec.get("model") else spec["image"]
    emit(shown, preview, (Column("name", cut=True), Column("type", drop=4),
                          Column("team", drop=3), Column("gpus"), Column("replicas"),
                          Column("runs", cut=True, drop=2), Column("location", drop=1)),
         [(preview["name"], preview["type"], preview["team"], spec["gpus"], spec["replicas"],
           runs, spec["location"])], stream=stream)
    stream.write("\n")
    status = preview["status"]
    emit(shown, preview, (Column("replica"), Column("would be"), Column("nodes", cut=True)),
         [(r["index"], status_label(r["status"]) if status else "Unknown",
           ", ".join(f"{node} ({gpus} GPU{'s' if gpus > 1 else ''})"
                     for node, gpus in zip(r["nodes"], r["gpus"], strict=False)) or "-")
          for r in preview["replicas"]], stream=stream)
    if status == "starting":
        verdict = f"it would start now on rack {preview['rack']}"
    elif status == "pending":
        verdict = f"it would wait (Pending): {preview['reason']}"
    elif status == "failed":
        verdict = f"it would fail: {preview['reason']}"
    else:
        verdict = preview["reason"] or "placement unknown"
    stream.write(f"\ndry run, nothing created: {verdict}\n")
    stream.flush()
