"""The wire of cosmicac-mq/1 and the receiver's state, without I/O; every decoder fuzzed."""

from __future__ import annotations

import os

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.log import Head
from p2p.queue import BadQueueMessage
from p2p.queue._cursor import PositionFile
from p2p.queue._messages import (
    Entries,
    Receiver,
    Status,
    decode_entry,
    decode_message,
    encode_entries,
    encode_entry,
    encode_status,
    head_namespace,
)
from tests.examples import examples

HEAD = Head(3, bytes(32), bytes(64))
ENTRY = encode_entry("job-1", b"op")


def test_messages_round_trip():
    assert decode_message(encode_status(7, 5)) == Status(7, 5)
    assert decode_message(encode_entries(4, [ENTRY], HEAD)) == Entries(4, (ENTRY,), HEAD)
    assert decode_message(encode_entries(0, [], None)) == Entries(0, (), None)
    assert decode_entry(encode_entry("k", b"\x00" * 9)) == ("k", b"\x00" * 9)


@pytest.mark.parametrize(("data", "code"), [
    (b"", "DECODE_ERROR"),
    (b"\xc1", "DECODE_ERROR"),
    (msgpack.packb({"a": 1}), "DECODE_ERROR"),
    (msgpack.packb([]), "DECODE_ERROR"),
    (msgpack.packb([9, 1]), "BAD_TYPE"),
    (msgpack.packb([1, 1]), "DECODE_ERROR"),
    (msgpack.packb([1, -1, 0]), "DECODE_ERROR"),
    (msgpack.packb([1, True, 0]), "DECODE_ERROR"),
    (msgpack.packb([1, 2, 3]), "ACK_AHEAD"),
    (msgpack.packb([1, 1 << 64 - 1, 0]), "DECODE_ERROR"),
    (msgpack.packb([2, 0, ["str"], None]), "DECODE_ERROR"),
    (msgpack.packb([2, 0, [], [1, bytes(31), bytes(64)]]), "DECODE_ERROR"),
    (msgpack.packb([2, 0, [], [1, bytes(32), bytes(63)]]), "DECODE_ERROR"),
    (msgpack.packb([2, 0, b"x", None]), "DECODE_ERROR"),
    (msgpack.packb([1, 0, 0]) + b"\x00", "DECODE_ERROR"),
])
def test_malformed_messages_are_refused_with_a_code(data, code):
    with pytest.raises(BadQueueMessage) as refused:
        decode_message(data)
    assert refused.value.code == code


@settings(max_examples=examples(500))
@given(st.binary(max_size=300))
def test_fuzz_decode_message_bytes(data):
    try:
        decode_message(data)
    except BadQueueMessage:
        pass


_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.binary(max_size=70) | st.text(max_size=8) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=20)


@settings(max_examples=examples(500))
@given(st.integers(min_value=0, max_value=4), st.lists(_values, max_size=5))
def test_fuzz_decode_message_structures(kind, rest):
    """Well-formed msgpack of the wrong shape: a value or BadQueueMessage, nothing else."""
    try:
        message = decode_message(msgpack.packb([kind, *rest], use_bin_type=True))
    except BadQueueMessage:
        return
    assert isinstance(message, Status | Entries)


@settings(max_examples=examples(300))
@given(_values)
def test_fuzz_decode_entry(value):
    try:
        key, payload = decode_entry(msgpack.packb(value, use_bin_type=True))
    except BadQueueMessage as exc:
        assert exc.code == "BAD_ENTRY"
    else:
        assert isinstance(key, str) and isinstance(payload, bytes)


@settings(max_examples=examples(300))
@given(st.binary(max_size=100))
def test_fuzz_decode_entry_bytes(data):
    try:
        decode_entry(data)
    except BadQueueMessage:
        pass


# --- the receiver ---------------------------------------------------------------------------


def entries(n, start=0):
    return tuple(encode_entry("k", b"%d" % i) for i in range(start, start + n))


def test_receiver_takes_a_run_ending_in_a_head():
    receiver = Receiver(0, 1 << 20)
    run = receiver.offer(Entries(0, entries(3), HEAD))
    assert run == (list(entries(3)), HEAD)
    assert receiver.have == 3 and receiver.pending == 0


def test_receiver_holds_pieces_until_the_head():
    receiver = Receiver(0, 1 << 20)
    assert receiver.offer(Entries(0, entries(2), None)) is None
    assert receiver.pending == 2
    run = receiver.offer(Entries(2, entries(1, 2), HEAD))
    assert run == (list(entries(3)), HEAD)


def test_receiver_drops_what_it_has_and_refuses_gaps():
    receiver = Receiver(3, 1 << 20)
    assert receiver.offer(Entries(0, entries(3), HEAD)) is None  # a repeat
    with pytest.raises(BadQueueMessage) as gap:
        receiver.offer(Entries(4, entries(1), None))
    assert gap.value.code == "GAP"
    head5 = Head(5, bytes(32), bytes(64))
    run = receiver.offer(Entries(1, entries(4, 1), head5))  # overlaps: the new part only
    assert run == (list(entries(2, 3)), head5)


def test_receiver_refuses_a_head_that_does_not_end_the_run():
    receiver = Receiver(0, 1 << 20)
    with pytest.raises(BadQueueMessage) as refused:
        receiver.offer(Entries(0, entries(2), HEAD))
    assert refused.value.code == "BAD_LENGTH"


def test_receiver_bounds_what_it_holds():
    receiver = Receiver(0, 100)
    big = (encode_entry("k", bytes(60)),)
    assert receiver.offer(Entries(0, big, None)) is None
    with pytest.raises(BadQueueMessage) as refused:
        receiver.offer(Entries(1, big, None))
    assert refused.value.code == "RUN_TOO_LARGE"


def test_receiver_refuses_an_entry_that_is_not_key_and_payload():
    receiver = Receiver(0, 1 << 20)
    with pytest.raises(BadQueueMessage) as refused:
        receiver.offer(Entries(0, (b"\xc1",), None))
    assert refused.value.code == "BAD_ENTRY"


@settings(max_examples=examples(200))
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 5), st.booleans()), max_size=12))
def test_fuzz_receiver(messages):
    """Any sequence of ENTRIES: the receiver refuses with BadQueueMessage or hands out
    runs that continue exactly what it stores."""
    receiver = Receiver(0, 1 << 12)
    had = 0
    for start, count, with_head in messages:
        tail = receiver.have + receiver.pending
        head = Head(start + count, bytes(32), bytes(64)) if with_head else None
        try:
            run = receiver.offer(Entries(start, entries(count, start), head))
        except BadQueueMessage:
            return
        if run is not None:
            payloads, run_head = run
            assert run_head.length == receiver.have
            assert run_head.length - len(payloads) == had
            assert len(payloads) >= tail - had
        had = receiver.have


def test_head_namespaces_bind_the_recipient():
    assert head_namespace(b"\x01" * 32) != head_namespace(b"\x02" * 32)


# --- the cursor file ------------------------------------------------------------------------


def test_position_file_survives_a_torn_slot(tmp_path):
    path = tmp_path / "acked"
    cursor = PositionFile(path, fsync=True)
    for position in (1, 2, 3):
        cursor.write(position)
    cursor.write(2)  # never goes back
    cursor.close()
    assert PositionFile(path, fsync=False).position == 3
    # Tear the slot written last (position 3 went to slot 0): the other one holds.
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"\xff\xff", 6)
    os.close(fd)
    reopened = PositionFile(path, fsync=False)
    assert reopened.position == 2
    reopened.write(4)
    reopened.close()
    assert PositionFile(path, fsync=False).position == 4


@settings(max_examples=examples(200))
@given(st.binary(max_size=8200))
def test_fuzz_position_file(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cursor") / "acked"
    path.write_bytes(data)
    cursor = PositionFile(path, fsync=False)
    assert cursor.position >= 0
    cursor.close()
