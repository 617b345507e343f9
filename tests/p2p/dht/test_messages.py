"""The DHT wire codec: round trips, hostile input, size limits."""

from __future__ import annotations

import ipaddress

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p.dht._contact import Contact, pack_address
from p2p.dht._errors import DhtDecodeError, DhtMessageTooLarge, DhtUsageError
from p2p.dht._messages import (
    MAX_CLOSER,
    MAX_DATAGRAM_BYTES,
    Command,
    Request,
    Response,
    decode,
    encode,
    encode_with_records,
    fit_records,
    value_budget_bytes,
)
from p2p.errors import LocalProtocolError, RemoteProtocolError
from tests.examples import examples

FAST = settings(max_examples=examples(120), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _usable(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return False
    return not (
        ip.is_unspecified or ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255")
    )


ports = st.integers(1, 65535)
hosts = st.ip_addresses().filter(_usable).map(str)
contacts = st.builds(Contact.at, hosts, ports)
tids = st.integers(0, 2**32 - 1)
ids = st.binary(min_size=20, max_size=20)
topics = st.binary(min_size=32, max_size=32)
tokens = st.binary(min_size=16, max_size=16)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=40)
)
plain = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
values = st.lists(plain, max_size=6)
error_codes = st.from_regex(r"[A-Z][A-Z0-9_]{0,20}", fullmatch=True)


@st.composite
def requests(draw: st.DrawFn) -> Request:
    command = draw(st.sampled_from(Command))
    if command is Command.PING:
        target = None
    elif command in (Command.FIND_NODE, Command.PING_BACK, Command.PROBE):
        target = draw(ids)
    else:
        target = draw(topics)
    value = draw(values) if command in (Command.ANNOUNCE, Command.UNANNOUNCE) else None
    return Request(
        draw(tids),
        command,
        target,
        draw(st.none() | ids),
        draw(st.none() | tokens),
        value,
    )


responses = st.builds(
    Response,
    tids,
    st.none() | ids,
    st.tuples(hosts, ports),
    tokens,
    st.lists(contacts, max_size=MAX_CLOSER).map(tuple),
    st.none() | error_codes,
    st.none() | values,
)
messages = requests() | responses


def _encodes(msg: Request | Response) -> bytes | None:
    try:
        return encode(msg)
    except DhtMessageTooLarge:
        return None


def _ipv6_contacts(count: int) -> tuple[Contact, ...]:
    return tuple(
        Contact.at(f"2001:db8:ffff:ffff:ffff:ffff:ffff:{i + 1:x}", 65535) for i in range(count)
    )


def _response(**fields: object) -> Response:
    base: dict[str, object] = {
        "tid": 7,
        "responder_id": b"r" * 20,
        "observed": ("203.0.113.9", 49737),
        "token": b"t" * 16,
    }
    base.update(fields)
    return Response(**base)  # type: ignore[arg-type]


# -- round trips -------------------------------------------------------------------------


@FAST
@given(messages)
def test_every_message_round_trips(msg: Request | Response) -> None:
    data = _encodes(msg)
    if data is None:
        return
    assert len(data) <= MAX_DATAGRAM_BYTES
    assert decode(data) == msg


def test_a_ping_round_trips_without_optional_fields() -> None:
    ping = Request(1, Command.PING)
    assert decode(encode(ping)) == ping
    assert decode(encode(ping)).command is Command.PING


def test_closer_contacts_get_ids_recomputed_from_their_addresses() -> None:
    honest = Contact.at("198.51.100.7", 4000)
    lying = Contact(b"\x00" * 20, honest.host, honest.port)
    decoded = decode(encode(_response(closer=(lying,))))
    assert isinstance(decoded, Response)
    assert decoded.closer == (honest,)


def test_an_ipv4_mapped_address_is_sent_as_ipv4() -> None:
    contact = Contact.at("::ffff:192.0.2.1", 80)
    assert contact.host == "192.0.2.1"
    data = encode(_response(closer=(contact,)))
    assert pack_address("192.0.2.1", 80) in data


def test_lists_are_accepted_for_observed_and_closer() -> None:
    contact = Contact.at("192.0.2.1", 80)
    msg = _response(observed=["192.0.2.2", 81], closer=[contact])
    assert msg.observed == ("192.0.2.2", 81)
    assert msg.closer == (contact,)


def test_an_int_command_becomes_a_command() -> None:
    assert Request(1, 1, b"i" * 20).command is Command.FIND_NODE  # type: ignore[arg-type]


# -- hostile input ------------------------------------------------------------------------


def _decodes_or_refuses(data: bytes) -> None:
    try:
        msg = decode(data)
    except DhtDecodeError as exc:
        assert isinstance(exc, RemoteProtocolError)
        assert exc.code == "DECODE_ERROR"
    else:
        assert isinstance(msg, Request | Response)


@FAST
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_only_the_decode_error(data: bytes) -> None:
    _decodes_or_refuses(data)


wire_like = st.recursive(
    scalars | st.sampled_from([0, 1, 2, 4, 16, 20, 32]) | st.binary(min_size=6, max_size=6),
    lambda inner: st.lists(inner, max_size=10) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)


@FAST
@given(wire_like)
def test_arbitrary_msgpack_values_decode_or_raise_only_the_decode_error(obj: object) -> None:
    _decodes_or_refuses(msgpack.packb(obj, use_bin_type=True))


field_values = (
    scalars
    | st.sampled_from([0, 1, 4, 2**32, b"\x01" * 20, b"\x02" * 32, b"\x03" * 16])
    | st.lists(st.binary(min_size=6, max_size=6) | st.binary(min_size=18, max_size=18), max_size=22)
)


@FAST
@given(messages, st.data())
def test_messages_with_one_field_swapped_decode_or_raise_only_the_decode_error(
    msg: Request | Response, data: st.DataObject
) -> None:
    if _encodes(msg) is None:
        return
    wire = _wire(msg)
    wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(field_values)
    _decodes_or_refuses(msgpack.packb(wire, use_bin_type=True))


@FAST
@given(messages, st.data())
def test_mutated_datagrams_decode_or_raise_only_the_decode_error(
    msg: Request | Response, data: st.DataObject
) -> None:
    raw = _encodes(msg)
    if raw is None:
        return
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(buf) - 1, 0)))
        if action == "flip" and buf:
            buf[at] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del buf[at:]
        else:
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    _decodes_or_refuses(bytes(buf))


def _wire(msg: Request | Response) -> list[object]:
    return msgpack.unpackb(encode(msg), raw=False)


def _refused(obj: object) -> None:
    with pytest.raises(DhtDecodeError):
        decode(msgpack.packb(obj, use_bin_type=True))


@pytest.mark.parametrize(
    ("index", "bad"),
    [
        (0, 9),  # unknown type
        (1, 2),  # unknown version
        (2, -1),  # tid below u32
        (2, 2**32),  # tid above u32
        (2, True),  # a bool is not a tid
        (3, 7),  # unknown command
        (4, b"short"),  # target of the wrong length
        (4, None),  # FIND_NODE needs a target
        (5, b"x" * 32),  # sender id of the wrong length
        (6, "t" * 16),  # token as str, not bin
        (7, [1]),  # FIND_NODE takes no value
    ],
)
def test_a_request_with_a_bad_field_is_refused(index: int, bad: object) -> None:
    wire = _wire(Request(3, Command.FIND_NODE, b"i" * 20, b"s" * 20, b"t" * 16))
    wire[index] = bad
    _refused(wire)


@pytest.mark.parametrize(
    ("index", "bad"),
    [
        (3, b"x"),  # responder id of the wrong length
        (4, b"\x00" * 6),  # observed 0.0.0.0:0
        (4, bytes([224, 0, 0, 1, 0, 80])),  # multicast
        (4, bytes([192, 0, 2, 1, 0, 0])),  # port 0
        (4, b"\x00" * 10 + b"\xff\xff" + bytes([192, 0, 2, 1, 0, 80])),  # IPv4-mapped
        (4, b"\x01" * 7),  # neither 6 nor 18 bytes
        (5, None),  # a response always carries a token
        (6, [b"\x01" * 5]),  # a bad closer address
        (6, [bytes([192, 0, 2, 1, 0, 80])] * (MAX_CLOSER + 1)),  # too many closer nodes
        (6, b"not a list"),
        (7, "lowercase code"),
        (7, 5),
        (8, {"a": 1}),  # value must be an array or nil
    ],
)
def test_a_response_with_a_bad_field_is_refused(index: int, bad: object) -> None:
    wire = _wire(_response())
    wire[index] = bad
    _refused(wire)


def test_extra_and_missing_fields_are_refused() -> None:
    wire = _wire(Request(3, Command.PING))
    _refused([*wire, None])
    _refused(wire[:-1])
    _refused([])
    _refused(None)


def test_trailing_bytes_after_the_message_are_refused() -> None:
    with pytest.raises(DhtDecodeError):
        decode(encode(Request(3, Command.PING)) + b"\x00")


def test_extension_types_and_deep_nesting_in_values_are_refused() -> None:
    wire = _wire(Request(3, Command.ANNOUNCE, b"p" * 32, None, b"t" * 16, [1]))
    wire[7] = [msgpack.ExtType(5, b"x")]
    _refused(wire)
    wire[7] = [msgpack.Timestamp(1, 0)]
    _refused(wire)
    nested: list[object] = []
    for _ in range(40):
        nested = [nested]
    wire[7] = nested
    _refused(wire)


def test_an_oversized_datagram_is_refused_before_parsing() -> None:
    with pytest.raises(DhtDecodeError):
        decode(b"\x00" * (MAX_DATAGRAM_BYTES + 1))


def test_non_bytes_input_is_refused() -> None:
    with pytest.raises(DhtDecodeError):
        decode("a string")  # type: ignore[arg-type]


# -- local misuse -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: Request(2**32, Command.PING),
        lambda: Request(1, Command.PING, b"x" * 32),
        lambda: Request(1, Command.LOOKUP, b"x" * 20),
        lambda: Request(1, Command.ANNOUNCE, b"x" * 32, token=b"t" * 16),  # no value
        lambda: Request(1, Command.ANNOUNCE, b"x" * 32, value=[object()]),
        lambda: Request(1, Command.ANNOUNCE, b"x" * 32, value=[2**64]),
        lambda: _response(observed=("example.com", 80)),
        lambda: _response(observed=("::ffff:192.0.2.1", 80)),  # not canonical
        lambda: _response(closer=(("192.0.2.1", 80),)),
        lambda: _response(closer=_ipv6_contacts(MAX_CLOSER + 1)),
        lambda: _response(error="not a code"),
        lambda: _response(token=b"short"),
    ],
)
def test_building_an_invalid_message_is_a_local_error(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DhtUsageError) as info:
        build()
    assert isinstance(info.value, LocalProtocolError)


def test_encoding_something_else_is_a_local_error() -> None:
    with pytest.raises(DhtUsageError):
        encode("not a message")  # type: ignore[arg-type]


# -- size discipline ----------------------------------------------------------------------


def test_a_response_with_twenty_ipv6_contacts_fits_in_a_thousand_bytes() -> None:
    reply = _response(
        responder_id=b"r" * 20,
        observed=("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", 65535),
        closer=_ipv6_contacts(MAX_CLOSER),
        error="INVALID_TOKEN",
    )
    assert len(encode(reply)) < 1000


def test_a_message_over_the_datagram_limit_is_refused_locally() -> None:
    big = Request(1, Command.ANNOUNCE, b"p" * 32, None, b"t" * 16, [b"x" * MAX_DATAGRAM_BYTES])
    with pytest.raises(DhtMessageTooLarge) as info:
        encode(big)
    assert isinstance(info.value, LocalProtocolError)
    assert info.value.code == "MESSAGE_TOO_LARGE"


def test_fit_records_keeps_the_longest_prefix_that_fits() -> None:
    records = [[b"k" * 32, i, [b"a" * 18], b"s" * 64] for i in range(40)]
    reply = _response(closer=_ipv6_contacts(MAX_CLOSER))
    fitted = fit_records(records, value_budget_bytes(reply))
    assert 0 < len(fitted) < len(records)
    assert fitted == records[: len(fitted)]
    full = Response(**{**_as_fields(reply), "value": fitted})
    assert len(encode(full)) <= MAX_DATAGRAM_BYTES
    with pytest.raises(DhtMessageTooLarge):
        encode(Response(**{**_as_fields(reply), "value": records[: len(fitted) + 1]}))


@FAST
@given(st.lists(st.binary(max_size=300), max_size=40), st.integers(-5, 2000))
def test_fit_records_never_exceeds_its_budget(records: list[bytes], budget: int) -> None:
    fitted = fit_records(records, budget)
    assert fitted == records[: len(fitted)]
    if fitted:
        assert len(msgpack.packb(fitted)) <= budget
    if len(fitted) < len(records):
        assert len(msgpack.packb(records[: len(fitted) + 1])) > budget


def test_fit_records_refuses_what_msgpack_cannot_encode() -> None:
    with pytest.raises(DhtUsageError):
        fit_records([object()], 1000)


@FAST
@given(responses, st.lists(st.lists(st.binary(max_size=120), max_size=4), max_size=30))
def test_encode_with_records_is_the_fitted_reply_encoded(
    bare: Response, records: list[list[bytes]]
) -> None:
    bare = Response(**{**_as_fields(bare), "value": None})
    if _encodes(bare) is None:
        return
    data, count = encode_with_records(bare, records)
    fitted = fit_records(records, value_budget_bytes(bare))
    assert count == len(fitted)
    assert data == encode(Response(**{**_as_fields(bare), "value": fitted}))
    assert decode(data) == Response(**{**_as_fields(bare), "value": fitted})


def test_encode_with_records_refuses_a_reply_with_a_value_or_records_that_are_not_data() -> None:
    reply = _response(closer=_ipv6_contacts(3))
    with pytest.raises(DhtUsageError):
        encode_with_records(Response(**{**_as_fields(reply), "value": [1]}), [])
    with pytest.raises(DhtUsageError):
        encode_with_records(reply, [[object()]])


def _as_fields(msg: Response) -> dict[str, object]:
    return {name: getattr(msg, name) for name in Response.__dataclass_fields__}
