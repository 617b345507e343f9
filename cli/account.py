"""``cosmicac login``, ``logout`` and ``whoami``: the user's session with app-node.

Sessions are kept in contexts (``cosmicac context``, :mod:`cli._contexts`): ``login``
adds or updates one and makes it current, ``logout`` forgets its token (the
context, its server and account stay for the next ``login``), ``whoami`` names it.

``login`` also registers the CLI's public key (the user identity
``<config dir>/user``, the one ``cosmicac shell`` dials with) as the user's
``cli_public_key``, so the team's jobs let this machine's shells in.
"""

from __future__ import annotations

import sys
from urllib.parse import quote

import typer

from . import _contexts
from ._config import config_dir
from ._console import err, fail, stderr_console
from ._help import add_note
from .session import (
    DEFAULT_SERVER,
    EXIT_CODES_HELP,
    NOT_LOGGED_IN,
    UNREACHABLE,
    USAGE,
    Api,
    SavedSession,
    api_for,
    delete_session,
    emit,
    load_contexts,
    load_session,
    output_option,
    save_session,
    selected_context,
    server_option,
    server_url,
)

__all__ = ["login", "logout", "whoami"]


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    elif sys.stdin.isatty():
        from rich.prompt import Prompt
        password = Prompt.ask("Password", password=True, console=stderr_console())
    else:
        fail("no terminal to ask the password on: pass it with --password-stdin", code=USAGE)
    if not password:
        fail("the password is empty", code=USAGE)
    return password


def login(
    email: str | None = typer.Option(None, "--email", "-e", help="Your account's email."),
    password_stdin: bool = typer.Option(
        False, "--password-stdin", help="Read the password from stdin's first line."),
    server: str | None = server_option(),
) -> None:
    """Log in: the session is kept in a context (added or updated), made current.

    The context is --context NAME (created if new), else one of the server that is
    this account's or holds no session (the current one first), else a new one named
    after the server (host:port; EMAIL@host:port when that one holds another
    account's session). The server is --server, else that of the context named by
    --context (else of the current one), else the default. Contexts are kept in
    <config dir>/contexts.json (mode 0600).

    Example: echo "$PASSWORD" | cosmicac login --email ada@example.com --password-stdin

    Example: cosmicac --context prod login --server https://cosmic.example.com
    """
    # Before the password is asked: a contexts file that cannot be used stops here.
    contexts = load_contexts()
    named = _contexts.explicit_name()
    if named is not None:
        try:
            _contexts.check_name(named)
        except _contexts.ContextsError as exc:
            fail(str(exc), code=USAGE)
    base = contexts.contexts.get(named if named is not None else contexts.current or "")
    url = server_url(server or (base.server if base else DEFAULT_SERVER))
    if not email and base is not None and base.server == url and base.email:
        email = base.email  # logging in again to a context: its account
    if not email:
        if not sys.stdin.isatty() or password_stdin:
            fail("pass --email (no terminal to ask it on)", code=USAGE)
        from rich.prompt import Prompt
        email = Prompt.ask("Email", console=stderr_console()).strip()
    password = _read_password(password_stdin)
    # Here, not at the top: whoami and logout need none of the p2p stack (trio alone
    # costs ~80 ms of start-up).
    from p2p.errors import P2PError
    from p2p.keys import load_or_create_keypair

    try:
        keypair = load_or_create_keypair(config_dir(None) / "user")
    except P2PError as exc:
        fail(f"cannot load the CLI's identity: {exc}")
    answer = Api(url, login=True).post("/auth/login", {
        "email": email, "password": password, "cli_public_key": keypair.hex})
    name = save_session(SavedSession(server=url, token=answer["token"],
                                     expires_at=answer["expires_at"],
                                     email=answer["user"]["email"], context=named or ""),
                        make_current=True)
    err.print(f"logged in as {answer['user']['email']} on {url} (context {name})")


def logout(server: str | None = server_option()) -> None:
    """Revoke the session on the server and forget it here.

    The API key the CLI made for itself (`cosmicac inference`) is revoked too. The
    context stays (its server and account), for the next `cosmicac login`.

    Example: cosmicac logout

    Example: cosmicac --context staging logout
    """
    session = load_session()
    if session is None:
        context, _ = selected_context()
        err.print("not logged in" + (f" (context {context.name})" if context else ""))
        return
    api = Api(server_url(server, session), session.token)
    _revoke_cli_key(api)
    try:
        api.request("POST", "/auth/logout")
    except typer.Exit as exit_:
        # An expired or revoked session is as good as revoked; when the server is
        # unreachable the token still works there, so it is kept for another try.
        if exit_.exit_code != NOT_LOGGED_IN:
            raise
    delete_session(session.context)
    err.print(f"logged out (context {session.context})")


def _revoke_cli_key(api: Api) -> None:
    """Revoke the inference key the CLI made for itself: logging out cuts this
    machine off, and that key would otherwise go on working."""
    from .inference import cli_key_id, forget_cli_key

    key_id = cli_key_id(api.server)
    if key_id is None:
        return
    try:
        api.request("DELETE", f"/apikeys/{quote(key_id, safe='')}")
    except typer.Exit as exit_:
        if exit_.exit_code == UNREACHABLE:
            raise  # nothing forgotten: run logout again when the server answers
        if exit_.exit_code == NOT_LOGGED_IN:
            err.print(f"the CLI's API key {key_id} could not be revoked (the session "
                      f"expired): log in and run `cosmicac apikeys revoke {key_id}`")
        # REFUSED: revoked or removed already.
    forget_cli_key(api.server)


def whoami(server: str | None = server_option(), output: str = output_option()) -> None:
    """Who the session is: the context, the user, their teams and roles, the active team.

    The context's name and server go to stderr (and into -o json's document as
    "context"), so stdout stays the table.

    Example: cosmicac whoami -o json

    Example: cosmicac --context prod whoami
    """
    api = api_for(server)
    context, _ = selected_context()
    me = api.get("/me")
    if context is not None:
        me["context"] = {"name": context.name, "server": api.server}
        err.print(f"context {context.name} ({api.server})")
    user = me["user"]
    active = me.get("active_team")
    emit(output, me, ("email", "name", "team", "role", "active"),
         [(user["email"], user["name"], team["name"], team["role"],
           "*" if team["id"] == active else "") for team in me["teams"]]
         or [(user["email"], user["name"], "", "", "")])


add_note((login, logout, whoami), EXIT_CODES_HELP)
