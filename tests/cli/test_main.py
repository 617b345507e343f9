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


def test_every_command_sits_in_exactly_one_panel():
    in_panels = [name for names in main.PANELS.values() for name in names]
    assert sorted(in_panels) == sorted([*main._GROUPS, *main._COMMANDS])
    assert len(in_panels) == len(set(in_panels))


def test_the_root_help_groups_commands_by_audience_in_panel_order():
    from typer.testing import CliRunner

    for app in (main.build_index(), main.build_app()):
        text = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
        panels = [text.index(f"─ {panel} ") for panel in main.PANELS]
        assert panels == sorted(panels), "panels out of order"
        for panel, names in main.PANELS.items():
            start = text.index(f"─ {panel} ")
            body = text[start:text.index("╰", start)]
            listed = [line.split()[1] for line in body.splitlines()[1:]
                      if len(line.split()) > 1 and line.split()[1] in names]
            assert listed == list(names), panel


def test_a_mistyped_command_suggests_the_nearest_one():
    from typer.testing import CliRunner

    for app in (main.build_index(), main.build_app()):
        top = CliRunner().invoke(app, ["jbos", "list"])
        assert top.exit_code == 2 and "Did you mean 'jobs'?" in top.output
    nested = CliRunner().invoke(main.build_app(), ["jobs", "lsit"])
    assert nested.exit_code == 2 and "Did you mean 'list'?" in nested.output


def _leaves(command, path=()):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _leaves(sub, (*path, name))
    else:
        yield " ".join(path), command


def test_every_command_s_help_ends_with_examples_after_its_options():
    from typer.testing import CliRunner

    app = main.build_app()
    leaves = dict(_leaves(typer.main.get_command(app)))
    assert len(leaves) > 70
    without = [name for name, command in leaves.items() if not command.epilog]
    assert without == [], "commands without examples"
    for name, command in leaves.items():
        for example in command.epilog.split("\n\n"):
            assert example.startswith("Example") and "cosmicac " in example, (name, example)
            assert "Example" not in (command.help or ""), (name, "an example left above")
    shown = CliRunner().invoke(app, ["jobs", "list", "--help"], env={"COLUMNS": "200"})
    lines = [line.strip() for line in shown.output.splitlines() if line.strip()]
    assert lines[-1].startswith("Example: cosmicac jobs list")
    assert lines.index("Example: cosmicac jobs list --all -o json") > max(
        i for i, line in enumerate(lines) if "--no-headers" in line)


def test_a_note_goes_before_the_examples():
    from cli._help import before_examples, split_examples

    doc = """Do it.

    More about it.

    Example: cosmicac do it
    """
    noted = before_examples(doc, "Exit codes: 0 done.")
    assert split_examples(noted) == ("Do it.\n\nMore about it.\n\nExit codes: 0 done.",
                                     "Example: cosmicac do it")
    assert split_examples("Do it.") == ("Do it.", None)


def test_no_color_is_taken_anywhere_before_the_double_dash():
    assert main.take_no_color(["jobs", "list", "--no-color"]) == (["jobs", "list"], True)
    assert main.take_no_color(["--no-color", "jobs", "list"]) == (["jobs", "list"], True)
    assert main.take_no_color(["shell", "j-1", "--", "ls", "--no-color"]) == (
        ["shell", "j-1", "--", "ls", "--no-color"], False)
