"""How listings and ``get`` commands print: one module for every command's ``-o``.

Modes (``-o``): ``table`` (default), ``wide`` (the table with its extra columns),
``json`` and ``yaml`` (the API's document as it is), ``name`` (the ids a command
takes back, one per line). ``--no-headers`` leaves the header line out;
``--query`` picks fields with a JMESPath expression (as the AWS CLI's ``--query``):
with ``-o json``/``yaml`` its result is printed in that format, otherwise a scalar
as it is and a list of scalars one per line (``jobs list --query '[].id'``).

A table is plain aligned columns, never box drawing: through a pipe (or a file)
every column at its full width, no colour, so a line is a row and a cell is never
cut; in a terminal the table fits the width by cutting the cells that may be cut
(names, messages: with an ellipsis) and then dropping the least useful columns,
never by cutting an id. Cells come from the server, so control characters in them
are shown escaped: a job name cannot move the cursor, clear the screen or add a line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import typer

from ._completion import output_modes
from ._console import fail

__all__ = ["MODES", "Column", "Output", "emit", "layout", "no_headers_option",
           "output_option", "query_option", "render_table", "terminal_width", "use_color"]

MODES = ("table", "wide", "json", "yaml", "name")
USAGE = 2  # the CLI's exit code for a usage error (cli.session.USAGE)
_GAP = "  "
_ELLIPSIS = "…"
#: A cuttable cell is cut to this many cells before any column is dropped...
_LEGIBLE = 16
#: ...and never below this many.
_MIN_CUT = 6


def output_option() -> Any:
    return typer.Option("table", "--output", "-o",
                        help="table, wide (more columns), json, yaml, or name (the ids, "
                             "one per line).", autocompletion=output_modes)


def no_headers_option() -> Any:
    return typer.Option(False, "--no-headers", help="Leave out the header line of tables.")


def query_option() -> Any:
    return typer.Option(None, "--query", metavar="JMESPATH",
                        help="Print only what this JMESPath expression picks from the "
                             "JSON document, e.g. '[].id' or \"[?status=='running'].name\".")


@dataclass(frozen=True)
class Column:
    """A table's column. By default a column is always shown and never cut."""

    header: str
    #: May be cut to fit a narrow terminal, ending in "…" (a name, a message; never an id).
    cut: bool = False
    #: Dropped to fit a narrow terminal: the larger, the sooner (0: never dropped).
    drop: int = 0
    #: Shown with ``-o wide`` only.
    wide: bool = False


@dataclass(frozen=True)
class Output:
    """What ``-o``, ``--no-headers`` and ``--query`` asked for, checked."""

    mode: str = "table"
    headers: bool = True
    query: str | None = None

    @classmethod
    def of(cls, mode: str, no_headers: bool = False, query: str | None = None) -> Output:
        if mode not in MODES:
            fail(f"-o takes {', '.join(MODES[:-1])} or {MODES[-1]}, not {mode!r}", code=USAGE)
        if query is not None:
            _compile(query)  # a bad expression is a usage error before any request
        return cls(mode, not no_headers, query)

    @property
    def is_document(self) -> bool:
        """Whether the API's document is printed (json, yaml, a query), not a table."""
        return self.mode in ("json", "yaml") or self.query is not None


def _compile(query: str) -> Any:
    import jmespath  # here: only a --query pays for it
    from jmespath.exceptions import ParseError

    try:
        return jmespath.compile(query)
    except ParseError as exc:
        fail(f"--query is not a JMESPath expression: {' '.join(str(exc).split())}",
             code=USAGE)


def use_color(stream: TextIO | None = None) -> bool:
    """Colour only on a terminal, never with ``NO_COLOR`` (no-color.org: any non-empty
    value) or ``--no-color`` (which sets it)."""
    stream = stream or sys.stdout
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb" and \
        stream.isatty()


def terminal_width(stream: TextIO | None = None) -> int | None:
    """The terminal's width, or None when ``stream`` is not a terminal (a pipe, a
    file: nothing is cut there). ``COLUMNS`` wins, as in every Unix tool."""
    stream = stream or sys.stdout
    if not stream.isatty():
        return None
    return shutil.get_terminal_size((80, 24)).columns


# -- cells --------------------------------------------------------------------------


def _safe(value: Any) -> str:
    """A cell's text on one line with no control character (escaped as ``\\xNN``)."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else
                   (" " if ch in "\t\n\r" else f"\\x{ord(ch):02x}" if ord(ch) < 256 else
                    f"\\u{ord(ch):04x}") for ch in text)


def cell_width(text: str) -> int:
    """Terminal cells ``text`` takes: East Asian wide characters two, combining none."""
    if text.isascii():
        return len(text)
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, ending in "…" when it was longer."""
    if cell_width(text) <= width:
        return text
    kept, used = [], 0
    for ch in text:
        size = cell_width(ch)
        if used + size > width - 1:
            break
        kept.append(ch)
        used += size
    return "".join(kept) + _ELLIPSIS


def _pad(text: str, width: int) -> str:
    return text + " " * (width - cell_width(text))


# -- tables -------------------------------------------------------------------------


def layout(columns: Sequence[Column], widths: Sequence[int],
           width: int | None) -> tuple[list[int], list[int]]:
    """Which columns to show and how wide: ``(shown indexes, their widths)``.

    ``widths`` are the columns' natural widths (widest cell or header). With no
    ``width`` (not a terminal) every column at its natural width. Otherwise: cut the
    cuttable columns (widest first) no shorter than :data:`_LEGIBLE` cells, dropping
    the droppable ones (largest ``drop`` first) while that is not enough; then cut
    them down to :data:`_MIN_CUT`. What is left of ids is shown whole even if it does
    not fit (the terminal folds the line, but no id is ever cut)."""
    shown = list(range(len(columns)))
    if width is None:
        return shown, list(widths)
    droppable = sorted((i for i, c in enumerate(columns) if c.drop),
                       key=lambda i: (-columns[i].drop, -i))
    for floor in (_LEGIBLE, _MIN_CUT):
        while True:
            sized = _fit(columns, widths, shown, width, floor)
            if sized is not None:
                return shown, sized
            if not droppable:
                break
            shown.remove(droppable.pop(0))
    return shown, _floors(columns, widths, shown, _MIN_CUT)


def _floors(columns: Sequence[Column], widths: Sequence[int], shown: list[int],
            floor: int) -> list[int]:
    return [min(widths[i], max(floor, len(columns[i].header))) if columns[i].cut
            else widths[i] for i in shown]


def _fit(columns: Sequence[Column], widths: Sequence[int], shown: list[int],
         width: int, floor: int) -> list[int] | None:
    """Widths for ``shown`` within ``width`` by cutting cuttable columns no shorter
    than ``floor``, or None if that is not enough."""
    sized = {i: widths[i] for i in shown}
    floors = dict(zip(shown, _floors(columns, widths, shown, floor), strict=True))
    total = sum(sized.values()) + len(_GAP) * (len(shown) - 1)
    if total <= width:
        return [sized[i] for i in shown]
    excess = total - width
    if excess > sum(sized[i] - floors[i] for i in shown):
        return None
    # Take from the widest cuttable column, one cell at a time (a few hundred at most).
    for _ in range(excess):
        widest = max((i for i in shown if sized[i] > floors[i]), key=lambda i: sized[i])
        sized[widest] -= 1
    return [sized[i] for i in shown]


def render_table(columns: Sequence[Column], rows: Iterable[Sequence[Any]], *,
                 headers: bool = True, width: int | None = None,
                 color: bool = False) -> list[str]:
    """The table's lines (no line break at their end)."""
    cells = [[_safe(cell) for cell in row] for row in rows]
    titles = [column.header.upper() for column in columns]
    widths = [max([cell_width(titles[i]) if headers else 0,
                   *(cell_width(row[i]) for row in cells)]) for i in range(len(columns))]
    shown, sized = layout(columns, widths, width)
    lines = []
    for row, is_header in ([(titles, True)] if headers else []) + [(r, False) for r in cells]:
        parts = [_pad(_cut(row[i], size), size) for i, size in zip(shown, sized, strict=True)]
        line = _GAP.join(parts).rstrip()
        if is_header and color:
            line = f"\x1b[1m{line}\x1b[0m"
        lines.append(line)
    return lines


# -- emit ---------------------------------------------------------------------------


def _print_document(output: Output, document: Any, stream: TextIO) -> None:
    if output.query is not None:
        document = _compile(output.query).search(document)
        if output.mode not in ("json", "yaml"):
            values = document if isinstance(document, list) else [document]
            if all(v is None or isinstance(v, str | int | float | bool) for v in values):
                for value in values:
                    stream.write(("" if value is None else _scalar(value)) + "\n")
                return
            output = Output("json")
    if output.mode == "yaml":
        import yaml  # here: only -o yaml pays for it

        stream.write(yaml.safe_dump(document, sort_keys=False, allow_unicode=True,
                                    default_flow_style=False))
    else:
        stream.write(json.dumps(document) + "\n")


def _scalar(value: str | int | float | bool) -> str:
    return json.dumps(value) if isinstance(value, bool) else _safe(value)


def emit(output: Output | str, document: Any, columns: Sequence[Column | str] = (),
         rows: Iterable[Sequence[Any]] = (), *, names: Iterable[Any] | None = None,
         title: str | None = None, stream: TextIO | None = None) -> None:
    """Print a listing or a ``get``: ``document`` (the API's JSON) for json, yaml and a
    query; ``names`` (default: the first column) for ``-o name``; else ``rows`` as a
    table (``wide`` columns with ``-o wide`` only). ``title`` heads a table shown in a
    terminal (a pipe gets rows only)."""
    if isinstance(output, str):
        output = Output.of(output)
    stream = stream or sys.stdout
    if output.is_document:
        _print_document(output, document, stream)
    elif output.mode == "name":
        listed = names if names is not None else (row[0] for row in rows)
        for name in listed:
            stream.write(_safe(name) + "\n")
    else:
        specs = [c if isinstance(c, Column) else Column(c) for c in columns]
        keep = [i for i, c in enumerate(specs) if output.mode == "wide" or not c.wide]
        width = terminal_width(stream)
        color = use_color(stream)
        if title and width is not None and output.headers:
            stream.write((f"\x1b[1m{title}\x1b[0m" if color else title) + "\n")
        for line in render_table([specs[i] for i in keep], ([row[i] for i in keep]
                                                           for row in rows),
                                 headers=output.headers, width=width, color=color):
            stream.write(line + "\n")
    stream.flush()
