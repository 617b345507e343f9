"""contracts.monitor: records within bounds, batches round-trip, and the decoder
fed anything returns records or raises BadBatch, never another exception."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.monitor import (
    CUT_MARKER,
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    MAX_TEXT_CHARS,
    BadBatch,
    LogRecord,
    decode_batch,
    encode_batch,
    make_record,
    split_batches,
)
from tests.examples import examples


def test_long_text_is_cut_with_a_marker_never_refused():
    r = make_record("a" * (MAX_TEXT_CHARS * 3), service="s" * 100, level=999, source="Nope")
    assert len(r.text) == MAX_TEXT_CHARS and r.text.endswith(CUT_MARKER)
    assert len(r.service) == 64 and r.level == 100 and r.source == "System"
    assert decode_batch(encode_batch([r])) == [r]


#: Any Python string, lone surrogates included (hypothesis's text() leaves them out).
any_str = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)),
                   max_size=80).map("".join)


@given(any_str, any_str, st.one_of(st.none(), any_str))
@settings(max_examples=examples(300))
def test_any_python_string_makes_a_record_that_encodes(text, service, job_id):
    # Lone surrogates included (a file name decoded with surrogateescape): one
    # such line must not fail its whole batch.
    r = make_record(text, service=service, job_id=job_id)
    assert decode_batch(encode_batch([r])) == [r]


def test_a_lone_surrogate_is_escaped_and_ordinary_text_kept():
    assert make_record("bad \udcff byte", service="x").text == "bad \\udcff byte"
    assert make_record("été ✓", service="x").text == "été ✓"


def test_batches_round_trip():
    records = [make_record(f"line {i}", service="wrk-ork", job_id="j-1", replica=i % 3,
                           source="Application", level=30, time_ns=i) for i in range(500)]
    got = decode_batch(encode_batch(records))
    assert got == records and all(type(r) is LogRecord for r in got)


@pytest.mark.parametrize("bad, why", [
    (b"\xc1", "not msgpack"),
    (msgpack.packb({"a": 1}), "not msgpack"),  # maps are not allowed at all
    (msgpack.packb(5), "not an array"),
    (msgpack.packb([[1, None, None, "System", 20, "s"]]), "7-element"),
    (msgpack.packb([[-1, None, None, "System", 20, "s", "t"]]), "time_ns"),
    (msgpack.packb([[1, 5, None, "System", 20, "s", "t"]]), "job_id"),
    (msgpack.packb([[1, None, -2, "System", 20, "s", "t"]]), "replica"),
    (msgpack.packb([[1, None, None, "Kernel", 20, "s", "t"]]), "source"),
    (msgpack.packb([[1, None, None, "System", 200, "s", "t"]]), "level"),
    (msgpack.packb([[1, None, None, "System", 20, "s" * 65, "t"]]), "service"),
    (msgpack.packb([[1, None, None, "System", 20, "s", "t" * (MAX_TEXT_CHARS + 1)]]), "text"),
    (msgpack.packb([[1, None, None, "System", 20, "s", "t"]] * (MAX_BATCH_RECORDS + 1)),
     "not msgpack"),
    (b"\x90" * (MAX_BATCH_BYTES + 1), "bytes, over"),
])
def test_bad_batches_are_refused_with_a_reason(bad, why):
    with pytest.raises(BadBatch, match=why):
        decode_batch(bad)


def test_split_batches_respects_count_and_bytes():
    small = [make_record("x", service="s") for _ in range(2500)]
    sizes = [len(c) for c in split_batches(small)]
    assert sum(sizes) == 2500 and max(sizes) <= MAX_BATCH_RECORDS and len(sizes) <= 3
    assert [len(c) for c in split_batches(small[:900], max_records=500)] == [500, 400]
    big = [make_record("é" * MAX_TEXT_CHARS, service="s") for _ in range(40)]
    chunks = list(split_batches(big))
    assert sum(map(len, chunks)) == 40
    assert all(len(encode_batch(c)) <= MAX_BATCH_BYTES for c in chunks)


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=5), inner,
                                                                  max_size=4),
    max_leaves=30)
_record_like = st.tuples(st.integers(-5, 2**64 - 1), st.none() | st.text(max_size=70),
                         st.none() | st.integers(-5, 2**17), st.sampled_from(
                             ["System", "Application", "x", ""]), st.integers(-5, 120),
                         st.text(max_size=70), st.text(max_size=30))


def _decodes_or_bad_batch(data: bytes) -> None:
    try:
        records = decode_batch(data)
    except BadBatch:
        return
    assert all(type(r) is LogRecord for r in records)


@settings(max_examples=examples(150), deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_any_bytes(data):
    _decodes_or_bad_batch(data)


@settings(max_examples=examples(150), deadline=None)
@given(_values)
def test_fuzz_any_msgpack_value(value):
    _decodes_or_bad_batch(msgpack.packb(value, use_bin_type=True))


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(_record_like | _values, max_size=10), st.integers(0, 400), st.binary(max_size=4))
def test_fuzz_record_like_and_mutated(records, cut, junk):
    data = msgpack.packb(records, use_bin_type=True)
    _decodes_or_bad_batch(data)
    _decodes_or_bad_batch(data[:cut] + junk + data[cut:])
