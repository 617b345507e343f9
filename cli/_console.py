"""Console output shared by every command: data on stdout, diagnostics on stderr."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Any, NoReturn

import typer
from rich.console import Console

__all__ = ["OutputFormat", "err", "fail", "out", "print_json"]

#: Diagnostics and progress; honours NO_COLOR and degrades when not a TTY.
err = Console(stderr=True, highlight=False, soft_wrap=True)
#: Human-readable results.
out = Console(highlight=False, soft_wrap=True)


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


def print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


def fail(message: str, *, code: int = 1) -> NoReturn:
    """Print a one-line error on stderr and exit with ``code``."""
    err.print(f"[bold red]error:[/] {message}", markup=True)
    raise typer.Exit(code)
