"""The hole-punch signalling messages: what decodes, and that nothing else does."""

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2p.punch import Connect, PunchMessageError, Skip, Sync
from p2p.punch._messages import MAX_HOSTS, decode, encode


def test_each_message_round_trips():
    for message in (Connect(nat="consistent", port=4000, hosts=["198.51.100.1", "10.0.0.2"]),
                    Sync(), Skip(reason="random_nat")):
        assert decode(encode(message)) == message


@pytest.mark.parametrize("raw", [
    {"t": "connect", "nat": "consistent", "port": 0, "hosts": []},
    {"t": "connect", "nat": "consistent", "port": 70000, "hosts": []},
    {"t": "connect", "nat": "weird", "port": 1, "hosts": []},
    {"t": "connect", "nat": "open", "port": 1, "hosts": ["not-an-ip"]},
    {"t": "connect", "nat": "open", "port": 1, "hosts": ["10.0.0.1"] * (MAX_HOSTS + 1)},
    {"t": "skip", "reason": "x" * 65},
    {"t": "hello"},
    ["connect"],
])
def test_bad_messages_are_refused_with_a_typed_error(raw):
    with pytest.raises(PunchMessageError):
        decode(msgpack.packb(raw))


def test_an_oversized_message_is_refused_before_it_is_parsed():
    with pytest.raises(PunchMessageError, match="too long"):
        decode(b"\x00" * 2000)


@given(st.binary(max_size=300))
def test_any_bytes_decode_or_raise_the_typed_error(data):
    try:
        decode(data)
    except PunchMessageError:
        pass
