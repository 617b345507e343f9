"""LAN beacons: what is signed reads back; anything else is refused with BeaconError
(never another exception); a replayed or older beacon changes nothing; queries are
answered at most once a second."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.keys import KeyPair
from p2p.lan import (
    ANNOUNCE,
    MAX_BEACON_BYTES,
    QUERY,
    BeaconError,
    LanBook,
    decode_beacon,
    encode_beacon,
)
from tests.examples import examples

KEYPAIR = KeyPair.from_seed(b"\x07" * 32)
NOW_MS = 1_796_000_000_000
HOSTS = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))
ADDRESSES = st.lists(st.tuples(HOSTS, st.integers(1, 65535)), min_size=1, max_size=8)


@settings(max_examples=examples(100), deadline=None)
@given(addresses=ADDRESSES, kind=st.sampled_from([ANNOUNCE, QUERY]),
       skew=st.integers(-60_000, 60_000))
def test_a_signed_beacon_reads_back_whole(addresses, kind, skew):
    data = encode_beacon(KEYPAIR, addresses, time_ms=NOW_MS + skew, kind=kind)
    assert len(data) <= MAX_BEACON_BYTES
    beacon = decode_beacon(data, now_ms=NOW_MS)
    assert beacon.public_key == KEYPAIR.public_key and beacon.kind == kind
    assert beacon.addresses == tuple((str(h), p) for h, p in addresses)
    assert beacon.time_ms == NOW_MS + skew


@settings(max_examples=examples(300), deadline=None)
@given(data=st.binary(max_size=MAX_BEACON_BYTES + 20))
def test_any_bytes_are_a_beacon_error_or_nothing_else(data):
    try:
        decode_beacon(data, now_ms=NOW_MS)
    except BeaconError:
        pass


@settings(max_examples=examples(300), deadline=None)
@given(addresses=ADDRESSES, flip=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_a_changed_byte_is_refused(addresses, flip, bit):
    data = bytearray(encode_beacon(KEYPAIR, addresses, time_ms=NOW_MS))
    data[flip % len(data)] ^= 1 << bit
    with pytest.raises(BeaconError):
        decode_beacon(bytes(data), now_ms=NOW_MS)


def test_another_keys_signature_a_stale_time_and_extra_bytes_are_refused():
    data = encode_beacon(KEYPAIR, [("10.0.0.1", 4000)], time_ms=NOW_MS)
    forged = data[:14] + KeyPair.generate().public_key + data[46:]  # someone else's key
    for bad, says in ((forged, "signature"), (data + b"\0", "size|after"),
                      (data[:-1], "signature|size|after")):
        with pytest.raises(BeaconError, match=says):
            decode_beacon(bad, now_ms=NOW_MS)
    with pytest.raises(BeaconError, match="ms from ours"):
        decode_beacon(data, now_ms=NOW_MS + 61_000)
    for wrong in ([], [("10.0.0.1", 4000)] * 9):
        with pytest.raises(ValueError):
            encode_beacon(KEYPAIR, wrong, time_ms=NOW_MS)


def test_the_book_keeps_the_newest_beacon_forgets_after_its_ttl_and_answers_once_a_second():
    book = LanBook(ttl_s=30, max_peers=2)
    first = decode_beacon(encode_beacon(KEYPAIR, [("10.0.0.1", 1)], time_ms=NOW_MS),
                          now_ms=NOW_MS)
    moved = decode_beacon(encode_beacon(KEYPAIR, [("10.0.0.2", 1)], time_ms=NOW_MS + 5),
                          now_ms=NOW_MS)
    assert book.learn(moved, now=0.0)
    assert not book.learn(first, now=1.0)  # older (a replay): nothing changes
    assert book.addresses(KEYPAIR.public_key, now=1.0) == (("10.0.0.2", 1),)
    assert book.stale == 1
    assert book.addresses(KEYPAIR.public_key, now=31.0) == ()  # not heard for 30 s
    for n in range(3):  # bounded: the least recently heard goes first
        other = KeyPair.generate()
        book.learn(decode_beacon(encode_beacon(other, [("10.0.1.1", n + 1)], time_ms=NOW_MS),
                                 now_ms=NOW_MS), now=40.0)
    assert len(book) == 2
    assert book.may_answer(50.0) and not book.may_answer(50.5) and book.may_answer(51.0)
