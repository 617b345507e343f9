"""Every decoder of peer bytes, fed anything: a value, or that package's remote error.

The rule: "every failure of any peer's input, at any layer, must end
that peer's connection only, never the process". Each layer's driver catches
its package's ``RemoteProtocolError`` (or, for pydantic-typed RPC parameters,
``pydantic.ValidationError``, which the RPC server and client translate); any
other exception type escaping a decoder would escape the driver too. So each
property below is "returns, or raises exactly the documented error type".

Inputs: arbitrary bytes, msgpack of arbitrary values (so that the decoders get
past msgpack and exercise the field checks), and mutations of genuine encodings.
"""

from __future__ import annotations

import copy

import msgpack
import pydantic
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from crdt._entries import Entry, decode_entry
from crdt._errors import BadEntry
from crdt._messages import (
    AdminParams,
    AdminResult,
    FetchParams,
    FetchResult,
    HeadModel,
    HeadsParams,
    HeadsResult,
    JoinParams,
    JoinResult,
)
from p2p.dht._contact import Contact
from p2p.dht._errors import DhtDecodeError, DhtProtocolError
from p2p.dht._messages import Command, Request, Response, decode, encode
from p2p.dht._records import PeerRecord, sign_record, verify_record, verify_unannounce
from p2p.diagnostics import IdentifyParams, Identity, PingPayload
from p2p.errors import RemoteProtocolError
from p2p.keys import KeyPair
from p2p.log import _records as log_records
from p2p.mux._errors import MuxProtocolError
from p2p.mux._frames import FrameDecoder, Open, encode_frame
from p2p.noise import NEED_DATA, Handshake, Transport
from p2p.relay._attach import (
    ATTACH_REQUEST_BYTES,
    FirstBytes,
    Role,
    classify,
    decode_attach_request,
    encode_attach_request,
)
from p2p.relay._errors import RelayProtocolError
from p2p.relay._messages import PairParams, PairReply, ReservationItem, ReserveParams
from p2p.rpc._errors import RpcProtocolError
from p2p.rpc._messages import (
    Cancel,
    StreamCredit,
    StreamEnd,
    StreamItem,
    StreamRequest,
    decode_message,
    encode_message,
)
from p2p.rpc._messages import Error as RpcErrorMessage
from p2p.rpc._messages import Request as RpcRequest
from p2p.rpc._messages import Response as RpcResponse
from tests.examples import examples

pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=examples(100), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
ALICE = KeyPair.from_seed(bytes(range(32)))
BOB = KeyPair.from_seed(bytes(range(1, 33)))
TOPIC = bytes(range(32))

# -- strategies ---------------------------------------------------------------------

#: Values msgpack can carry (and a few near the edges of what decoders check).
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.binary(max_size=70),
    st.sampled_from([bytes(32), bytes(64), bytes(6), bytes(18), bytes(16), bytes(20), 0, 1, 2]),
)
msgpack_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.dictionaries(st.one_of(st.text(max_size=8), st.binary(max_size=4)), inner, max_size=4),
    ),
    max_leaves=12,
)


def packed(value) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


#: A value that often fits some field: sizes of keys, ids, tokens, addresses,
#: edge integers, and arrays of those.
_plausible_scalars = st.one_of(
    st.sampled_from([0, 1, 2, -1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, "", "OK", "X"]),
    st.sampled_from([6, 16, 18, 20, 32, 64]).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
)
field = st.one_of(
    _plausible_scalars,
    st.lists(_plausible_scalars, max_size=4),
    st.lists(st.lists(_plausible_scalars, max_size=3), max_size=3),
    msgpack_values,
)


def array(*head, fields: int):
    """Arrays that start with ``head`` (values or strategies), then ``fields`` plausible values."""
    fixed = [h if isinstance(h, st.SearchStrategy) else st.just(h) for h in head]
    return st.tuples(*fixed, *[field] * fields).map(list)


@st.composite
def field_mutants(draw, genuine: list):
    """``genuine`` (a decoded wire array) with 1-3 fields, or items of its arrays,
    replaced by other values: the decoder then sees a mostly valid message."""
    wire = copy.deepcopy(genuine)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(wire) - 1))
        if isinstance(wire[i], list) and wire[i] and draw(st.booleans()):
            inner = wire[i]
            j = draw(st.integers(0, len(inner) - 1))
            if isinstance(inner[j], list) and inner[j] and draw(st.booleans()):
                inner[j][draw(st.integers(0, len(inner[j]) - 1))] = draw(field)
            else:
                inner[j] = draw(field)
        else:
            wire[i] = draw(field)
    return wire


def wire_of(data: bytes) -> list:
    return msgpack.unpackb(data, raw=False)


#: Arrays that start like a message (type, then version or id: small ints), so
#: that decoders get past their first checks to the per-field ones.
shaped_arrays = st.builds(
    lambda head, rest: head + rest,
    st.lists(st.integers(0, 8), min_size=1, max_size=2),
    st.lists(msgpack_values, max_size=8),
)
#: Bytes that are msgpack of some value, or of an array shaped like a message.
msgpack_bytes = st.one_of(
    msgpack_values.map(packed),
    st.lists(msgpack_values, min_size=1, max_size=9).map(packed),
    shaped_arrays.map(packed),
)
any_bytes = st.one_of(st.binary(max_size=600), msgpack_bytes)


def mutate(data: bytes, flips, cut: int | None) -> bytes:
    out = bytearray(data)
    for position, mask in flips:
        if out:
            out[position % len(out)] ^= mask
    if cut is not None:
        del out[cut % (len(out) + 1) :]
    return bytes(out)


flips = st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=3)
cuts = st.one_of(st.none(), st.integers(0, 10_000))


# -- noise framing ----------------------------------------------------------------------


def transport_pair() -> tuple[Transport, Transport]:
    initiator = Handshake(ALICE, initiator=True, expected_remote_key=BOB.public_key)
    responder = Handshake(BOB, initiator=False)
    m2 = responder.receive_data(initiator.initiate())
    responder.receive_data(initiator.receive_data(m2))
    return initiator.transport(), responder.transport()


def drain_expecting_remote_error(transport: Transport) -> None:
    for _ in range(10_000):  # bounded: each call consumes a frame or returns NEED_DATA
        try:
            event = transport.next_event()
        except RemoteProtocolError as exc:
            assert exc.code
            with pytest.raises(RemoteProtocolError):  # it stays failed
                transport.next_event()
            return
        if event is NEED_DATA:
            return
    raise AssertionError("next_event() never asked for more data")


@FUZZ
@given(chunks=st.lists(st.binary(max_size=300), max_size=5))
@example(chunks=[b"\xff\xff\xff\x01"])  # length over the Noise limit
@example(chunks=[b"\x00\x00\x00\x01"])  # a DATA frame too short for a tag
@example(chunks=[b"\x10\x00\x00\x07" + bytes(16)])  # unknown type
@example(chunks=[b"\x10\x00\x00\x01" + bytes(16)])  # a DATA frame that fails to decrypt
@example(chunks=[b"\x10\x00\x00\x02" + bytes(16)])  # a KEEPALIVE that fails to decrypt
def test_noise_transport_fed_any_bytes_raises_only_remote_protocol_error(chunks):
    _, receiver = transport_pair()
    for chunk in chunks:
        receiver.receive_data(chunk)
        drain_expecting_remote_error(receiver)


@FUZZ
@given(flips=flips, cut=cuts, tail=st.binary(max_size=40))
def test_noise_transport_fed_mutated_frames_raises_only_remote_protocol_error(flips, cut, tail):
    sender, receiver = transport_pair()
    genuine = (
        bytes(sender.send_data(b"hello" * 10))
        + sender.send_keepalive()
        + bytes(sender.send_data(b"x"))
        + sender.send_end()
    )
    receiver.receive_data(mutate(genuine, flips, cut) + tail)
    drain_expecting_remote_error(receiver)


@FUZZ
@given(data=st.binary(max_size=200))
def test_noise_handshake_framing_of_a_fresh_initiator_raises_only_handshake_error(data):
    # An initiator that has sent message 1 and reads whatever a "server" answers.
    from p2p.errors import HandshakeError

    initiator = Handshake(ALICE, initiator=True, expected_remote_key=BOB.public_key)
    initiator.initiate()
    try:
        initiator.receive_data(data)
    except HandshakeError:
        pass


# -- mux frames ---------------------------------------------------------------------------


def feed_mux(chunks: list[bytes]) -> None:
    decoder = FrameDecoder(max_frame_bytes=64 * 1024)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
    except MuxProtocolError as exc:
        assert exc.code


@FUZZ
@given(chunks=st.lists(st.binary(max_size=200), max_size=6))
@example(chunks=[b"\xff" * 20])  # varint too long
@example(chunks=[b"\x02\x01\x80"])  # frame ends inside a varint
@example(chunks=[b"\x05\x01\x00\x00\x03\xff"])  # OPEN with a name that is not UTF-8
def test_mux_frame_decoder_fed_any_bytes_raises_only_mux_protocol_error(chunks):
    feed_mux(chunks)


@FUZZ
@given(flips=flips, cut=cuts, split=st.integers(0, 200))
def test_mux_frame_decoder_fed_mutated_frames_raises_only_mux_protocol_error(flips, cut, split):
    genuine = encode_frame(Open(3, "cosmicac-db/1", b"id", 65536))
    data = mutate(genuine, flips, cut)
    feed_mux([data[:split], data[split:]])


# -- rpc messages ------------------------------------------------------------------------


@FUZZ
@given(data=any_bytes)
@example(data=packed([0, 2**32, "m", {}]))
@example(data=packed([4, 1, "m", {}, -1]))
@example(data=b"\xc1")  # never-used msgpack byte
@example(data=b"\x91" * 5000)  # deep nesting
def test_rpc_decode_message_raises_only_rpc_protocol_error(data):
    try:
        decode_message(data)
    except RpcProtocolError as exc:
        assert exc.code in {"DECODE_ERROR", "BAD_MESSAGE"}


GENUINE_RPC = [
    RpcRequest(1, "crdt.fetch", {"db": bytes(32)}),
    RpcResponse(2, {"ok": True}),
    RpcErrorMessage(3, "NOT_FOUND", "no such thing", {"k": 1}),
    Cancel(4),
    StreamRequest(5, "reserve", {}, 16),
    StreamItem(6, {"token": bytes(32)}),
    StreamEnd(7),
    StreamCredit(8, 4),
]
rpc_mutants = st.sampled_from(GENUINE_RPC).flatmap(
    lambda m: field_mutants(wire_of(encode_message(m)))
)


@FUZZ
@given(wire=rpc_mutants)
def test_rpc_decode_message_of_field_mutants_raises_only_rpc_protocol_error(wire):
    try:
        decode_message(packed(wire))
    except RpcProtocolError:
        pass


@FUZZ
@given(flips=flips, cut=cuts)
def test_rpc_decode_message_of_mutated_request_raises_only_rpc_protocol_error(flips, cut):
    genuine = encode_message(RpcRequest(7, "crdt.fetch", {"db": bytes(32), "start": 1}))
    try:
        decode_message(mutate(genuine, flips, cut))
    except RpcProtocolError:
        pass


# -- pydantic-typed RPC payloads (diagnostics, relay, crdt): only ValidationError ---------

PEER_MODELS = [
    PingPayload,
    IdentifyParams,
    Identity,
    ReserveParams,
    ReservationItem,
    PairParams,
    PairReply,
    HeadsParams,
    HeadsResult,
    FetchParams,
    FetchResult,
    HeadModel,
    JoinParams,
    JoinResult,
    AdminParams,
    AdminResult,
]


K = bytes(range(32))
#: One valid payload of each model, as msgpack would hand it over.
GENUINE_PAYLOADS = [
    (PingPayload, {"data": b"ping"}),
    (IdentifyParams, {}),
    (Identity, {"public_key": "ab" * 32, "agent": "x", "uptime_s": 1.5, "protocols": ["p"]}),
    (ReserveParams, {}),
    (ReservationItem, {"token": K, "initiator": K}),
    (PairParams, {"target": K}),
    (PairReply, {"token": K, "timeout_s": 15.0}),
    (HeadsParams, {"db": K, "known": [[K, 3]], "wait_s": 1.0}),
    (HeadsResult, {"lengths": [[K, 3], [K, 0]]}),
    (FetchParams, {"db": K, "writer": K, "start": 0, "max_bytes": 4096}),
    (FetchResult, {"entries": [b"e"], "head": {"length": 1, "head_hash": K,
                                               "signature": bytes(64)}}),
    (HeadModel, {"length": 1, "head_hash": K, "signature": bytes(64)}),
    (JoinParams, {"db": K}),
    (JoinResult, {"status": "added"}),
    (AdminParams, {"db": K, "action": "add_writer", "writer": K, "admin": True,
                   "signature": bytes(64)}),
    (AdminResult, {"status": "removed", "length": 4}),
]


def test_the_genuine_inputs_the_mutants_start_from_are_valid():
    # Otherwise the field mutants below would start from junk and test less.
    for model, value in GENUINE_PAYLOADS:
        model.model_validate(value)
    for datagram in GENUINE_DHT:
        decode(datagram)
    for message in GENUINE_RPC:
        assert decode_message(encode_message(message)) == message
    assert decode_entry(GENUINE_ENTRY).clock == 3
    assert PeerRecord.from_wire(RECORD.to_wire()) == RECORD


@st.composite
def payload_mutants(draw):
    model, genuine = draw(st.sampled_from(GENUINE_PAYLOADS))
    value = copy.deepcopy(genuine)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.one_of(st.sampled_from(list(value) or ["x"]), st.text(max_size=6)))
        inner = value.get(key)
        if isinstance(inner, list | dict) and inner and draw(st.booleans()):
            if isinstance(inner, dict):
                inner[draw(st.sampled_from(list(inner)))] = draw(field)
            else:
                inner[draw(st.integers(0, len(inner) - 1))] = draw(field)
        elif draw(st.integers(0, 4)) == 0:
            value.pop(key, None)
        else:
            value[key] = draw(field)
    return model, value


@FUZZ
@given(mutant=payload_mutants())
def test_peer_typed_payload_mutants_raise_only_validation_error(mutant):
    model, value = mutant
    try:
        model.model_validate(value)
    except pydantic.ValidationError:
        pass


@FUZZ
@given(model=st.sampled_from(PEER_MODELS), value=msgpack_values)
@example(model=ReservationItem, value={"token": bytes(32)})
@example(model=HeadsParams, value={"db": bytes(32), "known": [[bytes(32), -1]]})
@example(model=FetchParams, value={"db": bytes(32), "writer": bytes(32), "start": 2**64 - 1})
def test_peer_typed_payloads_raise_only_validation_error(model, value):
    # What p2p.rpc hands a model: a map decoded from msgpack (or anything, for
    # a result or stream item); the RPC layer translates ValidationError.
    try:
        model.model_validate(value)
    except pydantic.ValidationError:
        pass


@FUZZ
@given(model=st.sampled_from(PEER_MODELS), data=any_bytes)
def test_peer_typed_payloads_from_raw_msgpack_raise_only_validation_error(model, data):
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # not msgpack: decode_message's job (tested above)
        return
    try:
        model.model_validate(value)
    except pydantic.ValidationError:
        pass


# -- relay attach -------------------------------------------------------------------------


@FUZZ
@given(data=st.one_of(st.binary(max_size=80), st.binary(min_size=33, max_size=33).map(
    lambda tail: b"BRELAY/1" + tail)))
def test_relay_attach_request_decoder_raises_only_relay_protocol_error(data):
    try:
        request = decode_attach_request(data)
    except RelayProtocolError as exc:
        assert exc.code == "BAD_ATTACH"
    else:
        assert len(data) == ATTACH_REQUEST_BYTES
        assert encode_attach_request(request.role, request.token) == data
    assert classify(data) in set(FirstBytes)


@FUZZ
@given(flips=flips, cut=cuts)
def test_relay_attach_request_mutations_raise_only_relay_protocol_error(flips, cut):
    data = mutate(encode_attach_request(Role.RESPONDER, bytes(range(32))), flips, cut)
    try:
        decode_attach_request(data)
    except RelayProtocolError:
        pass
    for end in range(len(data) + 1):
        assert classify(data[:end]) in set(FirstBytes)


# -- dht messages and records -----------------------------------------------------------------

RECORD = sign_record(ALICE, TOPIC, addresses=[("192.0.2.7", 4000)], relays=[BOB.public_key],
                     seq=5, expires=2_000_000_000)
SIG = bytes(64)
GENUINE_DHT = [
    encode(Request(1, Command.PING)),
    encode(Request(2, Command.LOOKUP, TOPIC, bytes(20), bytes(16))),
    encode(Request(3, Command.ANNOUNCE, TOPIC, None, bytes(16), RECORD.to_wire())),
    encode(Request(4, Command.UNANNOUNCE, TOPIC, None, bytes(16), [ALICE.public_key, 5, SIG])),
    encode(Request(5, Command.PROBE, bytes(20))),
    encode(
        Response(
            6,
            bytes(20),
            ("192.0.2.1", 4000),
            bytes(16),
            (Contact.at("198.51.100.2", 5000), Contact.at("2001:db8::1", 6000)),
            None,
            [RECORD.to_wire()],
        )
    ),
    encode(Response(7, None, ("2001:db8::2", 1), bytes(16), (), "TOO_MANY", None)),
]
dht_mutants = st.sampled_from(GENUINE_DHT).flatmap(lambda d: field_mutants(wire_of(d)))


@FUZZ
@given(wire=dht_mutants)
def test_dht_decode_of_field_mutants_raises_only_dht_decode_error(wire):
    try:
        decode(packed(wire))
    except DhtDecodeError:
        pass


@FUZZ
@given(data=any_bytes)
@example(data=packed([0, 1, 1, 0, None, None, None, None]))
@example(data=packed([1, 1, 1, None, b"\x7f\x00\x00\x01\x00\x00", bytes(16), [], None, None]))
@example(data=packed([0, 1, 1, True, None, None, None, None]))
@example(data=packed([1, 1, 1, None, bytes(18), bytes(16), [bytes(6)] * 3, "X", None]))
@example(data=b"\x91" * 1000)
def test_dht_decode_raises_only_dht_decode_error(data):
    try:
        decode(data)
    except DhtDecodeError:
        pass


dht_shaped = st.one_of(
    st.integers(0, 7).flatmap(lambda command: array(0, 1, field, command, fields=4)),
    array(1, 1, fields=7),
)


@FUZZ
@given(wire=dht_shaped)
def test_dht_decode_of_message_shaped_arrays_raises_only_dht_decode_error(wire):
    try:
        decode(packed(wire))
    except DhtDecodeError:
        pass


@FUZZ
@given(which=st.integers(0, len(GENUINE_DHT) - 1), flips=flips, cut=cuts)
def test_dht_decode_of_mutated_datagrams_raises_only_dht_decode_error(which, flips, cut):
    try:
        decode(mutate(GENUINE_DHT[which], flips, cut))
    except DhtDecodeError:
        pass


def decode_and_verify_record(obj) -> None:
    try:
        record = PeerRecord.from_wire(obj)
    except DhtDecodeError:
        return
    try:
        verify_record(record, TOPIC, now=1_999_999_500)
    except DhtProtocolError:
        pass


@FUZZ
@given(obj=st.one_of(msgpack_values, array(fields=6), field_mutants(RECORD.to_wire())))
@example(obj=[bytes(32), [bytes(6)], [], 1, 1, bytes(64)])
@example(obj=[bytes(32), [], [bytes(32), bytes(32)], 2**64, 1, bytes(64)])
@example(obj=[bytes(32), [b"\x00" * 17 + b"\x01"], [], 0, 0, bytes(64)])
def test_dht_record_from_wire_raises_only_dht_errors(obj):
    decode_and_verify_record(obj)


@FUZZ
@given(data=any_bytes)
def test_dht_record_from_raw_msgpack_raises_only_dht_errors(data):
    try:
        obj = msgpack.unpackb(data, raw=False)
    except Exception:  # not msgpack: the datagram decoder refuses it first
        return
    decode_and_verify_record(obj)


@FUZZ
@given(flips=flips, cut=cuts)
def test_dht_record_mutations_raise_only_dht_errors(flips, cut):
    data = mutate(packed(RECORD.to_wire()), flips, cut)
    try:
        obj = msgpack.unpackb(data, raw=False)
    except Exception:
        return
    decode_and_verify_record(obj)


@FUZZ
@given(public_key=msgpack_values, seq=msgpack_values, signature=msgpack_values)
def test_dht_verify_unannounce_of_peer_values_never_raises_foreign_errors(
    public_key, seq, signature
):
    # The node checks the UNANNOUNCE value's fields, but the verifier itself
    # must not blow up on whatever gets through: it says False or raises ours.
    try:
        assert verify_unannounce(public_key, TOPIC, seq, signature) in (True, False)
    except DhtProtocolError:
        pass


# -- crdt entries and log records ---------------------------------------------------------------

GENUINE_ENTRY = Entry.create(
    bytes(32), 3, {bytes(range(32)): 2, bytes(range(1, 33)): 1}, [["put_key", b"k", 1], ["x"]]
).encode()


@FUZZ
@given(data=st.one_of(any_bytes, field_mutants(wire_of(GENUINE_ENTRY)).map(packed)))
@example(data=packed([1, bytes(32), 1, [[bytes(32), 1], [bytes(32), 1]], [["x"]]]))
@example(data=packed([1, bytes(32), 1, [], [[1]]]))
@example(data=packed([1, bytes(32), 2**63, [], []]))
@example(data=packed({"a": 1}))
def test_crdt_decode_entry_raises_only_bad_entry(data):
    try:
        decode_entry(data)
    except BadEntry as exc:
        assert exc.code


@FUZZ
@given(flips=flips, cut=cuts)
def test_crdt_decode_entry_mutations_raise_only_bad_entry(flips, cut):
    try:
        decode_entry(mutate(GENUINE_ENTRY, flips, cut))
    except BadEntry:
        pass


#: What p2p/log/_records.py's scanner catches around its body decoders.
RECORD_BODY_ERRORS = (ValueError, TypeError, msgpack.UnpackException)


@FUZZ
@given(body=any_bytes)
@example(body=packed([1, 2, 3]))
@example(body=packed("ab"))
@example(body=packed(5))
def test_crdt_log_record_bodies_raise_only_what_the_scanner_catches(body):
    for decoder in (log_records._decode_entry, log_records._decode_head):
        try:
            decoder(body)
        except RECORD_BODY_ERRORS:
            pass


@FUZZ
@given(data=st.binary(max_size=200), pos=st.integers(0, 220))
def test_crdt_log_record_framing_never_raises(data, pos):
    result = log_records._read_record(data, min(pos, len(data)))
    assert isinstance(result, tuple)


# -- noise framing through the trio driver ------------------------------------------------


async def _read_hostile_frames(chunks: list[bytes], genuine_first: bool) -> None:
    """A SecretStream whose peer completes the handshake, then sends ``chunks`` raw."""
    from p2p.errors import ConnectionBroken
    from p2p.noise import SecretStream

    ours, theirs = trio.testing.memory_stream_pair()
    peer = Handshake(BOB, initiator=False)

    async def hostile_peer() -> None:
        try:
            while not peer.complete:
                reply = peer.receive_data(await theirs.receive_some(4096))
                if reply:
                    await theirs.send_all(reply)
            if genuine_first:
                await theirs.send_all(bytes(peer.transport().send_data(b"genuine")))
            for chunk in chunks:
                await theirs.send_all(chunk)
            await theirs.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hostile_peer)
            stream = await SecretStream.initiator(ours, ALICE, BOB.public_key)
            try:
                for _ in range(1000):  # bounded: EOF or an error ends it sooner
                    if not await stream.receive_some():
                        break
            except ConnectionBroken as exc:
                assert exc.code
            finally:
                await stream.aclose()
            nursery.cancel_scope.cancel()


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(st.binary(max_size=200), max_size=4),
    genuine_first=st.booleans(),
)
@example(chunks=[b"\xff\xff\xff\x01"], genuine_first=False)  # length over the Noise limit
@example(chunks=[b"\x10\x00\x00\x01" + bytes(16)], genuine_first=True)  # fails to decrypt
@example(chunks=[b"\x10\x00\x00"], genuine_first=False)  # EOF inside a header
def test_secret_stream_reading_hostile_frames_raises_only_connection_broken(chunks, genuine_first):
    trio.run(_read_hostile_frames, chunks, genuine_first,
             clock=trio.testing.MockClock(autojump_threshold=0))
