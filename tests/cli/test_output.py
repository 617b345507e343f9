"""Listings as scripts and narrow terminals see them (cli/_output.py): every -o mode,
--no-headers, --query, colour, and tables that fit a terminal without cutting an id."""

from __future__ import annotations

import io
import json
import re

import pytest
import typer
import yaml
from hypothesis import given
from hypothesis import strategies as st

from cli._output import Column, Output, cell_width, emit, render_table

COLUMNS = (Column("id"), Column("name", cut=True), Column("status"),
           Column("gpus", drop=2), Column("heard", drop=1), Column("created", wide=True))
JOBS = [{"id": "j-ab4616891b674d80", "name": "a rather long inference job name", "status":
         "running", "gpus": 2},
        {"id": "j-0c77e1d2a9f34b11", "name": "box", "status": "queued", "gpus": 1}]
ROWS = [(j["id"], j["name"], j["status"], j["gpus"], "5m ago", "2026-12-07T04:00:00+00:00")
        for j in JOBS]
BOX_DRAWING = re.compile("[\u2500-\u257f]")


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _printed(output: Output | str, stream: io.StringIO | None = None, **kwargs) -> str:
    stream = stream if stream is not None else io.StringIO()
    emit(output, JOBS, COLUMNS, ROWS, stream=stream, **kwargs)
    return stream.getvalue()


def test_piped_tables_are_plain_aligned_columns_with_whole_cells():
    text = _printed("table")
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATUS", "GPUS", "HEARD"]
    assert not BOX_DRAWING.search(text) and "\x1b" not in text
    assert "j-ab4616891b674d80  a rather long inference job name  running" in lines[1]
    # aligned: every column starts at the same offset on every line
    starts = [line.index("running") for line in lines[1:2]] + [lines[2].index("queued")]
    assert starts[0] == starts[1] == lines[0].index("STATUS")


def test_wide_adds_its_columns_and_no_headers_drops_the_header_line():
    assert "CREATED" in _printed("wide") and "2026-12-07T04:00:00+00:00" in _printed("wide")
    assert "CREATED" not in _printed("table")
    lines = _printed(Output.of("table", no_headers=True)).splitlines()
    assert len(lines) == 2 and lines[0].startswith("j-ab4616891b674d80")


def test_documents_print_as_json_and_yaml_and_names_one_per_line():
    assert json.loads(_printed("json")) == JOBS
    assert yaml.safe_load(_printed("yaml")) == JOBS
    assert _printed("name").splitlines() == [j["id"] for j in JOBS]
    assert _printed("name", names=["x", "y"]).splitlines() == ["x", "y"]


def test_a_query_picks_fields_for_scripts():
    assert _printed(Output.of("table", query="[].id")).splitlines() == [j["id"] for j in JOBS]
    assert _printed(Output.of("table", query="[?status=='queued'].name")) == "box\n"
    assert _printed(Output.of("table", query="length(@)")) == "2\n"
    # objects (not scalars) print as JSON; with -o json/yaml, in that format
    assert json.loads(_printed(Output.of("table", query="[0].{id: id, gpus: gpus}"))) == {
        "id": "j-ab4616891b674d80", "gpus": 2}
    assert yaml.safe_load(_printed(Output.of("yaml", query="[].gpus"))) == [2, 1]


@pytest.mark.parametrize(("mode", "query", "says"), [
    ("tabel", None, "-o takes table, wide, json, yaml or name, not 'tabel'"),
    ("table", "[?status==", "--query is not a JMESPath expression"),
])
def test_a_bad_mode_or_query_is_a_usage_error(mode, query, says, capsys):
    with pytest.raises(typer.Exit) as raised:
        Output.of(mode, query=query)
    assert raised.value.exit_code == 2
    assert says in " ".join(capsys.readouterr().err.split())


def test_control_characters_from_the_server_cannot_reach_the_terminal():
    hostile = [("j-1", "evil\x1b]0;pwned\x07\nname\r\x9b2J", "running", 1, "-", "")]
    for stream in (io.StringIO(), Terminal()):
        emit("table", [], COLUMNS, hostile, stream=stream)
        text = stream.getvalue()
        assert "\x1b" not in text.replace("\x1b[1m", "").replace("\x1b[0m", "")
        assert "\x07" not in text and "\r" not in text and "\x9b" not in text
        assert len(text.splitlines()) == 2 and "evil\\x1b]0;pwned\\x07 name \\x9b2J" in text
    assert _printed("name", names=["a\nb"]) == "a b\n"


def test_a_narrow_terminal_cuts_names_then_drops_columns_and_never_cuts_an_id(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    for width, gone, name in ((200, [], "a rather long inference job name"),
                              (60, [], "a rather long in…"), (45, ["HEARD", "GPUS"],
                                                            "a rather long i…"),
                              (36, ["HEARD", "GPUS"], "a rath…")):
        monkeypatch.setenv("COLUMNS", str(width))
        text = _printed("table", stream=Terminal())
        lines = text.splitlines()
        assert lines[0].startswith("\x1b[1m"), "the header is bold in a terminal"
        plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]
        assert all(cell_width(line) <= width for line in plain), (width, plain)
        for job in JOBS:
            assert any(job["id"] in line for line in plain)
        for header in gone:
            assert header not in plain[0]
        assert name + " " in plain[1]


def test_no_color_and_a_pipe_print_no_escape(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "100")
    assert "\x1b" not in _printed("table", stream=Terminal())


_CELL = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30)


@given(rows=st.lists(st.tuples(st.from_regex(r"j-[0-9a-f]{16}", fullmatch=True), _CELL,
                               _CELL, _CELL), max_size=6),
       width=st.integers(20, 160))
def test_any_rows_at_any_width_keep_ids_whole_and_lines_within_width(rows, width):
    columns = (Column("id"), Column("name", cut=True), Column("message", cut=True),
               Column("extra", drop=1))
    lines = render_table(columns, rows, width=width)
    assert len(lines) == len(rows) + 1, "a cell never adds a line"
    for row, line in zip(rows, lines[1:], strict=True):
        assert line.startswith(row[0])
        assert line.isprintable()
        # the id and the cut columns' floors (6 cells each) fit in 20
        assert cell_width(line) <= max(width, len(row[0]) + 2 + 7 + 2 + 7)
