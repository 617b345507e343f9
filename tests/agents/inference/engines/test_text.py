"""TextAssembler: byte pieces in, text out, cut at the first stop string, never retracted."""

from __future__ import annotations

import codecs
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.inference.engines._text import TextAssembler
from tests.examples import examples


def expected(pieces: list[bytes], stops: list[str]) -> tuple[str, int | None]:
    """The oracle: after each piece, look for any stop in the whole text so far."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = ""
    for index, piece in enumerate(pieces):
        text += decoder.decode(piece)
        found = [text.find(s) for s in stops if s and s in text]
        if found:
            return text[: min(found)], index
    return text + decoder.decode(b"", final=True), None


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


alphabet = st.sampled_from(list("ab \né"))


@settings(max_examples=examples(500), deadline=None)
@given(
    text=st.text(alphabet, max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=12),
    stops=st.lists(st.text(alphabet, max_size=4), max_size=3),
    trim=st.booleans(),
)
def test_streamed_text_is_the_cut_text(
    text: str, cuts: list[int], stops: list[str], trim: bool
) -> None:
    pieces = split(text.encode(), cuts)
    assembler = TextAssembler(stops, trim=trim)
    out = ""
    stopped_at = None
    for index, piece in enumerate(pieces):
        out += assembler.feed(piece)
        assert (text.strip() if trim else text).startswith(out)
        if assembler.stopped:
            stopped_at = index
            break
    else:
        out += assembler.flush()
    want, want_index = expected(pieces, stops)
    if trim:
        want = want.strip()
    assert (out, stopped_at) == (want, want_index)
    assert assembler.text == out


def test_holds_back_only_a_possible_stop_start() -> None:
    assembler = TextAssembler(["\nUser:"])
    assert assembler.feed(b"Paris.") == "Paris."
    assert assembler.feed(b"\nUs") == ""  # might be the stop string
    assert assembler.feed(b"a") == "\nUsa"  # it was not
    assert assembler.feed(b"\nUser: hi") == ""
    assert assembler.stopped and assembler.text == "Paris.\nUsa"
    assert assembler.feed(b"more") == "" and assembler.flush() == ""


def test_trim_drops_outer_whitespace_only() -> None:
    assembler = TextAssembler(["\nUser:"], trim=True)
    assert [assembler.feed(p) for p in [b" ", b" Paris", b" is", b"\n", b" big", b".\n"]] == [
        "", "Paris", " is", "", "\n big", "."
    ]
    assert assembler.feed(b"User: next") == "" and assembler.text == "Paris is\n big."


def test_split_characters_wait_for_their_last_byte() -> None:
    assembler = TextAssembler()
    data = "é".encode()
    assert assembler.feed(data[:1]) == ""
    assert assembler.feed(data[1:]) == "é"
    assert assembler.feed(data[:1]) == ""
    assert assembler.flush() == "\ufffd"
