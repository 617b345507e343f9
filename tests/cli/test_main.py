"""The ``cosmicac`` entry point: the root help comes from an index of the commands'
own one-line helps, without importing any command's module."""

from __future__ import annotations

import subprocess
import sys

import typer

from cli import main

_PROBE = """
import sys
import cli.main
sys.argv = ["cosmicac", "--help"]
try:
    cli.main.main()
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules
               if m in ("trio", "httpx", "kubernetes", "crdt", "p2p.errors")
               or (m.startswith("cli.") and m not in ("cli.main",)))
print("IMPORTED", heavy)
"""


def _commands(app: typer.Typer) -> dict[str, str]:
    group = typer.main.get_command(app)
    ctx = group.make_context("cosmicac", ["--log-level", "warning", "x"],
                             resilient_parsing=True)
    return {name: group.get_command(ctx, name).get_short_help_str(limit=1000)
            for name in group.list_commands(ctx)}


def test_the_index_lists_every_command_with_its_own_help():
    """The index cannot drift: a command added, renamed or re-documented shows here."""
    assert _commands(main.build_index()) == _commands(main.build_app())


def test_the_root_help_imports_no_command_module():
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                            timeout=60, check=True)
    assert "Usage: cosmicac" in result.stdout and "whoami" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "IMPORTED []"
