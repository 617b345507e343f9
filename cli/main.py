"""The ``cosmicac`` command: one typer app, one module per command group.

A command's module is imported only when that command runs: importing every
module (the database, the swarm, the Kubernetes client...) cost about a
second before any command started, which ``cosmicac shell`` and every
script calling the CLI paid each time. ``cosmicac --help`` (and an unknown
command) is answered from :data:`_INDEX`, each command's one-line help, with
no command module imported (a test keeps it equal to the commands' own);
``from cli.main import app`` builds the whole app.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import typer
import typer.core

#: Command groups: name -> the module whose ``app`` they are.
_GROUPS: dict[str, str] = {
    "jobs": "cli.jobs",
    "inference": "cli.inference",
    "apikeys": "cli.apikeys",
    "models": "cli.models",
    "context": "cli.context",
    "teams": "cli.teams",
    "users": "cli.users",
    "racks": "cli.racks",
    "nodes": "cli.nodes",
    "k8s": "cli.k8s",
    "agent": "cli.agent",
    "keys": "cli.keys",
    "dht": "cli.dht",
    "db": "cli.db",
}
#: Single commands: name -> (module, function).
_COMMANDS: dict[str, tuple[str, str]] = {
    "shell": ("cli.shell", "shell"),
    "login": ("cli.account", "login"),
    "logout": ("cli.account", "logout"),
    "whoami": ("cli.account", "whoami"),
    "up": ("cli.up", "up"),
    "run": ("cli.run", "run"),
    "bootstrap": ("cli.deploy", "bootstrap"),
    "wire": ("cli.deploy", "wire"),
    "autobase-connect": ("cli.deploy", "autobase_connect"),
    "apply-config": ("cli.run", "apply_config"),
    "restart": ("cli.deploy", "restart"),
    "status": ("cli.status", "status"),
    "doctor": ("cli.doctor", "doctor"),
    "relay": ("cli.relay", "relay"),
    "beam": ("cli.beam", "beam"),
    "ping": ("cli.node", "ping"),
}
#: The root ``--help``'s panels, by what the reader came to do, each command in the
#: order a reader of that panel would pick it (the help lists them in this order).
PANELS: dict[str, tuple[str, ...]] = {
    "Use the platform": ("jobs", "inference", "shell", "apikeys", "models"),
    "Account and team": ("login", "logout", "whoami", "context", "teams", "users"),
    "Operate a deployment": ("up", "run", "bootstrap", "wire", "autobase-connect",
                             "apply-config", "restart", "status", "doctor", "racks", "nodes",
                             "k8s", "agent"),
    "P2P tools": ("keys", "dht", "relay", "beam", "ping", "db"),
}
#: Each command's one-line help, as the root ``--help`` lists it.
_INDEX: dict[str, str] = {
    "run": "Run one platform daemon in the foreground until SIGINT or SIGTERM.",
    "apply-config": "Validate a daemon's config (with the environment's overrides) and "
                    "install it.",
    "beam": "Pipe stdin/stdout to a peer over an encrypted, key-pinned stream.",
    "up": "Run the whole system on this machine until Ctrl-C.",
    "ping": "Ping a peer over the whole stack (secret stream, channel, RPC) and identify it.",
    "relay": "Run a blind relay: firewalled peers reserve, dialers pair, bytes are forwarded.",
    "shell": "Open a shell on a GPU Container Job's agent, or run one command there.",
    "login": "Log in: the session is kept in a context (added or updated), made current.",
    "logout": "Revoke the session on the server and forget it here.",
    "whoami": "Who the session is: the context, the user, their teams and roles, the "
              "active team.",
    "context": "Contexts (servers and accounts): list, use, rename, delete, current.",
    "bootstrap": "Prepare a deployment: identities, wired configs, wire, autobase-connect, "
                 "a rack.",
    "wire": "Write the shared database's key as PROXY_AUTOBASE_KEY for proxy-inference.",
    "autobase-connect": "Admit proxy-inference as a writer of the shared database (through "
                        "app-node).",
    "restart": "Restart services installed as systemd units (systemctl restart "
               "cosmicac-<name>).",
    "status": "The control plane's health: each service now and over the last hour.",
    "doctor": "Check that the cluster can run the kubevirt backend's jobs, one line per "
              "check.",
    "keys": "Identities (Ed25519 key pairs).",
    "dht": "The DHT: bootstrap and plain nodes, announce, lookup.",
    "db": "The shared database (API keys, model masters, token usage).",
    "agent": "The job agent that runs in each VMI and reports to its worker.",
    "k8s": "Kubernetes (KubeVirt/CDI) helpers for operators.",
    "teams": "Teams: list, get, create, members, invite, invitations, revoke-invite, use "
             "(the active team), quota (GPU quotas).",
    "apikeys": "Inference API keys: create, list, revoke, usage.",
    "jobs": "Jobs: list, get, create, restart, delete; replicas.",
    "racks": "Racks (workers) wrk-ork places jobs on: list, add, remove; operators only.",
    "nodes": "Nodes of every rack: list, reserve for a team, release; operators only.",
    "models": "Model masters: list, add (or replace), remove.",
    "users": "Users: list (operators), set-name, password, reset-password.",
    "inference": "Chat, completions, embeddings and transcriptions through the "
                 "OpenAI-compatible API (<server>/inference/v1).",
}
#: Options of the root callback that take a value (so that value is no command).
_ROOT_OPTIONS_WITH_VALUE = frozenset({"--log-level", "--context"})
#: The environment variable ``--context`` becomes (cli._contexts.ENV, not imported:
#: ``--help`` imports no CLI module).
_CONTEXT_ENV = "COSMICAC_CONTEXT"
#: Commands with a ``--context`` of their own (doctor's is the kubeconfig's): after
#: the command's name it is theirs; the CLI's goes before it.
_OWN_CONTEXT = frozenset({"doctor"})


def _configure(
    log_level: str = typer.Option(
        "warning", "--log-level", envvar="COSMICAC_LOG_LEVEL", help="debug, info, warning, error"
    ),
    context: str | None = typer.Option(
        None, "--context", envvar=_CONTEXT_ENV, metavar="NAME",
        help="The context (server and account, see `cosmicac context`) this command uses; "
             "anywhere before '--'. Default: the current one."),
    no_color: bool = typer.Option(
        False, "--no-color", help="No colour, as NO_COLOR=1 (no-color.org); anywhere "
                                  "before '--'."),
) -> None:
    from cli._contexts import choose

    if no_color:
        os.environ["NO_COLOR"] = "1"

    choose(context)
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )


class _PanelOrder(typer.core.TyperGroup):
    """Lists commands in :data:`PANELS`' order (typer puts single commands before
    groups, so ``shell`` would come before ``jobs``)."""

    def list_commands(self, ctx: Any) -> list[str]:
        listed = super().list_commands(ctx)
        order = {name: at for at, (_, name) in enumerate(_in_panels())}
        return sorted(listed, key=lambda name: order.get(name, len(order)))


def _root() -> typer.Typer:
    return typer.Typer(
        name="cosmicac",
        cls=_PanelOrder,
        help="CosmicAC: GPU workloads on your cluster, over a peer-to-peer stack.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )


def build_index() -> typer.Typer:
    """The app as the root ``--help`` (and an unknown command) needs it: every
    command by name with its one-line help, none of their modules imported."""
    app = _root()

    def listed() -> None:  # never runs: a named command builds the real app
        raise AssertionError("the index app ran a command")

    for panel, name in _in_panels():
        if name in _GROUPS:
            app.add_typer(typer.Typer(help=_INDEX[name]), name=name, rich_help_panel=panel)
        else:
            app.command(name, help=_INDEX[name], rich_help_panel=panel)(listed)
    app.callback()(_configure)
    return app


def build_app(only: str | None = None) -> typer.Typer:
    """The app with every command, or with command ``only`` alone."""
    from cli._help import examples_last, split_examples

    app = _root()
    for panel, name in _in_panels():
        if only not in (None, name):
            continue
        if name in _GROUPS:
            group = importlib.import_module(_GROUPS[name]).app
            examples_last(group)
            app.add_typer(group, name=name, rich_help_panel=panel)
        else:
            module, function = _COMMANDS[name]
            command = getattr(importlib.import_module(module), function)
            text, examples = split_examples(command.__doc__ or "")
            app.command(name, rich_help_panel=panel, help=text, epilog=examples)(command)
    app.callback()(_configure)
    return app


def _in_panels() -> list[tuple[str, str]]:
    """(panel, command) for every command, in the order the root help lists them."""
    return [(panel, name) for panel, names in PANELS.items() for name in names]


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


def take_context(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """``argv`` without its ``--context NAME``/``--context=NAME`` (anywhere before
    ``--``, so every command takes it without declaring it), and the last NAME.

    A command of :data:`_OWN_CONTEXT` keeps the ``--context`` after its name; a
    ``--context`` with no value is left for the parser to complain about.
    """
    kept: list[str] = []
    chosen: str | None = None
    command: str | None = None
    at = 0
    while at < len(argv):
        arg = argv[at]
        if arg == "--" or command in _OWN_CONTEXT:
            kept.extend(argv[at:])
            break
        if arg == "--context" and at + 1 < len(argv):
            chosen, at = argv[at + 1], at + 2
            continue
        if arg.startswith("--context="):
            chosen, at = arg.removeprefix("--context="), at + 1
            continue
        if command is None and arg in _ROOT_OPTIONS_WITH_VALUE and at + 1 < len(argv):
            kept.extend(argv[at:at + 2])
            at += 2
            continue
        if command is None and not arg.startswith("-"):
            command = arg
        kept.append(arg)
        at += 1
    return kept, chosen


def take_no_color(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--no-color`` (anywhere before ``--``, so every command takes
    it), and whether it was there."""
    end = list(argv).index("--") if "--" in argv else len(argv)
    kept = [arg for arg in argv[:end] if arg != "--no-color"]
    return [*kept, *argv[end:]], len(kept) < end


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.argv[1:], no_color = take_no_color(sys.argv[1:])
    if no_color:  # before any console is made: rich's read NO_COLOR when made
        os.environ["NO_COLOR"] = "1"
    args, context = take_context(sys.argv[1:])
    if context is not None:  # the root callback reads it from there, as set by a user
        os.environ[_CONTEXT_ENV] = context
        sys.argv[1:] = args
    args = sys.argv[1:]
    if any(key.endswith("_COMPLETE") for key in os.environ):
        # A shell's TAB (``_COSMICAC_COMPLETE``) passes its words in the environment:
        # build the command they name alone, as a run does (the index while they name
        # none), not the whole app (about a second of imports per TAB).
        from ._completion import plain_descriptions, words_before_cursor

        plain_descriptions()
        words = words_before_cursor(os.environ)
        if words is not None:
            args, context = take_context(words)
            if context is not None:  # the context the completers ask as
                os.environ[_CONTEXT_ENV] = context
    command = command_of(args)
    try:
        (build_app(command) if command is not None else build_index())()
    finally:
        # The interpreter's collection at exit walks every object the imports made
        # (~40 ms of `shell -- true`); frozen, they are left to the process's end.
        gc.freeze()


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
