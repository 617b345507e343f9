"""Shell completion (bash, zsh, fish): the command the words name, and the values
the API knows: job ids, team names, model names, served names.

How a TAB runs: the shell's script (``cosmicac --show-completion``, typer's) starts
``cosmicac`` afresh with the words in its environment: bash's ``COMP_WORDS`` and
``COMP_CWORD``, zsh's and fish's ``_TYPER_COMPLETE_ARGS`` (the line up to the
cursor), ``_COSMICAC_COMPLETE`` saying which shell asks. ``cli.main.main`` reads the
words before the cursor with :func:`words_before_cursor` and builds only the command
they name (the index of commands while they name none), as a command's run does:
a TAB costs that command's imports, never the whole app's (about a second).

The values come from app-node with the saved session (:func:`cli.session.load_session`),
at most once per :data:`CACHE_TTL_S` per server and account: the answers are kept in
``<config dir>/cache/completion-<hash of server and email>.json`` (mode 0600: job and
team names are the team's business), with a hash of the token, so another login
asks afresh. A value typed that the kept answer lacks (a job created a moment ago)
asks again once the answer is :data:`RECHECK_S` old. A request's connection and
each of its reads wait :data:`REQUEST_TIMEOUT_S` at most; a server that failed is
not asked again until the TTL passes, so a TAB against a server that is down costs
the timeout once.

Silence: a completer never prints and never raises. Not logged in, an expired
session, a server down or refusing: no candidates (the shell falls back to file
names), exit 0. What the server sends is hostile to the shell that evaluates the
answer (zsh ``eval``\\s it): a value is offered only if made of
:data:`_SAFE_VALUE`'s characters (a team whose name is not is offered by its id),
and a description keeps printable characters other than quotes, backslashes,
``$``, backquotes and brackets, cut to :data:`_DESCRIPTION_CHARS`.

Where it falls short: jobs and served names are the active team's (one request; a
job of another team completes after ``cosmicac teams use``), the newest
:data:`_JOBS_ASKED` jobs; bash splits words at ``:`` (``COMP_WORDBREAKS``), so a
served name with a colon completes only up to it there.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CACHE_TTL_S", "RECHECK_S", "REQUEST_TIMEOUT_S", "Account", "CompletionCache",
           "choices", "container_job_ids", "job_ids", "model_names", "output_modes",
           "plain_descriptions", "served_names", "team_names", "words_before_cursor"]

#: How long an answer of the API is kept for the next TAB. kubectl and gh ask on every
#: TAB; a few seconds spare a user who presses TAB twice (bash lists on the second)
#: the second trip, and are short enough that a job created meanwhile soon shows.
CACHE_TTL_S = 10.0
#: A kept answer at least this old is asked again when nothing in it matches the word
#: typed (the job the user just created).
RECHECK_S = 2.0
#: One request's limit (connect, read...): a TAB must not hang on a server that is down.
REQUEST_TIMEOUT_S = 1.0
#: Jobs asked for (the newest first): one page of the API (at most 500).
_JOBS_ASKED = 200
#: An answer larger than this is not read (200 jobs are about 200 KB).
_MAX_ANSWER_BYTES = 8 << 20
#: What a value offered to the shell may hold: ids, model and served names are made
#: of these (contracts.model's patterns); anything else could be read by the shell.
_SAFE_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+=,\-]*")
#: Characters a description never holds (the shells' quoting, rich's markup).
_UNSAFE_IN_DESCRIPTION = re.compile(r"[\\\"'`$\[\]]")
_DESCRIPTION_CHARS = 60
_CACHE_VERSION = 1
#: ``-o``'s modes (cli._output.MODES) with what each prints.
_OUTPUT_MODES = {
    "table": "columns that fit the terminal",
    "wide": "the table with its extra columns",
    "json": "the API's document",
    "yaml": "the API's document as YAML",
    "name": "the ids, one per line",
}

#: The clock of the cache (tests move it).
clock: Callable[[], float] = time.time


# -- the words a shell passes -------------------------------------------------------


def words_before_cursor(environ: Mapping[str, str]) -> list[str] | None:
    """The words after ``cosmicac`` and before the one being completed, as typer's
    completion classes read them from ``environ``; None when no shell is asking."""
    from typer._click.shell_completion import split_arg_string

    if "COMP_WORDS" in environ:  # bash: every word, and the cursor's index
        try:
            cword = int(environ.get("COMP_CWORD", ""))
        except ValueError:
            return []
        return split_arg_string(environ["COMP_WORDS"])[1:cword]
    if "_TYPER_COMPLETE_ARGS" in environ:  # zsh, fish, PowerShell: the line up to the cursor
        line = environ["_TYPER_COMPLETE_ARGS"]
        words = split_arg_string(line)[1:]
        return words[:-1] if words and not line.endswith(" ") else words
    return None


def plain_descriptions() -> None:
    """Have typer hand the shells our descriptions as they are.

    zsh and fish show a description beside each candidate; typer renders each
    through rich first, to strip markup, which imports ``typer.rich_utils``: about
    80 ms, half of a zsh TAB. None of ours holds markup: the commands' help is
    plain text (``--help`` prints it as written) and the API's values pass
    :func:`describe`, which drops brackets. Call only when completing.
    """
    import typer._completion_classes as classes

    classes._sanitize_help_text = str


# -- the account and its cache ------------------------------------------------------


@dataclass(frozen=True)
class Account:
    """Where to ask and as whom: the saved session, on ``--server`` if given."""

    server: str
    token: str
    email: str

    @classmethod
    def current(cls, server_option: str | None) -> Account | None:
        """The session's account, or None when not logged in, expired or unusable."""
        import contextlib
        import io

        from .session import load_session

        # A contexts file that cannot be read, or an unknown --context, makes
        # load_session print its one line and exit: not on a TAB.
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                session = load_session()
        except SystemExit:
            return None
        if session is None or session.expires_at <= clock():
            return None
        server = (server_option or os.environ.get("COSMICAC_SERVER") or session.server)
        server = server.rstrip("/").removesuffix("/api")
        if not server.startswith(("http://", "https://")):
            return None
        return cls(server, session.token, session.email)

    def cache_path(self, config: Path) -> Path:
        import hashlib

        digest = hashlib.sha256(f"{self.server}\n{self.email}".encode()).hexdigest()[:16]
        return config / "cache" / f"completion-{digest}.json"

    def token_digest(self) -> str:
        import hashlib

        return hashlib.sha256(self.token.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Entry:
    """One kept answer: when it was asked, and its items (None: the request failed)."""

    at: float
    items: list[dict[str, str]] | None


class CompletionCache:
    """The answers kept for one account: a JSON file, replaced whole, mode 0600.

    An unreadable, foreign or other token's file reads as empty; a failed write is
    ignored (the next TAB asks again).
    """

    def __init__(self, path: Path, token_digest: str) -> None:
        self.path = path
        self._token = token_digest
        self._entries = self._read()

    def get(self, kind: str, now: float) -> Entry | None:
        """The answer of ``kind`` if younger than :data:`CACHE_TTL_S`."""
        entry = self._entries.get(kind)
        if entry is None or not 0 <= now - entry.at < CACHE_TTL_S:
            return None
        return entry

    def put(self, kind: str, items: list[dict[str, str]] | None, now: float) -> Entry:
        """Keep ``items`` as the answer of ``kind`` at ``now``, dropping expired ones."""
        from ._config import write_private

        entry = Entry(now, items)
        self._entries = {k: e for k, e in self._entries.items()
                         if 0 <= now - e.at < CACHE_TTL_S}
        self._entries[kind] = entry
        document = {"version": _CACHE_VERSION, "token": self._token,
                    "entries": {k: {"at": e.at, "items": e.items}
                                for k, e in self._entries.items()}}
        try:
            write_private(self.path, json.dumps(document))
        except OSError:
            pass
        return entry

    def _read(self) -> dict[str, Entry]:
        try:
            document = json.loads(self.path.read_bytes())
            if document.get("version") != _CACHE_VERSION or document.get("token") != self._token:
                return {}
            entries = {}
            for kind, entry in document["entries"].items():
                items = entry["items"]
                if items is not None and not all(
                        isinstance(item, dict) and all(isinstance(v, str)
                                                       for v in item.values())
                        for item in items):
                    continue
                entries[kind] = Entry(float(entry["at"]), items)
            return entries
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}


# -- asking the API -----------------------------------------------------------------


def _ask(account: Account, path: str, params: dict[str, str] | None = None) -> Any:
    """GET ``<server>/api<path>``'s JSON, or None on any failure (no line printed).

    Through :mod:`cli._http` (urllib), as the commands: an ``httpx.Client`` loads
    httpcore, which imports trio, about 0.4 s of a TAB."""
    from ._http import Unreachable, request

    try:
        answer = request("GET", f"{account.server}/api{path}", params=params,
                         headers={"authorization": f"Bearer {account.token}"},
                         timeout=REQUEST_TIMEOUT_S)
    except Unreachable:
        return None
    if answer.status != 200 or len(answer.body) > _MAX_ANSWER_BYTES:
        return None
    try:
        return answer.json()
    except ValueError:
        return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def fetch_jobs(account: Account) -> list[dict[str, str]] | None:
    """The active team's newest jobs: id, name, type, status, and the name requests
    use for an inference job (its served name, else its model)."""
    answer = _ask(account, "/jobs", {"limit": str(_JOBS_ASKED)})
    if not isinstance(answer, dict) or not isinstance(answer.get("jobs"), list):
        return None
    jobs = []
    for job in answer["jobs"]:
        if not isinstance(job, dict):
            continue
        spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
        serves = _text(spec.get("served_name")) or _text(spec.get("model"))
        jobs.append({"id": _text(job.get("id")), "name": _text(job.get("name")),
                     "type": _text(job.get("type")), "status": _text(job.get("status")),
                     "serves": serves if job.get("type") == "inference" else ""})
    return jobs


def fetch_teams(account: Account) -> list[dict[str, str]] | None:
    answer = _ask(account, "/teams")
    if not isinstance(answer, dict) or not isinstance(answer.get("teams"), list):
        return None
    return [{"id": _text(t.get("id")), "name": _text(t.get("name")),
             "role": _text(t.get("role"))} for t in answer["teams"] if isinstance(t, dict)]


def fetch_models(account: Account) -> list[dict[str, str]] | None:
    answer = _ask(account, "/models")
    if not isinstance(answer, dict) or not isinstance(answer.get("models"), list):
        return None
    return [{"name": _text(m.get("name")), "runtime": _text(m.get("runtime"))}
            for m in answer["models"] if isinstance(m, dict)]


#: What each kind of value is asked with.
FETCHERS: dict[str, Callable[[Account], list[dict[str, str]] | None]] = {
    "jobs": fetch_jobs, "teams": fetch_teams, "models": fetch_models,
}


# -- candidates: pure functions of the kept items ------------------------------------

Candidates = list[tuple[str, str]]


def describe(*parts: str) -> str:
    """A description the shells show beside a value, safe in their quoting."""
    text = " ".join(" ".join(part.split()) for part in parts if part)
    text = "".join(c for c in _UNSAFE_IN_DESCRIPTION.sub("", text) if c.isprintable())
    if len(text) > _DESCRIPTION_CHARS:
        text = text[:_DESCRIPTION_CHARS - 1] + "…"
    return text


def _safe(value: str) -> bool:
    return _SAFE_VALUE.fullmatch(value) is not None


def _job_label(job: dict[str, str]) -> str:
    from contracts.labels import status_label

    return describe(job.get("name", ""), f"({job.get('type', '')}, "
                                         f"{status_label(job.get('status', ''))})")


def job_candidates(jobs: list[dict[str, str]], *, container_only: bool = False) -> Candidates:
    return [(job["id"], _job_label(job)) for job in jobs
            if _safe(job.get("id", "")) and (not container_only
                                             or job.get("type") == "container")]


def served_candidates(jobs: list[dict[str, str]]) -> Candidates:
    found: dict[str, str] = {}
    for job in jobs:
        serves = job.get("serves", "")
        if _safe(serves) and serves not in found:
            found[serves] = describe(f"job {job.get('id', '')} {job.get('name', '')}")
    return list(found.items())


def team_candidates(teams: list[dict[str, str]], incomplete: str) -> Candidates:
    """Names, as users type them; a team whose name is not safe in a shell, or that
    another team shares, by its id; the ids alone once the word typed starts one."""
    names = [team.get("name", "") for team in teams]
    named = [(team["name"], describe(team.get("id", ""), team.get("role", "")))
             if _safe(team.get("name", "")) and names.count(team["name"]) == 1
             else (team.get("id", ""), describe(team.get("name", ""), team.get("role", "")))
             for team in teams]
    named = [(value, text) for value, text in named if _safe(value)]
    if incomplete and not any(value.startswith(incomplete) for value, _ in named):
        return [(team["id"], describe(team.get("name", ""))) for team in teams
                if _safe(team.get("id", ""))]
    return named


def model_candidates(models: list[dict[str, str]]) -> Candidates:
    return [(m["name"], describe(m.get("runtime", ""))) for m in models
            if _safe(m.get("name", ""))]


# -- the completers typer calls -----------------------------------------------------


def _complete(ctx: Any, kind: str, incomplete: str,
              candidates: Callable[[list[dict[str, str]]], Candidates]) -> Candidates:
    """The candidates of ``kind`` that start with ``incomplete``; never raises."""
    try:
        params = getattr(ctx, "params", None) or {}
        server = params.get("server")
        account = Account.current(server if isinstance(server, str) else None)
        if account is None:
            return []
        from ._config import config_dir

        cache = CompletionCache(account.cache_path(config_dir(None)), account.token_digest())
        now = clock()
        entry = cache.get(kind, now)
        if entry is not None and entry.items is not None and now - entry.at >= RECHECK_S \
                and not _matching(candidates(entry.items), incomplete):
            entry = None  # nothing typed is in it: maybe it is new
        if entry is None:
            entry = cache.put(kind, FETCHERS[kind](account), now)
        return _matching(candidates(entry.items or []), incomplete)
    except Exception:  # a TAB prints nothing, whatever went wrong
        return []


def _matching(candidates: Candidates, incomplete: str) -> Candidates:
    return [(value, text) for value, text in candidates if value.startswith(incomplete)]


def job_ids(ctx: Any, incomplete: str) -> Candidates:
    """JOB: the active team's job ids, each described by its name, type and status."""
    return _complete(ctx, "jobs", incomplete, job_candidates)


def container_job_ids(ctx: Any, incomplete: str) -> Candidates:
    """A container job's JOB (``shell``, ``jobs wireguard``)."""
    return _complete(ctx, "jobs", incomplete,
                     lambda jobs: job_candidates(jobs, container_only=True))


def served_names(ctx: Any, incomplete: str) -> Candidates:
    """``inference ... --model``: the names the team's inference jobs serve."""
    return _complete(ctx, "jobs", incomplete, served_candidates)


def team_names(ctx: Any, incomplete: str) -> Candidates:
    """``--team`` and TEAM: the caller's teams."""
    return _complete(ctx, "teams", incomplete,
                     lambda teams: team_candidates(teams, incomplete))


def model_names(ctx: Any, incomplete: str) -> Candidates:
    """The model masters' names (``models remove``, ``jobs create --model``)."""
    return _complete(ctx, "models", incomplete, model_candidates)


def choices(*values: str) -> Callable[[str], Candidates]:
    """A completer of fixed values (``--type``, ``--runtime``)."""
    def complete(incomplete: str) -> Candidates:
        return [(value, "") for value in values if value.startswith(incomplete)]
    return complete


def output_modes(incomplete: str) -> Candidates:
    """``-o``: table, wide, json, yaml, name."""
    return [(mode, text) for mode, text in _OUTPUT_MODES.items() if mode.startswith(incomplete)]
