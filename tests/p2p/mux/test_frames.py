"""Round trips and fuzzing of the mux frame codec."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.errors import RemoteProtocolError
from p2p.mux._errors import MuxProtocolError
from p2p.mux._frames import (
    MAX_CHANNEL_ID_BYTES,
    Accept,
    Close,
    Credit,
    Data,
    End,
    FrameDecoder,
    MuxCredit,
    Open,
    Reject,
    encode_frame,
    encode_varint,
)
from tests.examples import examples

MAX_FRAME = 1 << 16
channels = st.integers(min_value=0, max_value=(1 << 63) - 1)
small_ints = st.integers(min_value=0, max_value=(1 << 63) - 1)

frames = st.one_of(
    st.builds(Data, channels, st.binary(max_size=512)),
    st.builds(
        Open,
        channels,
        st.text(min_size=1, max_size=40),
        st.binary(max_size=MAX_CHANNEL_ID_BYTES),
        small_ints,
    ),
    st.builds(Accept, channels, channels, small_ints),
    st.builds(Reject, channels, st.integers(min_value=0, max_value=255)),
    st.builds(Credit, channels, small_ints),
    st.builds(End, channels),
    st.builds(Close, channels),
    st.builds(MuxCredit, small_ints),
)


@given(st.lists(frames, max_size=20), st.integers(min_value=1, max_value=64))
def test_every_frame_type_round_trips_whatever_the_read_boundaries(frame_list, chunk):
    wire = b"".join(encode_frame(f) for f in frame_list)
    decoder = FrameDecoder(MAX_FRAME)
    out = []
    for i in range(0, len(wire), chunk):
        out.extend(decoder.feed(wire[i : i + chunk]))
    assert out == frame_list
    assert decoder.buffered_bytes == 0


@given(small_ints)
def test_varints_decode_to_what_was_encoded(value):
    wire = encode_varint(value)
    # A CREDIT frame is the simplest carrier of a varint body.
    frame = encode_frame(Credit(0, value))
    assert wire in frame
    assert FrameDecoder(MAX_FRAME).feed(frame) == [Credit(0, value)]


def _decode_all(data: bytes) -> None:
    decoder = FrameDecoder(MAX_FRAME)
    try:
        decoder.feed(data)
    except RemoteProtocolError as exc:
        assert isinstance(exc, MuxProtocolError)
        assert exc.code.isupper()


@settings(max_examples=examples(300))
@given(st.binary(max_size=300))
def test_arbitrary_bytes_only_yield_frames_or_a_remote_protocol_error(data):
    _decode_all(data)


@settings(max_examples=examples(300))
@given(st.lists(frames, min_size=1, max_size=5), st.data())
def test_mutated_valid_frames_only_yield_frames_or_a_remote_protocol_error(frame_list, data):
    wire = bytearray(b"".join(encode_frame(f) for f in frame_list))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        pos = data.draw(st.integers(min_value=0, max_value=len(wire) - 1))
        action = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if action == "flip":
            wire[pos] ^= data.draw(st.integers(min_value=1, max_value=255))
        elif action == "delete" and len(wire) > 1:
            del wire[pos]
        else:
            wire.insert(pos, data.draw(st.integers(min_value=0, max_value=255)))
    _decode_all(bytes(wire))


def test_a_frame_longer_than_the_limit_is_refused_before_it_is_buffered():
    decoder = FrameDecoder(100)
    with pytest.raises(MuxProtocolError) as info:
        decoder.feed(encode_varint(101))
    assert info.value.code == "FRAME_TOO_LARGE"


def test_a_ten_byte_varint_is_a_bad_varint():
    with pytest.raises(MuxProtocolError) as info:
        FrameDecoder(MAX_FRAME).feed(b"\xff" * 10)
    assert info.value.code == "BAD_VARINT"


def test_an_unknown_frame_type_is_refused():
    with pytest.raises(MuxProtocolError) as info:
        FrameDecoder(MAX_FRAME).feed(bytes([2, 9, 0]))
    assert info.value.code == "UNKNOWN_FRAME_TYPE"


def test_a_small_message_costs_three_header_bytes():
    assert encode_frame(Data(5, b"x")) == bytes([3, 0, 5]) + b"x"


def test_mux_credit_is_addressed_to_channel_zero_only():
    assert encode_frame(MuxCredit(300)) == bytes([4, 7, 0, 0xAC, 0x02])
    with pytest.raises(MuxProtocolError) as info:
        FrameDecoder(MAX_FRAME).feed(bytes([3, 7, 1, 5]))
    assert info.value.code == "BAD_FRAME"
    with pytest.raises(MuxProtocolError):
        FrameDecoder(MAX_FRAME).feed(bytes([4, 7, 0, 5, 0]))  # trailing byte
