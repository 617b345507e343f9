"""The ready line every daemon prints: written by one function, read by one parser."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.kit.ready import ReadyLine, find_ready, format_ready, parse_ready, print_ready

KEY = "ab" * 32


def test_a_line_printed_is_read_back_with_its_key_addresses_facts_and_note() -> None:
    out = io.StringIO()
    print_ready("app-node", key=KEY, addresses={"swarm": ("127.0.0.1", 49742),
                                                "http": ("::1", 49751)},
                facts={"database": "cd" * 32}, note="the API at\nhttp://127.0.0.1:49751/api",
                file=out)
    text = out.getvalue()
    assert text == (f"app-node ready key={KEY} swarm=127.0.0.1:49742 http=[::1]:49751 "
                    f"database={'cd' * 32} (the API at http://127.0.0.1:49751/api)\n")
    line = parse_ready(text)
    assert line is not None
    assert (line.daemon, line.key, line.note) == ("app-node", KEY,
                                                  "the API at http://127.0.0.1:49751/api")
    assert line.addresses == {"swarm": ("127.0.0.1", 49742), "http": ("::1", 49751)}
    assert line.fields["database"] == "cd" * 32
    assert line.url("http", "/api") == "http://[::1]:49751/api"
    assert line.port("swarm") == 49742


def test_a_url_fact_is_not_taken_for_an_address() -> None:
    line = parse_ready("entry ready http=127.0.0.1:5173 api=http://127.0.0.1:49751 "
                       "monitor=off")
    assert line is not None and line.key is None
    assert line.addresses == {"http": ("127.0.0.1", 5173)}
    with pytest.raises(KeyError):
        line.address("api")


@pytest.mark.parametrize("text", [
    "wrk-ork 0123 listening on 127.0.0.1:1",  # the lines of before
    "wrk-ork ready key=xyz swarm=127.0.0.1:1",  # not a key
    f"wrk-ork ready key={KEY} key={KEY}",  # a field twice
    "wrk-ork ready swarm=127.0.0.1:1 swarm=127.0.0.1:2",
    "Wrk-ork ready", "wrk-ork  ready", "wrk-ork ready swarm", "",
])
def test_what_is_not_a_ready_line_reads_as_none(text: str) -> None:
    assert parse_ready(text) is None


def test_the_writer_refuses_what_the_parser_would_not_read_back() -> None:
    for line in (ReadyLine("Wrk ork"), ReadyLine("x", key="12"),
                 ReadyLine("x", fields={"api": "two words"}), ReadyLine("x", fields={"key": "1"})):
        with pytest.raises(ValueError):
            format_ready(line)


def test_find_ready_picks_the_daemons_line_among_logs() -> None:
    output = ("Using storage at /x\nServer listening on " + KEY + "\n"
              f"relay ready key={KEY} tcp=127.0.0.1:1 udp=127.0.0.1:1\n")
    assert find_ready(output, "relay").key == KEY  # type: ignore[union-attr]
    assert find_ready(output, "wrk-ork") is None


@given(st.text())
def test_parse_ready_never_raises(text: str) -> None:
    parse_ready(text)


@given(st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True),
       st.dictionaries(st.from_regex(r"[a-jl-z][a-z0-9_]{0,8}", fullmatch=True),
                       st.tuples(st.sampled_from(["127.0.0.1", "::1", "example.org"]),
                                 st.integers(0, 65535)), max_size=4),
       st.text(max_size=40))
def test_every_line_written_reads_back(daemon: str, addresses, note: str) -> None:
    out = io.StringIO()
    print_ready(daemon, key=KEY, addresses=addresses, note=note, file=out)
    line = parse_ready(out.getvalue())
    assert line is not None and (line.daemon, line.key) == (daemon, KEY)
    assert line.addresses == addresses
