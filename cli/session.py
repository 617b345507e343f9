"""The user's CLI session with app-node: where the server is, the saved token,
and an HTTP client that turns every API failure into one line and an exit code.

Sessions live in contexts (:mod:`cli._contexts`: ``<config dir>/contexts.json``,
mode 0600), one per server and account; a command uses ``--context NAME``, else
``$COSMICAC_CONTEXT``, else the current context (``cosmicac context use``).
The server is ``--server``, else ``$COSMICAC_SERVER``, else the context's, else
the entry point on ``http://127.0.0.1:5173``; the API is at ``<server>/api``
(app-node itself serves under ``/api`` too, so its own ``http://HOST:PORT`` works).

Exit codes are a contract for scripts (:data:`EXIT_CODES_HELP` goes into every
command's ``--help``): 0 done, 1 refused or not found, 2 usage or validation,
3 not logged in or session expired, 4 server unreachable.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer

from . import _contexts
from ._console import fail
from ._output import Output, emit, output_option

__all__ = [
    "EXIT_CODES_HELP", "NOT_LOGGED_IN", "REFUSED", "UNREACHABLE", "USAGE", "Api",
    "SavedSession", "api_for", "check_output", "delete_session", "emit", "load_contexts",
    "load_session", "output_option", "save_session", "selected_context", "server_option",
    "server_url", "session_path",
]

DEFAULT_SERVER = "http://127.0.0.1:5173"
#: Exit codes scripts can trust.
REFUSED, USAGE, NOT_LOGGED_IN, UNREACHABLE = 1, 2, 3, 4
EXIT_CODES_HELP = ("Exit codes: 0 done, 1 refused or not found, 2 usage or validation, "
                   "3 not logged in or session expired, 4 server unreachable.")
#: Seconds an answer may take (connecting: cli._http.CONNECT_S).
_TIMEOUT_S = 30.0


def server_option() -> Any:
    return typer.Option(None, "--server", envvar="COSMICAC_SERVER",
                        help=f"The CosmicAC server (API at <server>/api); default: the "
                             f"context's server, else {DEFAULT_SERVER}.")


@dataclass(frozen=True)
class SavedSession:
    """A context's session: a plain dataclass, not a pydantic model (pydantic costs
    ~50 ms of every command's start-up, and four fields need no schema)."""

    server: str
    token: str
    expires_at: float
    email: str
    #: The context it is kept in ("" for one not saved yet).
    context: str = ""


def session_path() -> Path:
    """Where sessions are kept: the contexts file."""
    return _contexts.contexts_path()


def load_contexts() -> _contexts.Contexts:
    """Every context; exit 2 when the file cannot be used (it is left as it is)."""
    try:
        return _contexts.read()
    except _contexts.ContextsError as exc:
        fail(str(exc), code=USAGE)
    except OSError as exc:
        fail(f"cannot read {session_path()}: {exc}")


def selected_context(contexts: _contexts.Contexts | None = None
                     ) -> tuple[_contexts.Context | None, bool]:
    """``(context, explicit)``: the context commands use (``--context``, else
    ``$COSMICAC_CONTEXT``, else the current one; None when there is none), and
    whether it was named explicitly. Exit 2 for a name that is not in the file."""
    contexts = load_contexts() if contexts is None else contexts
    name, explicit = _contexts.selected_name(contexts)
    if name is None:
        return None, False
    try:
        return contexts.get(name, "" if explicit else " (the current context)"), explicit
    except _contexts.UnknownContext as exc:
        fail(str(exc), code=USAGE)


def load_session(*, quiet: bool = False) -> SavedSession | None:
    """The selected context's session, or None (no context, or logged out).

    Exit 2 for a contexts file that cannot be used or an unknown context; with
    ``quiet`` (a shell's completion, which must print nothing), None instead.
    """
    if quiet:
        try:
            contexts = _contexts.read()
            name, _ = _contexts.selected_name(contexts)
            context = contexts.contexts.get(name or "")
        except (_contexts.ContextsError, OSError):
            return None
    else:
        context, _ = selected_context()
    if context is None or not context.token:
        return None
    return SavedSession(server=context.server, token=context.token,
                        expires_at=context.expires_at or 0.0, email=context.email or "",
                        context=context.name)


def save_session(session: SavedSession, *, make_current: bool | None = None) -> str:
    """Keep ``session`` in its context; returns the context's name.

    The context is ``session.context`` if set, else the one ``--context`` or
    ``$COSMICAC_CONTEXT`` names, else one of the session's server that is this
    account's or holds no session, else a new one named after the server
    (:func:`cli._contexts.login_name`). It becomes current with ``make_current``
    (``login``); by default only when the current one holds no live session (a
    renewed token, ``users password``, leaves the current context alone). The file
    is written atomically, mode 0600.
    """
    now = time.time()
    try:
        with _contexts.edit() as contexts:
            name = _contexts.login_name(
                contexts, session.server, session.email,
                session.context or _contexts.explicit_name(), now)
            kept = contexts.contexts.get(name)
            current = contexts.contexts.get(contexts.current or "")
            contexts.put(_contexts.Context(
                name, session.server, session.email, session.token, session.expires_at,
                kept.extra if kept is not None else {}))
            if make_current or (make_current is None and (
                    current is None or not current.has_session(now))):
                contexts.current = name
    except _contexts.ContextsError as exc:
        fail(str(exc), code=USAGE)
    except OSError as exc:
        fail(f"cannot write {session_path()}: {exc}")
    return name


def delete_session(context: str | None = None) -> None:
    """Forget the token of ``context`` (default: the selected one); the context, its
    server and its account are kept for the next ``login``."""
    try:
        with _contexts.edit() as contexts:
            if context is None:
                found, _ = selected_context(contexts)
                if found is None:
                    return
                context = found.name
            found = contexts.contexts.get(context)
            if found is not None:
                contexts.put(found.logged_out())
    except _contexts.ContextsError as exc:
        fail(str(exc), code=USAGE)
    except OSError as exc:
        fail(f"cannot write {session_path()}: {exc}")


def server_url(option: str | None,
               session: SavedSession | _contexts.Context | None = None) -> str:
    """The server's base URL (no trailing slash, no ``/api``)."""
    url = (option or (session.server if session else None) or DEFAULT_SERVER).rstrip("/")
    if not url.startswith(("http://", "https://")):
        fail(f"--server must be an http:// or https:// URL, not {url!r}", code=USAGE)
    return url.removesuffix("/api")


@dataclass
class Api:
    """A thin httpx client on ``<server>/api``: bearer token in, one line out on failure."""

    server: str
    token: str | None = None
    #: A 401 means a wrong password (refused), not an expired session.
    login: bool = False

    def request(self, method: str, path: str, *, json_body: Any = None,
                params: dict[str, str] | None = None) -> Any:
        from ._http import Unreachable, request  # urllib: httpx costs ~0.2 s of start-up

        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            answer = request(method, f"{self.server}/api{path}", headers=headers,
                             json_body=json_body, params=params, timeout=_TIMEOUT_S)
        except Unreachable as exc:
            fail(f"cannot reach the server at {self.server}: {exc}", code=UNREACHABLE)
        if answer.ok:
            if answer.status == 204 or not answer.body:
                return None
            try:
                return answer.json()
            except ValueError:
                fail(f"{self.server} answered {path} with something other than JSON: "
                     f"is it a CosmicAC server?", code=REFUSED)
        self.refuse(answer.status, answer.body, answer.reason)

    def _fail(self, response: Any) -> NoReturn:
        """:meth:`refuse` for an httpx response (the event streams' followers)."""
        response.read()
        self.refuse(response.status_code, response.content, response.reason_phrase)

    def refuse(self, status: int, body: bytes, reason: str) -> NoReturn:
        """The API's refusal as one line and the exit code scripts rely on."""
        try:
            error = json.loads(body)["error"]
            code, message, field = error["code"], error["message"], error.get("field")
            if not all(isinstance(v, str) for v in (code, message)) or not isinstance(
                    field, str | None):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            code, message, field = str(status), reason or "error", None
        text = f"{message} ({code}{', field ' + field if field else ''})"
        if status == 401 and not self.login:
            fail(f"{text}: log in again with `cosmicac login`", code=NOT_LOGGED_IN)
        if status in (400, 422):
            fail(text, code=USAGE)
        if status >= 500 and status != 502:
            fail(f"the server failed: {text}", code=REFUSED)
        fail(text, code=REFUSED)

    def get(self, path: str, **params: str | None) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v})

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, json_body=body)


def api_for(server: str | None) -> Api:
    """An :class:`Api` with the selected context's session; exit 3 if it has none or
    it expired."""
    context, explicit = selected_context()
    again = f"cosmicac --context {context.name} login" if explicit and context else \
        "cosmicac login"
    if context is None or not context.token:
        where = f" (context {context.name!r}, {context.server})" if context else ""
        fail(f"not logged in{where}: run `{again}`", code=NOT_LOGGED_IN)
    if (context.expires_at or 0) <= time.time():
        fail(f"the session expired (context {context.name!r}, {context.server}): run "
             f"`{again}`", code=NOT_LOGGED_IN)
    return Api(server_url(server, context), context.token)


def check_output(output: str) -> str:
    """``-o``'s mode, checked (exit 2 for an unknown one)."""
    return Output.of(output).mode
