"""``cosmicac context``: the servers and accounts this configuration knows.

A context is a server and the session the CLI holds there (see
:mod:`cli._contexts` for the file). ``login`` adds or updates one and makes it
current; these commands list, switch, rename and delete them, as kubectl's
``config get-contexts``/``use-context``/``rename-context``/``delete-context``
do. None of them talks to a server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from . import _contexts
from ._console import err, fail
from ._output import Column, Output, no_headers_option, query_option
from .session import (
    EXIT_CODES_HELP,
    REFUSED,
    USAGE,
    emit,
    load_contexts,
    output_option,
    selected_context,
    session_path,
)

__all__ = ["app"]

app = typer.Typer(help="Contexts (servers and accounts): list, use, rename, delete, "
                       f"current. {EXIT_CODES_HELP}",
                  no_args_is_help=True)

_COLUMNS = (Column("current"), Column("name"), Column("server"),
            Column("user", cut=True, drop=2), Column("expires", drop=1))


def _complete_names(incomplete: str) -> list[str]:
    """A shell's TAB on a context's name: the file's names (no server asked); nothing,
    silently, when the file cannot be read."""
    try:
        names = _contexts.read().names()
    except (_contexts.ContextsError, OSError):
        return []
    return [name for name in names if name.startswith(incomplete)]


def _name_argument(help_text: str) -> Any:
    return typer.Argument(..., help=help_text, autocompletion=_complete_names)


def _expires(context: _contexts.Context, now: float) -> str:
    """When its session ends, in the words a person reads at a glance."""
    if not context.token:
        return "logged out"
    left = (context.expires_at or 0) - now
    if left <= 0:
        return "expired"
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= seconds:
            return f"in {int(left // seconds)}{unit}"
    return "in <1m"


def _document(context: _contexts.Context, current: bool, now: float) -> dict[str, Any]:
    """A context as ``-o json`` shows it: never its token."""
    return {"name": context.name, "current": current, "server": context.server,
            "email": context.email, "logged_in": context.has_session(now),
            "expires_at": context.expires_at if context.token else None}


@app.command("list")
def list_contexts(output: str = output_option(), no_headers: bool = no_headers_option(),
                  query: str | None = query_option()) -> None:
    """The contexts, by name; * marks the one commands use now (--context, else
    $COSMICAC_CONTEXT, else the current one).

    Example: cosmicac context list

    Example: cosmicac context list -o name
    """
    shown = Output.of(output, no_headers, query)
    contexts = load_contexts()
    selected, _ = _contexts.selected_name(contexts)
    now = time.time()
    listed = [contexts.contexts[name] for name in contexts.names()]
    if not listed and not shown.is_document and shown.mode != "name":
        err.print("no contexts yet: `cosmicac login` adds one")
    emit(shown, [_document(c, c.name == selected, now) for c in listed], _COLUMNS,
         [("*" if c.name == selected else "", c.name, c.server, c.email or "",
           _expires(c, now)) for c in listed],
         names=[c.name for c in listed])


@contextmanager
def _editing() -> Iterator[_contexts.Contexts]:
    """The contexts, changed and written back whole (or not at all, on an error)."""
    try:
        with _contexts.edit() as contexts:
            yield contexts
    except _contexts.ContextsError as exc:
        fail(str(exc), code=USAGE)
    except OSError as exc:
        fail(f"cannot write {session_path()}: {exc}")


@app.command("use")
def use(name: str = _name_argument("The context to make current.")) -> None:
    """Make a context the current one: the one commands use without --context.

    Example: cosmicac context use prod
    """
    with _editing() as contexts:
        found = contexts.get(name)
        contexts.current = name
    err.print(f"switched to context {name} ({found.server})")
    overriding = _contexts.explicit_name()
    if overriding is not None and overriding != name:
        err.print(f"note: ${_contexts.ENV} names {overriding!r}, which commands use over "
                  f"the current context until it is unset")
    server = os.environ.get("COSMICAC_SERVER")
    if server and server.rstrip("/").removesuffix("/api") != found.server.rstrip("/"):
        err.print(f"note: $COSMICAC_SERVER ({server}) overrides every context's server: "
                  f"unset it to reach {found.server}")


@app.command("rename")
def rename(old: str = _name_argument("The context's name."),
           new: str = typer.Argument(..., help="Its new name.")) -> None:
    """Rename a context (the current one stays current).

    Example: cosmicac context rename 127.0.0.1:5173 local
    """
    with _editing() as contexts:
        contexts.rename(old, new)
    err.print(f"context {old} renamed to {new}")


@app.command("delete")
def delete(name: str = _name_argument("The context to forget.")) -> None:
    """Forget a context and its session here; the server is not told.

    To revoke its session on the server too, run `cosmicac --context NAME logout`
    first. Deleting the current context leaves none current: choose one with
    `cosmicac context use`.

    Example: cosmicac --context old logout && cosmicac context delete old
    """
    with _editing() as contexts:
        was_current = contexts.current == name
        found = contexts.delete(name)
        left = contexts.names()
    err.print(f"context {name} deleted")
    if found.has_session(time.time()):
        err.print(f"note: its session on {found.server} was not revoked there; it works "
                  f"until it expires")
    if was_current and left:
        err.print(f"no context is current now: `cosmicac context use NAME` (known: "
                  f"{', '.join(left)})")


@app.command("current")
def current() -> None:
    """The name of the context commands use now (--context, else $COSMICAC_CONTEXT,
    else the current one); exit 1 when there is none.

    Example: cosmicac context current
    """
    context, _ = selected_context()
    if context is None:
        fail("no current context: `cosmicac context use NAME` or `cosmicac login`",
             code=REFUSED)
    print(context.name)
