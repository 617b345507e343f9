"""Help texts: every command's help ends with its examples, after its options (as
``gh``'s does): a docstring's ``Example:`` paragraphs become the command's epilog, and
a note added to many commands (the exit codes) goes before them."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import typer

__all__ = ["add_note", "before_examples", "examples_last", "is_example", "split_examples"]


def is_example(paragraph: str) -> bool:
    """Whether a help paragraph is an example (``Example: ...``, ``Examples:``, or a
    ``\\b`` block that starts with one)."""
    return paragraph.strip().removeprefix("\b").strip().startswith("Example")


def before_examples(doc: str, note: str) -> str:
    """``doc`` (a docstring, indented) with ``note`` as a paragraph of its own before
    the first example, or at the end when it has none."""
    paragraphs = doc.rstrip().split("\n\n")
    at = next((i for i, p in enumerate(paragraphs) if i and is_example(p)), len(paragraphs))
    paragraphs.insert(at, f"    {note}")
    return "\n\n".join(paragraphs) + "\n    "


def add_note(commands: Iterable[Callable[..., Any]], note: str) -> None:
    """Add ``note`` before the examples of each command's help (its docstring)."""
    for command in commands:
        command.__doc__ = before_examples(command.__doc__ or "", note)


def split_examples(doc: str) -> tuple[str, str | None]:
    """A docstring as (its text, its examples): the ``Example`` paragraphs from the
    first on, each on one line (a wrapped example is joined back)."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    at = next((i for i, p in enumerate(paragraphs) if i and is_example(p)), None)
    if at is None:
        return "\n\n".join(paragraphs), None
    text = "\n\n".join(paragraphs[:at])
    examples = [" ".join(p.replace("\b", "").split()) for p in paragraphs[at:]]
    return text, "\n\n".join(examples)


def examples_last(app: typer.Typer) -> None:
    """Move each command's examples (in ``app`` and its groups) into its epilog, so
    ``--help`` shows them after the options. Done once per command."""
    for info in app.registered_commands:
        if info.epilog is None and info.callback is not None:
            text, examples = split_examples(info.help or info.callback.__doc__ or "")
            info.help, info.epilog = text, examples
    for group in app.registered_groups:
        if group.typer_instance is not None:
            examples_last(group.typer_instance)
