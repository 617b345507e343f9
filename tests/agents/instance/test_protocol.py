"""cosmicac-shell/1 frames: round trips, refusals, and fuzzed decoders."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.instance._protocol import (
    MAX_DATA_BYTES,
    MAX_FRAME_BYTES,
    Error,
    Exit,
    Open,
    RemoteProtocolError,
    Resize,
    Signal,
    Started,
    Stderr,
    Stdin,
    StdinEof,
    Stdout,
    decode_client,
    decode_server,
    encode,
)

CLIENT_EVENTS = [
    Open(mode="pty", term="xterm-256color", rows=40, cols=120),
    Open(mode="exec", argv=("sh", "-c", "echo hi"), env={"LANG": "C.UTF-8"}),
    Open(mode="pty", argv=("top",), term="vt100"),
    Stdin(b"echo hi\n"), Stdin(b""), StdinEof(), Resize(50, 132), Signal("INT"),
]
SERVER_EVENTS = [
    Started(4242), Stdout(b"hi\r\n"), Stderr(b"oops\n"), Exit(code=3), Exit(signal=9),
    Error("unauthorized", "no"),
]


@pytest.mark.parametrize("event", CLIENT_EVENTS)
def test_client_frames_round_trip(event):
    assert decode_client(encode(event)) == event


@pytest.mark.parametrize("event", SERVER_EVENTS)
def test_server_frames_round_trip(event):
    assert decode_server(encode(event)) == event


@pytest.mark.parametrize("frame", [
    b"", b"\xc1", msgpack.packb([1]), msgpack.packb({"a": 1}), msgpack.packb([99, None]),
    msgpack.packb([17, b"server frame"]),
    msgpack.packb([1, {"mode": "exec", "argv": None, "term": "x", "rows": 1, "cols": 1,
                       "env": {}}]),
    msgpack.packb([1, {"mode": "pty", "argv": None, "term": "x\x1b]", "rows": 1, "cols": 1,
                       "env": {}}]),
    msgpack.packb([1, {"mode": "pty", "argv": None, "term": "x", "rows": 0, "cols": 1,
                       "env": {}}]),
    msgpack.packb([1, {"mode": "pty", "argv": ["a\0b"], "term": "x", "rows": 1, "cols": 1,
                       "env": {}}]),
    msgpack.packb([1, {"mode": "pty", "argv": None, "term": "x", "rows": 1, "cols": 1,
                       "env": {"A=B": "c"}}]),
    msgpack.packb([2, "text, not bytes"]), msgpack.packb([2, bytes(MAX_DATA_BYTES + 1)]),
    msgpack.packb([4, [True, 1]]), msgpack.packb([5, "SEGV"]), msgpack.packb([5, [1]]),
    bytes(MAX_FRAME_BYTES + 1),
])
def test_bad_client_frames_are_refused_with_a_typed_error(frame):
    with pytest.raises(RemoteProtocolError) as caught:
        decode_client(frame)
    assert caught.value.code == "protocol"


def test_an_exit_has_exactly_one_of_code_and_signal():
    for body in ({"code": None, "signal": None}, {"code": 1, "signal": 9}):
        with pytest.raises(RemoteProtocolError):
            decode_server(msgpack.packb([19, body]))


def test_frames_are_bounded():
    with pytest.raises(ValueError):
        encode(Open(mode="exec", argv=("x" * 4000,) * 80))


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=6),
    max_leaves=20,
)


@given(st.binary(max_size=256))
def test_arbitrary_bytes_never_raise_anything_but_a_protocol_error(data):
    for decode in (decode_client, decode_server):
        try:
            decode(data)
        except RemoteProtocolError:
            pass


@given(st.integers(0, 30), msgpack_values)
def test_arbitrary_msgpack_frames_never_raise_anything_but_a_protocol_error(kind, body):
    frame = msgpack.packb([kind, body], use_bin_type=True)
    for decode in (decode_client, decode_server):
        try:
            decode(frame)
        except RemoteProtocolError:
            pass
