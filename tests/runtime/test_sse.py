"""Server-sent events written and read back, whatever the data and however split."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.sse import SseReader, encode, sse_events

LINES = re.compile(r"\r\n|\r|\n")


def read(wire: str) -> list[tuple[str, str]]:
    return [event for event in sse_events(LINES.split(wire)) if event[0]]


@given(st.lists(st.tuples(st.sampled_from(["message", "status", "job"]), st.text()),
                max_size=5))
def test_what_is_written_is_read_back_with_its_line_breaks_as_newlines(events):
    wire = "".join(encode(data, event=name) for name, data in events)
    assert read(wire) == [(name, LINES.sub("\n", data)) for name, data in events]


@given(st.text(max_size=300))
def test_any_text_gives_events_or_nothing_never_an_error(wire):
    reader = SseReader()
    for line in LINES.split(wire):
        got = reader.line(line)
        assert got is None or isinstance(got, tuple)


def test_ids_and_comments_and_an_event_field_cannot_smuggle_a_line():
    assert encode("a\nb", event="status", id=7) == "event: status\nid: 7\ndata: a\ndata: b\n\n"
    assert list(sse_events([": keep-alive", "", "data: x", ""])) == [("", ""),
                                                                    ("message", "x")]
    with pytest.raises(ValueError):
        encode("x", event="status\ndata: forged")
    with pytest.raises(ValueError):
        encode("x", id="1\rdata: forged")


def test_the_last_id_stays_until_another_and_one_with_a_nul_is_ignored():
    reader = SseReader()
    for line in ["id: a:1", "data: x", "", "data: y", "", "id: b\0", "data: z", ""]:
        reader.line(line)
        if line == "data: y":
            assert reader.last_id == "a:1"  # kept across events, as a browser keeps it
    assert reader.last_id == "a:1"
    reader.line("id: a:2")
    assert reader.last_id == "a:2"
