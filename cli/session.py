"""The user's CLI session with app-node: where the server is, the saved token,
and an HTTP client that turns every API failure into one line and an exit code.

The server is ``--server``, else ``$COSMICAC_SERVER``, else the server the
session was opened on, else the entry point on ``http://127.0.0.1:5173``; the
API is at ``<server>/api`` (app-node itself serves under ``/api`` too, so its
own ``http://HOST:PORT`` works). ``login`` keeps the session in
``<config dir>/session.json`` (mode 0600: server, token, expires_at, email).

Exit codes are a contract for scripts (:data:`EXIT_CODES_HELP` goes into every
command's ``--help``): 0 done, 1 refused or not found, 2 usage or validation,
3 not logged in or session expired, 4 server unreachable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from ._config import config_dir, write_private
from ._console import fail, print_json

__all__ = [
    "EXIT_CODES_HELP", "NOT_LOGGED_IN", "REFUSED", "UNREACHABLE", "USAGE", "Api",
    "SavedSession", "api_for", "check_output", "delete_session", "emit", "load_session",
    "output_option", "save_session", "server_option", "server_url", "session_path",
]

DEFAULT_SERVER = "http://127.0.0.1:5173"
SESSION_FILE = "session.json"
#: Exit codes scripts can trust.
REFUSED, USAGE, NOT_LOGGED_IN, UNREACHABLE = 1, 2, 3, 4
EXIT_CODES_HELP = ("Exit codes: 0 done, 1 refused or not found, 2 usage or validation, "
                   "3 not logged in or session expired, 4 server unreachable.")
#: (total, connect) seconds of one request.
_TIMEOUT = (30.0, 5.0)


def server_option() -> Any:
    return typer.Option(None, "--server", envvar="COSMICAC_SERVER",
                        help=f"The CosmicAC server (API at <server>/api); default: the "
                             f"session's server, else {DEFAULT_SERVER}.")


def output_option() -> Any:
    return typer.Option("table", "--output", "-o", help="table or json.")


@dataclass(frozen=True)
class SavedSession:
    """``session.json``: a plain dataclass, not a pydantic model (pydantic costs ~50 ms
    of every command's start-up, and four fields need no schema)."""

    server: str
    token: str
    expires_at: float
    email: str

    @classmethod
    def from_json(cls, data: bytes) -> SavedSession:
        """Raises ValueError for anything but an object of the four fields, typed."""
        document = json.loads(data)
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        server, token, email = (document.get(k) for k in ("server", "token", "email"))
        expires_at = document.get("expires_at")
        if not all(isinstance(v, str) for v in (server, token, email)) or isinstance(
                expires_at, bool) or not isinstance(expires_at, int | float):
            raise ValueError("a field is missing or of the wrong type")
        return cls(server=server, token=token, expires_at=float(expires_at), email=email)

    def to_json(self) -> str:
        return json.dumps({"server": self.server, "token": self.token,
                           "expires_at": self.expires_at, "email": self.email})


def session_path() -> Path:
    return config_dir(None) / SESSION_FILE


def load_session() -> SavedSession | None:
    """The saved session, or None if there is none (or it cannot be read)."""
    try:
        return SavedSession.from_json(session_path().read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # unreadable, not JSON, or not a session
        return None


def save_session(session: SavedSession) -> None:
    """Write ``session.json`` atomically with mode 0600 (it holds a bearer token)."""
    write_private(session_path(), session.to_json())


def delete_session() -> None:
    session_path().unlink(missing_ok=True)


def server_url(option: str | None, session: SavedSession | None = None) -> str:
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
        import httpx  # here: a command that fails before asking pays nothing for it

        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            timeout = httpx.Timeout(_TIMEOUT[0], connect=_TIMEOUT[1])
            with httpx.Client(base_url=f"{self.server}/api", timeout=timeout) as client:
                response = client.request(method, path, json=json_body, params=params,
                                          headers=headers)
        except httpx.TransportError as exc:
            fail(f"cannot reach the server at {self.server}: {exc or type(exc).__name__}",
                 code=UNREACHABLE)
        if response.is_success:
            if response.status_code == 204 or not response.content:
                return None
            try:
                return response.json()
            except ValueError:
                fail(f"{self.server} answered {path} with something other than JSON: "
                     f"is it a CosmicAC server?", code=REFUSED)
        self._fail(response)

    def _fail(self, response: Any) -> NoReturn:  # an httpx.Response
        status = response.status_code
        try:
            body = response.json()["error"]
            code, message, field = body["code"], body["message"], body.get("field")
        except (ValueError, KeyError, TypeError):
            code, message, field = str(status), response.reason_phrase or "error", None
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
    """An :class:`Api` with the saved session; exit 3 if there is none or it expired."""
    session = load_session()
    if session is None:
        fail("not logged in: run `cosmicac login`", code=NOT_LOGGED_IN)
    if session.expires_at <= time.time():
        fail("the session expired: run `cosmicac login`", code=NOT_LOGGED_IN)
    return Api(server_url(server, session), session.token)


def check_output(output: str) -> str:
    if output not in ("table", "json"):
        fail(f"-o takes table or json, not {output!r}", code=USAGE)
    return output


def emit(output: str, document: Any, columns: Sequence[str] = (),
         rows: Iterable[Sequence[Any]] = (), *, title: str | None = None) -> None:
    """``document`` as JSON with ``-o json``, else ``rows`` as a rich table."""
    if check_output(output) == "json":
        print_json(document)
        return
    table = Table(title=title, title_justify="left")
    for column in columns:
        # fold, never "…": ids and keys are copied from these tables.
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    Console(highlight=False, emoji=False, markup=False).print(table)
