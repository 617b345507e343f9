"""``--server-args`` and ``--server-env``: a model server's extra command line and
environment, as ``jobs create`` and ``models add`` take them.

Apart from :mod:`._args` on purpose: that module loads the daemon settings (the
p2p stack, trio), which ``jobs`` and ``models`` commands never need.
"""

from __future__ import annotations

import shlex
from typing import Any

import typer

from ._console import fail

__all__ = ["server_settings", "server_settings_options"]
def server_settings_options() -> tuple[Any, Any]:
    """``--server-args`` and ``--server-env``: a model server's extra command line
    and environment (a job's, or a model master's for every job of it)."""
    return (
        typer.Option(None, "--server-args", help="Extra arguments for the model server, "
                     "as on a command line: '--max-model-len 4096 --dtype bfloat16'."),
        typer.Option(None, "--server-env", help="NAME=value for the model server's "
                     "environment; repeat for more."),
    )


def server_settings(args: str | None, env: list[str] | None) -> dict[str, Any]:
    """The API's ``{"args": [...], "env": {...}}`` from the two options (empty when
    neither is given); a usage error (exit 2) for unbalanced quotes or a pair
    without ``=``. What the platform does not allow is the API's to refuse."""
    settings: dict[str, Any] = {}
    if args:
        try:
            settings["args"] = shlex.split(args)
        except ValueError as exc:
            fail(f"--server-args: {exc} (quote as in a shell)", code=2)
    variables: dict[str, str] = {}
    for pair in env or ():
        name, equals, value = pair.partition("=")
        if not equals or not name:
            fail(f"--server-env takes NAME=value, not {pair!r}", code=2)
        variables[name] = value
    if variables:
        settings["env"] = variables
    return settings
