"""Signed peer records: encoding, decoding of hostile input, signatures, lifetimes."""

from __future__ import annotations

import dataclasses
import hashlib

import msgpack
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from p2p.dht._errors import DhtDecodeError, DhtUsageError, RecordRejected
from p2p.dht._records import (
    CLOCK_SKEW_S,
    MAX_RECORD_TTL_S,
    NS_ANNOUNCE,
    NS_UNANNOUNCE,
    PeerRecord,
    record_topic_for_key,
    sign_record,
    sign_unannounce,
    verify_record,
    verify_unannounce,
)
from p2p.errors import RemoteProtocolError
from p2p.keys import KeyPair, derive_topic

NOW = 1_700_000_000.0
ALICE = KeyPair.from_seed(b"\x01" * 32)
BOB = KeyPair.from_seed(b"\x02" * 32)
TOPIC_A = derive_topic("test", "a")
TOPIC_B = derive_topic("test", "b")


def signed(
    keypair: KeyPair = ALICE,
    topic: bytes = TOPIC_A,
    *,
    addresses=(("192.0.2.1", 4000), ("2001:db8::1", 4001)),
    relays=(b"\x11" * 32, b"\x22" * 32, b"\x33" * 32),
    seq: int = 1,
    expires: int = int(NOW) + 600,
) -> PeerRecord:
    return sign_record(keypair, topic, addresses=addresses, relays=relays, seq=seq, expires=expires)


def roundtrip(record: PeerRecord) -> PeerRecord:
    return PeerRecord.from_wire(msgpack.unpackb(msgpack.packb(record.to_wire())))


# --- strategies ----------------------------------------------------------------

ports = st.integers(1, 65535)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).filter(lambda ip: ip.ipv4_mapped is None).map(str)
addresses = st.lists(st.tuples(ipv4 | ipv6, ports), max_size=4, unique_by=lambda address: address)
relay_keys = st.lists(st.binary(min_size=32, max_size=32), max_size=3, unique=True)
uint64 = st.integers(0, 2**64 - 1)
topics = st.binary(min_size=32, max_size=32)
keypairs = st.binary(min_size=32, max_size=32).map(KeyPair.from_seed)

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.binary(max_size=40),
    lambda children: (
        st.lists(children, max_size=7) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)
# Six-field arrays whose fields are sometimes right, so decoding goes deep.
field_values = st.one_of(
    st.binary(max_size=70),
    st.integers(-(2**63), 2**64 - 1),
    st.lists(st.binary(max_size=40), max_size=5),
    msgpack_values,
)
near_records = st.tuples(
    st.binary(min_size=32, max_size=32) | field_values,
    st.lists(st.binary(min_size=6, max_size=6) | st.binary(min_size=18, max_size=18), max_size=5)
    | field_values,
    st.lists(st.binary(min_size=32, max_size=32), max_size=4) | field_values,
    uint64 | field_values,
    uint64 | field_values,
    st.binary(min_size=64, max_size=64) | field_values,
).map(list)


# --- encoding ------------------------------------------------------------------


@given(keypairs, topics, addresses, relay_keys, uint64, uint64)
def test_any_record_survives_to_wire_msgpack_and_from_wire(
    keypair, topic, addrs, relays, seq, expires
):
    record = sign_record(keypair, topic, addresses=addrs, relays=relays, seq=seq, expires=expires)
    decoded = roundtrip(record)
    assert decoded == record
    assert decoded.encode_body() == record.encode_body()
    assert msgpack.packb(decoded.to_wire()) == msgpack.packb(record.to_wire())


def test_wire_layout_is_key_packed_addresses_relays_seq_expires_signature():
    record = signed(addresses=(("192.0.2.1", 4000),), relays=(b"\x11" * 32,), seq=7)
    assert record.to_wire() == [
        ALICE.public_key,
        [bytes([192, 0, 2, 1]) + (4000).to_bytes(2, "big")],
        [b"\x11" * 32],
        7,
        int(NOW) + 600,
        record.signature,
    ]
    assert record.encode_body() == msgpack.packb(record.to_wire()[:5])


def test_a_record_with_two_addresses_and_three_relays_encodes_in_under_300_bytes():
    record = signed(seq=2**64 - 1, expires=2**64 - 1)
    assert len(record.addresses) == 2
    assert len(record.relays) == 3
    assert len(msgpack.packb(record.to_wire())) < 300


def test_an_ipv4_mapped_ipv6_address_is_announced_as_ipv4():
    record = signed(addresses=(("::ffff:192.0.2.9", 80),))
    assert record.addresses == (("192.0.2.9", 80),)
    assert roundtrip(record) == record


def test_ipv4_and_ipv6_addresses_both_round_trip():
    record = signed(addresses=(("127.0.0.1", 1), ("::1", 65535)))
    assert roundtrip(record).addresses == (("127.0.0.1", 1), ("::1", 65535))


@given(msgpack_values)
def test_arbitrary_msgpack_values_only_raise_the_decode_error(value):
    try:
        PeerRecord.from_wire(value)
    except DhtDecodeError as exc:
        assert exc.code == "BAD_RECORD"


@given(near_records)
def test_near_valid_records_decode_or_raise_only_the_decode_error(value):
    try:
        record = PeerRecord.from_wire(msgpack.unpackb(msgpack.packb(value)))
    except DhtDecodeError as exc:
        assert exc.code == "BAD_RECORD"
    else:
        assert record.to_wire() == value


# A valid-looking prefix (array of 6, bin 32) makes random tails reach deeper.
_PREFIXES = [b"", b"\x96", b"\x96\xc4\x20" + bytes(32), b"\x96\xc4\x20" + bytes(32) + b"\x91"]


@given(st.sampled_from(_PREFIXES), st.binary(max_size=300))
def test_arbitrary_bytes_unpacked_then_decoded_only_raise_the_decode_error(prefix, tail):
    try:
        value = msgpack.unpackb(prefix + tail)
    except Exception:  # msgpack's own errors are the message codec's to translate
        return
    try:
        PeerRecord.from_wire(value)
    except DhtDecodeError:
        pass


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda w: w[:5], "too few fields"),
        (lambda w: [*w, b""], "too many fields"),
        (lambda w: [w[0][:31], *w[1:]], "short key"),
        (lambda w: [w[0], [b"\x00" * 6], *w[2:]], "port 0"),
        (lambda w: [w[0], [w[1][0], w[1][0]], *w[2:]], "duplicate address"),
        (lambda w: [w[0], [w[1][0]] * 5, *w[2:]], "five addresses"),
        (
            lambda w: [w[0], [bytes(10) + b"\xff\xff" + bytes([1, 2, 3, 4, 0, 80])], *w[2:]],
            "IPv4-mapped IPv6 on the wire",
        ),
        (lambda w: [w[0], [b"\x7f\x00\x00\x01\x00"], *w[2:]], "truncated address"),
        (lambda w: [w[0], [[b"\x7f\x00\x00\x01", 80]], *w[2:]], "address as an array"),
        (lambda w: [*w[:2], [b"\x11" * 32] * 4, *w[3:]], "four relays"),
        (lambda w: [*w[:2], [b"\x11" * 32] * 2, *w[3:]], "duplicate relays"),
        (lambda w: [*w[:3], -1, *w[4:]], "negative seq"),
        (lambda w: [*w[:3], True, *w[4:]], "boolean seq"),
        (lambda w: [*w[:3], 1.0, *w[4:]], "float seq"),
        (lambda w: [*w[:4], 2**64, w[5]], "expires beyond uint64"),
        (lambda w: [*w[:5], w[5][:63]], "short signature"),
        (lambda w: [*w[:5], "x" * 64], "text signature"),
        (lambda w: dict(enumerate(w)), "a map"),
    ],
)
def test_malformed_records_are_refused_with_bad_record(mutate, reason):
    with pytest.raises(DhtDecodeError) as caught:
        PeerRecord.from_wire(mutate(signed().to_wire()))
    assert caught.value.code == "BAD_RECORD", reason


def test_decode_and_verify_errors_are_remote_protocol_errors():
    assert issubclass(DhtDecodeError, RemoteProtocolError)
    assert issubclass(RecordRejected, RemoteProtocolError)


# --- signatures ----------------------------------------------------------------


def test_a_signed_record_verifies_for_its_topic_after_a_round_trip():
    verify_record(roundtrip(signed()), TOPIC_A, now=NOW)


def test_signature_covers_the_announce_namespace_topic_and_body():
    record = signed()
    message = NS_ANNOUNCE + TOPIC_A + record.encode_body()
    assert BOB.sign(message) != record.signature
    assert ALICE.sign(message) == record.signature
    assert hashlib.blake2b(b"cosmicac/dht/announce/1", digest_size=32).digest() == NS_ANNOUNCE
    assert NS_ANNOUNCE != NS_UNANNOUNCE


@given(topics, topics)
def test_a_record_for_one_topic_never_verifies_for_another(topic_a, topic_b):
    assume(topic_a != topic_b)
    record = signed(topic=topic_a)
    with pytest.raises(RecordRejected) as caught:
        verify_record(record, topic_b, now=NOW)
    assert caught.value.code == "BAD_SIGNATURE"


_MUTATIONS = {
    "public_key": lambda r, d: BOB.public_key,
    "addresses": lambda r, d: ((f"10.0.{d % 256}.{d // 256 % 256}", 1 + d % 65535),),
    "relays": lambda r, d: (hashlib.blake2b(d.to_bytes(8, "big"), digest_size=32).digest(),),
    "seq": lambda r, d: (r.seq + 1 + d) % 2**64,
    "expires": lambda r, d: r.expires + 1 + d % 100,
    "signature": lambda r, d: bytes([r.signature[0] ^ (1 + d % 255)]) + r.signature[1:],
}


@given(st.sampled_from(sorted(_MUTATIONS)), st.integers(0, 2**32))
def test_a_signed_record_with_any_field_changed_never_verifies(field, data):
    record = signed()
    changed = dataclasses.replace(record, **{field: _MUTATIONS[field](record, data)})
    assume(changed != record)
    with pytest.raises(RecordRejected) as caught:
        verify_record(changed, TOPIC_A, now=NOW)
    assert caught.value.code == "BAD_SIGNATURE"


@given(st.data())
def test_flipping_any_bit_of_an_encoded_record_never_gives_a_record_that_verifies(data):
    record = signed()
    encoded = bytearray(msgpack.packb(record.to_wire()))
    bit = data.draw(st.integers(0, len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    try:
        value = msgpack.unpackb(bytes(encoded))
    except Exception:
        return
    try:
        decoded = PeerRecord.from_wire(value)
    except DhtDecodeError:
        return
    assume(decoded != record)
    with pytest.raises(RecordRejected):
        verify_record(decoded, TOPIC_A, now=NOW)


def test_a_record_signed_by_someone_else_for_the_same_key_does_not_verify():
    genuine = signed()
    forged = dataclasses.replace(genuine, signature=signed(BOB).signature)
    with pytest.raises(RecordRejected) as caught:
        verify_record(forged, TOPIC_A, now=NOW)
    assert caught.value.code == "BAD_SIGNATURE"


def test_a_remembered_signature_check_still_binds_topic_body_and_lifetime():
    # verify_record remembers recent signature checks (a lookup gets the same
    # record from up to k nodes); a remembered success must not leak to any
    # other topic, body or signature, nor skip the lifetime checks.
    record = signed(expires=int(NOW) + 10)
    for _ in range(2):
        verify_record(record, TOPIC_A, now=NOW)
    for changed, topic in (
        (record, TOPIC_B),
        (dataclasses.replace(record, seq=record.seq + 1), TOPIC_A),
        (dataclasses.replace(record, signature=signed(BOB).signature), TOPIC_A),
    ):
        for _ in range(2):
            with pytest.raises(RecordRejected) as caught:
                verify_record(changed, topic, now=NOW)
            assert caught.value.code == "BAD_SIGNATURE"
    with pytest.raises(RecordRejected) as caught:
        verify_record(record, TOPIC_A, now=NOW + 10)
    assert caught.value.code == "EXPIRED"


# --- lifetimes -----------------------------------------------------------------


def test_a_record_expires_exactly_at_its_expires_second():
    record = signed(expires=int(NOW) + 10)
    verify_record(record, TOPIC_A, now=NOW + 9.999)
    with pytest.raises(RecordRejected) as caught:
        verify_record(record, TOPIC_A, now=NOW + 10)
    assert caught.value.code == "EXPIRED"


def test_a_record_may_live_up_to_the_max_ttl_plus_the_clock_skew_allowance():
    limit = int(NOW) + MAX_RECORD_TTL_S + CLOCK_SKEW_S
    verify_record(signed(expires=limit), TOPIC_A, now=NOW)
    with pytest.raises(RecordRejected) as caught:
        verify_record(signed(expires=limit + 1), TOPIC_A, now=NOW)
    assert caught.value.code == "EXPIRES_TOO_FAR"


def test_a_smaller_max_ttl_tightens_the_limit():
    record = signed(expires=int(NOW) + 600)
    with pytest.raises(RecordRejected) as caught:
        verify_record(record, TOPIC_A, now=NOW, max_ttl_s=300)
    assert caught.value.code == "EXPIRES_TOO_FAR"


@given(st.integers(-10_000, 10_000))
def test_lifetime_rules_hold_for_any_expiry(offset):
    record = signed(expires=int(NOW) + offset)
    if offset <= 0:
        expected = "EXPIRED"
    elif offset > MAX_RECORD_TTL_S + CLOCK_SKEW_S:
        expected = "EXPIRES_TOO_FAR"
    else:
        verify_record(record, TOPIC_A, now=NOW)
        return
    with pytest.raises(RecordRejected) as caught:
        verify_record(record, TOPIC_A, now=NOW)
    assert caught.value.code == expected


def test_verifying_something_that_is_not_a_record_is_bad_record():
    with pytest.raises(RecordRejected) as caught:
        verify_record(signed().to_wire(), TOPIC_A, now=NOW)  # type: ignore[arg-type]
    assert caught.value.code == "BAD_RECORD"


# --- building records wrongly ----------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"addresses": [("192.0.2.1", p) for p in range(1, 6)]}, "BAD_RECORD_FIELDS"),
        ({"relays": [bytes([i]) * 32 for i in range(4)]}, "BAD_RECORD_FIELDS"),
        ({"relays": [b"\x01" * 31]}, "BAD_RECORD_FIELDS"),
        ({"addresses": [("example.com", 80)]}, "BAD_ADDRESS"),
        ({"addresses": [("192.0.2.1", 0)]}, "BAD_ADDRESS"),
        ({"addresses": [("192.0.2.1", 80), ("::ffff:192.0.2.1", 80)]}, "BAD_ADDRESS"),
        ({"seq": -1}, "BAD_RECORD_FIELDS"),
        ({"seq": 2**64}, "BAD_RECORD_FIELDS"),
        ({"expires": 1.5}, "BAD_RECORD_FIELDS"),
        ({"topic": b"\x00" * 31}, "BAD_TOPIC"),
    ],
)
def test_signing_a_record_with_bad_fields_is_a_usage_error(kwargs, code):
    with pytest.raises(DhtUsageError) as caught:
        signed(**kwargs)
    assert caught.value.code == code


# --- unannounce and self topics --------------------------------------------------


@given(keypairs, topics, uint64)
def test_an_unannounce_verifies_only_for_its_key_topic_and_seq(keypair, topic, seq):
    signature = sign_unannounce(keypair, topic, seq)
    assert verify_unannounce(keypair.public_key, topic, seq, signature)
    assert not verify_unannounce(keypair.public_key, topic, (seq + 1) % 2**64, signature)
    assert not verify_unannounce(
        ALICE.public_key if keypair != ALICE else BOB.public_key, topic, seq, signature
    )
    other_topic = bytes([topic[0] ^ 1]) + topic[1:]
    assert not verify_unannounce(keypair.public_key, other_topic, seq, signature)


def test_an_unannounce_signature_is_not_an_announce_signature():
    record = signed(seq=5)
    assert not verify_unannounce(ALICE.public_key, TOPIC_A, 5, record.signature)
    message = NS_UNANNOUNCE + TOPIC_A + msgpack.packb([ALICE.public_key, 5])
    assert sign_unannounce(ALICE, TOPIC_A, 5) == ALICE.sign(message)


@given(msgpack_values, msgpack_values, msgpack_values, msgpack_values)
def test_verify_unannounce_returns_false_for_garbage_and_never_raises(key, topic, seq, sig):
    assert verify_unannounce(key, topic, seq, sig) is False


def test_a_peer_announces_itself_under_the_topic_derived_from_its_key():
    assert record_topic_for_key(ALICE.public_key) == derive_topic("peer", ALICE.public_key)
    assert record_topic_for_key(ALICE.public_key) != record_topic_for_key(BOB.public_key)
    with pytest.raises(DhtUsageError):
        record_topic_for_key(b"short")
