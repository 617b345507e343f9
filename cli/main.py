"""The ``cosmicac`` command: one typer app, one module per command group.

A command's module is imported only when that command runs: importing every
module (the database, the swarm, the Kubernetes client...) cost about a
second before any command started, which ``cosmicac shell`` and every
script calling the CLI paid each time. ``cosmicac --help`` (or an unknown
command) builds the whole app; ``from cli.main import app`` does too.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import typer

#: Command groups: name -> the module whose ``app`` they are.
_GROUPS: dict[str, str] = {
    "keys": "cli.keys",
    "dht": "cli.dht",
    "db": "cli.db",
    "agent": "cli.agent",
    "k8s": "cli.k8s",
    "teams": "cli.teams",
    "apikeys": "cli.apikeys",
    "jobs": "cli.jobs",
    "racks": "cli.racks",
    "nodes": "cli.nodes",
    "models": "cli.models",
    "users": "cli.users",
    "inference": "cli.inference",
}
#: Single commands: name -> (module, function).
_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("cli.run", "run"),
    "apply-config": ("cli.run", "apply_config"),
    "beam": ("cli.beam", "beam"),
    "up": ("cli.up", "up"),
    "ping": ("cli.node", "ping"),
    "relay": ("cli.relay", "relay"),
    "shell": ("cli.shell", "shell"),
    "login": ("cli.account", "login"),
    "logout": ("cli.account", "logout"),
    "whoami": ("cli.account", "whoami"),
    "bootstrap": ("cli.deploy", "bootstrap"),
    "wire": ("cli.deploy", "wire"),
    "autobase-connect": ("cli.deploy", "autobase_connect"),
    "restart": ("cli.deploy", "restart"),
    "status": ("cli.status", "status"),
    "doctor": ("cli.doctor", "doctor"),
}
#: Options of the root callback that take a value (so that value is no command).
_ROOT_OPTIONS_WITH_VALUE = frozenset({"--log-level"})


def _configure(
    log_level: str = typer.Option(
        "warning", "--log-level", envvar="COSMICAC_LOG_LEVEL", help="debug, info, warning, error"
    ),
) -> None:
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


def build_app(only: str | None = None) -> typer.Typer:
    """The app with every command, or with command ``only`` alone."""
    app = typer.Typer(
        name="cosmicac",
        help="CosmicAC: GPU workloads on your cluster, over a peer-to-peer stack.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )
    for name, module in _GROUPS.items():
        if only in (None, name):
            app.add_typer(importlib.import_module(module).app, name=name)
    for name, (module, function) in _COMMANDS.items():
        if only in (None, name):
            app.command(name)(getattr(importlib.import_module(module), function))
    app.callback()(_configure)
    return app


def command_of(argv: Sequence[str]) -> str | None:
    """The command an argument list names, if it names a known one."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _ROOT_OPTIONS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg if arg in _GROUPS or arg in _COMMANDS else None
    return None


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    build_app(command_of(sys.argv[1:]))()


_app: typer.Typer | None = None


def __getattr__(name: str) -> Any:
    # ``from cli.main import app``: the whole app, built once (tests use it).
    global _app
    if name == "app":
        if _app is None:
            _app = build_app()
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
