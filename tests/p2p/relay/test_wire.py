"""The relay's wire pieces: attach request codec, first-bytes classifier, control messages."""

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2p.keys import KeyPair
from p2p.noise import Handshake
from p2p.relay import (
    ATTACH_MAGIC,
    ATTACH_REQUEST_BYTES,
    PROTOCOL,
    AttachStatus,
    FirstBytes,
    PairParams,
    RefusalCode,
    RelayProtocolError,
    ReservationItem,
    Role,
    classify,
    decode_attach_request,
    encode_attach_request,
    status_for,
)

TOKEN = bytes(range(32))


@given(role=st.sampled_from(list(Role)), token=st.binary(min_size=32, max_size=32))
def test_attach_requests_round_trip(role, token):
    data = encode_attach_request(role, token)
    assert len(data) == ATTACH_REQUEST_BYTES
    request = decode_attach_request(data)
    assert (request.role, request.token) == (role, token)


@given(st.binary(max_size=64))
def test_decoding_arbitrary_bytes_returns_a_request_or_raises_bad_attach(data):
    try:
        request = decode_attach_request(data)
    except RelayProtocolError as exc:
        assert exc.code == RefusalCode.BAD_ATTACH
    else:
        assert encode_attach_request(request.role, request.token) == data


def test_an_unknown_role_byte_is_a_bad_attach():
    data = ATTACH_MAGIC + b"\x03" + TOKEN
    with pytest.raises(RelayProtocolError) as info:
        decode_attach_request(data)
    assert info.value.code == "BAD_ATTACH"


def test_a_secret_stream_first_frame_is_never_taken_for_an_attach():
    first_frame = Handshake(KeyPair.generate(), initiator=True).initiate()
    assert classify(first_frame[:1]) is FirstBytes.CONTROL
    assert classify(first_frame) is FirstBytes.CONTROL


@given(st.binary(max_size=48))
def test_classify_needs_the_whole_magic_and_decides_at_the_first_difference(prefix):
    result = classify(prefix)
    if prefix.startswith(ATTACH_MAGIC):
        assert result is FirstBytes.ATTACH
    elif ATTACH_MAGIC.startswith(prefix):
        assert result is FirstBytes.UNDECIDED
    else:
        assert result is FirstBytes.CONTROL


@given(st.binary(min_size=4, max_size=4))
def test_every_prefix_of_the_magic_is_an_impossible_first_handshake_frame(header):
    # A handshake frame header: u24 LE length <= 1,024 and type 0x00. The magic's
    # first four bytes fall outside that, so no valid first frame begins with them.
    length = int.from_bytes(header[:3], "little")
    if length <= 1024 and header[3] == 0:
        assert not ATTACH_MAGIC.startswith(header)
        assert classify(header) is FirstBytes.CONTROL


def test_attach_refusals_each_have_a_status_byte():
    for code in (RefusalCode.UNKNOWN_TOKEN, RefusalCode.WRONG_ROLE, RefusalCode.ALREADY_ATTACHED,
                 RefusalCode.PAIR_TIMEOUT, RefusalCode.BAD_ATTACH):
        assert status_for(code).name == code.value
    assert AttachStatus.PAIRED == 0


def test_control_messages_take_only_32_byte_binaries():
    assert PROTOCOL == "blind-relay/1"  # fixed: the swarm and other clients code against it
    assert PairParams(target=TOKEN).target == TOKEN
    for bad in (TOKEN[:31], TOKEN.hex(), None):
        with pytest.raises(pydantic.ValidationError):
            PairParams(target=bad)
    assert ReservationItem().token is None  # the acceptance item
    with pytest.raises(pydantic.ValidationError):
        ReservationItem(token=TOKEN)  # a token without its initiator
