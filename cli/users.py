"""``cosmicac users``: your name and password, password resets, and (for operators)
every user of the platform.

Passwords are never arguments (they would land in the shell's history and in
``ps``): they are asked on the terminal, or read from stdin with
``--password-stdin``, one per line.
"""

from __future__ import annotations

import sys

import typer

from ._console import err, fail, stderr_console
from ._output import Column, Output, no_headers_option, query_option
from .session import (
    EXIT_CODES_HELP,
    USAGE,
    Api,
    SavedSession,
    api_for,
    emit,
    load_session,
    output_option,
    save_session,
    server_option,
    server_url,
)

__all__ = ["app"]

app = typer.Typer(help=f"Users: list (operators), set-name, password, reset-password. "
                       f"{EXIT_CODES_HELP}", no_args_is_help=True)

#: Pages of ``users list`` fetched at most (500 users each): a bound, not a limit
#: anyone should meet.
_MAX_PAGES = 1000


def _password_stdin() -> bool:
    return typer.Option(False, "--password-stdin",
                        help="Read the password(s) from stdin, one per line, instead of "
                             "asking on the terminal.")


def read_passwords(prompts: tuple[str, ...], password_stdin: bool, *,
                   confirm_last: bool = True) -> list[str]:
    """One password per prompt: lines of stdin with ``--password-stdin``, else asked on the
    terminal (the last one twice, so a typo does not lock the user out)."""
    if password_stdin:
        values = [sys.stdin.readline().rstrip("\r\n") for _ in prompts]
    elif sys.stdin.isatty():
        from rich.prompt import Prompt
        console = stderr_console()
        values = [Prompt.ask(prompt, password=True, console=console) for prompt in prompts]
        if confirm_last and Prompt.ask(f"{prompts[-1]} again", password=True,
                                       console=stderr_console()) != values[-1]:
            fail("the two new passwords differ; nothing was changed", code=USAGE)
    else:
        fail("no terminal to ask the password on: pass it with --password-stdin "
             f"({len(prompts)} line{'s' if len(prompts) > 1 else ''}: "
             f"{', '.join(p.lower() for p in prompts)})", code=USAGE)
    for prompt, value in zip(prompts, values, strict=True):
        if not value:
            fail(f"{prompt.lower()} is empty", code=USAGE)
    return values


@app.command("list")
def list_users(server: str | None = server_option(), output: str = output_option(),
               no_headers: bool = no_headers_option(),
               query: str | None = query_option()) -> None:
    """Every user of the platform with their teams and roles (operators).

    Example: cosmicac users list -o json
    """
    shown = Output.of(output, no_headers, query)
    api = api_for(server)
    users: list[dict] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = api.get("/users", limit="500", cursor=cursor)
        users += page["users"]
        cursor = page["next"]
        if cursor is None:
            break
    emit(shown, users, (Column("email"), Column("name", cut=True), Column("teams", cut=True),
                        Column("disabled", drop=2), Column("user id", drop=1)),
         [(u["user"]["email"], u["user"]["name"],
           ", ".join(f"{t['name']} ({t['role']})" for t in u["teams"]),
           "yes" if u["disabled"] else "", u["user"]["id"]) for u in users])


@app.command("set-name")
def set_name(name: str = typer.Argument(..., help="Your new display name."),
             server: str | None = server_option()) -> None:
    """Change the name others see for you.

    Example: cosmicac users set-name "Ada Lovelace"
    """
    me = api_for(server).request("PATCH", "/me", json_body={"name": name})
    err.print(f"your name is now {me['user']['name']}")


@app.command("password")
def password(password_stdin: bool = _password_stdin(),
             server: str | None = server_option()) -> None:
    """Change your password. Every session of yours ends, this one is renewed.

    With --password-stdin: the current password on the first line, the new one on
    the second.

    Example: printf '%s\\n%s\\n' "$OLD" "$NEW" | cosmicac users password --password-stdin
    """
    api = api_for(server)
    current, new = read_passwords(("Current password", "New password"), password_stdin)
    answer = api.request("PUT", "/me/password",
                         json_body={"current_password": current, "password": new})
    save_session(SavedSession(server=api.server, token=answer["token"],
                              expires_at=answer["expires_at"], email=answer["user"]["email"]))
    err.print("password changed; your other sessions are logged out")


@app.command("reset-password")
def reset_password(
    email: str | None = typer.Argument(None, help="The account's email (to ask for a link)."),
    token: str | None = typer.Option(None, "--token",
                                     help="The token from the reset link (to set the "
                                          "new password)."),
    password_stdin: bool = _password_stdin(),
    server: str | None = server_option(),
) -> None:
    """Forgotten password: ask for a reset link, or set a new one with its token.

    Needs no session. EMAIL asks for a link (sent only if the account exists; the
    answer is the same either way); --token sets the new password, read from the
    terminal or stdin, and logs every session of the account out.

    Example: cosmicac users reset-password ada@example.com
    Example: echo "$NEW" | cosmicac users reset-password --token cac_... --password-stdin
    """
    if (email is None) == (token is None):
        fail("give EMAIL (to ask for a reset link) or --token (to use one), not both",
             code=USAGE)
    api = Api(server_url(server, load_session()))
    if email is not None:
        api.post("/auth/password-reset", {"email": email})
        err.print(f"if {email} has an account, a reset link is on its way (it works once, "
                  "for an hour); then run: cosmicac users reset-password --token TOKEN")
        return
    [new] = read_passwords(("New password",), password_stdin)
    api.post("/auth/password-reset/confirm", {"token": token, "password": new})
    err.print("password set; every session was logged out: run `cosmicac login`")
