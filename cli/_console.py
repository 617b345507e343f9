"""Console output shared by every command: data on stdout, diagnostics on stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["OutputFormat", "err", "fail", "first_leaf", "out", "print_json", "run_trio",
           "stderr_console"]

# markup=False, emoji=False: what we print is often what the user typed, and
# "127.0.0.1:-1:" must not become "127.0.0.1👎" nor "[::1]" a style tag. The
# one styled line (fail) is built as a rich Text, which is never parsed.
#: The consoles' options, by name: ``err``, diagnostics and progress (honours
#: NO_COLOR and degrades when not a TTY), and ``out``, human-readable results.
#: Each is made on first use (:class:`_OnFirstUse`): rich costs ~20 ms of start-up, which a
#: command that prints nothing of its own (``cosmicac shell ... -- true``) skips.
_CONSOLES: dict[str, dict[str, bool]] = {
    "err": {"stderr": True, "highlight": False, "soft_wrap": True, "emoji": False,
            "markup": False},
    "out": {"highlight": False, "soft_wrap": True, "emoji": False, "markup": False},
}


_MADE: dict[str, Console] = {}


def _console(name: str) -> Console:
    """The console ``name`` (``err`` or ``out``), made by the first use."""
    console = _MADE.get(name)
    if console is None:
        from rich.console import Console

        console = _MADE[name] = Console(**_CONSOLES[name])
    return console


class _OnFirstUse:
    """``err`` and ``out`` as modules import them (``from ._console import err``): the
    console is made by its first use, not by the import, so a command that prints
    nothing of its own never loads rich. Give rich itself (a prompt's ``console=``)
    :func:`stderr_console`."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(_console(self._name), attribute)


def stderr_console() -> Console:
    """The ``err`` console itself (for rich's own ``console=`` arguments)."""
    return _console("err")


err: Any = _OnFirstUse("err")
out: Any = _OnFirstUse("out")


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


def fail(message: str, *, code: int = 1) -> NoReturn:
    """Print a one-line error on stderr and exit with ``code``.

    ``message`` is shown as it is: rich markup and emoji codes in it are not
    interpreted (it often holds what the user typed).
    """
    from rich.text import Text

    # A Text is never parsed for markup or emoji (escape() mangles a trailing "\\").
    line = Text.assemble(("error:", "bold red"), " ", " ".join(str(message).split()))
    _console("err").print(line)
    raise typer.Exit(code)


def first_leaf(group: BaseException) -> Any:
    """The first exception inside (possibly nested) exception groups."""
    while isinstance(group, BaseExceptionGroup):
        group = group.exceptions[0]
    return group


def run_trio(async_fn: Callable[..., Awaitable[object]], *args: Any) -> None:
    """``trio.run`` for commands: a :func:`fail` from inside a nursery exits
    cleanly with its code, not with an exception-group traceback."""
    import trio  # here: the API commands never need it, and it costs ~0.2 s to import

    try:
        trio.run(async_fn, *args)
    except BaseExceptionGroup as group:
        exits = group.subgroup(lambda exc: isinstance(exc, typer.Exit))
        # subgroup() also asks the predicate about nested groups: judge leaves only.
        rest = group.subgroup(lambda exc: not isinstance(
            exc, BaseExceptionGroup | typer.Exit | trio.Cancelled))
        if exits is None or rest is not None:
            raise
        first: BaseException = exits
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
