"""The sans-IO node core: cores exchange datagrams directly, time is a number."""

import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.dht._contact import Contact, node_id_for
from p2p.dht._messages import Command, Request, decode, encode
from p2p.dht._node import NodeCore, ResponseReceived
from p2p.dht._records import sign_record, sign_unannounce
from p2p.keys import KeyPair, derive_topic
from tests.examples import examples

NOW = 1_800_000_000.0
TOPIC = derive_topic("test", "topic")
ANNOUNCER = KeyPair.from_seed(bytes(range(32)))


def make_core(n, *, persistent=True):
    address = (f"10.0.0.{n}", 9000)
    return NodeCore(now=NOW, persistent=persistent, reachable=persistent, address=address,
                    rng=random.Random(n), token_seed=bytes([n]) * 32)


def exchange(client, server, command, now=NOW, **fields):
    """client -> server request, server -> client reply; return the ResponseReceived."""
    tid, outgoing = client.make_request(command, server.address, now, **fields)
    replies, event = server.receive_datagram(outgoing.data, client.address or ("10.9.9.9", 1), now)
    assert event is None and len(replies) == 1
    assert replies[0].address == (client.address or ("10.9.9.9", 1))
    _, event = client.receive_datagram(replies[0].data, server.address, now)
    assert isinstance(event, ResponseReceived) and event.tid == tid
    return event


def signed_record(seq=1, expires=NOW + 600, topic=TOPIC):
    return sign_record(ANNOUNCER, topic, addresses=[("10.1.1.1", 7000)], seq=seq,
                       expires=int(expires))


def announce(client, server, record, topic=TOPIC, token=None):
    if token is None:
        token = exchange(client, server, Command.PING).response.token
    return exchange(client, server, Command.ANNOUNCE, target=topic, token=token,
                    value=record.to_wire())


def test_a_ping_teaches_both_sides_and_carries_the_observed_address():
    a, b = make_core(1), make_core(2)
    event = exchange(a, b, Command.PING)
    assert event.response.observed == a.address
    assert event.contact == Contact(node_id_for(*b.address), *b.address)
    assert b.address in [c.address for c in a.routing.contacts()]
    assert a.address in [c.address for c in b.routing.contacts()]


def test_ephemeral_nodes_query_but_are_never_stored():
    ephemeral, server = make_core(1, persistent=False), make_core(2)
    exchange(ephemeral, server, Command.PING)
    assert len(server.routing) == 0
    assert len(ephemeral.routing) == 1  # it still learns the persistent server


def test_an_ephemeral_node_learns_its_address_from_replies():
    node = NodeCore(now=NOW, rng=random.Random(1), token_seed=b"s" * 32)
    servers = [make_core(n) for n in (2, 3)]
    for server in servers:
        _, out = node.make_request(Command.PING, server.address, NOW)
        replies, _ = server.receive_datagram(out.data, ("10.7.7.7", 4000), NOW)
        node.receive_datagram(replies[0].data, server.address, NOW)
    assert node.address == ("10.7.7.7", 4000)


def test_a_reply_whose_id_does_not_match_its_address_is_ignored():
    a, b = make_core(1), make_core(2)
    tid, out = a.make_request(Command.PING, b.address, NOW)
    replies, _ = b.receive_datagram(out.data, a.address, NOW)
    # The same reply, arriving as if b lived elsewhere: its id no longer matches.
    a._pending[tid].address = ("10.0.0.99", 9000)
    _, event = a.receive_datagram(replies[0].data, ("10.0.0.99", 9000), NOW)
    assert event is None
    assert a.statistics().ignored_responses == 1
    assert len(a.routing) == 0


def test_a_reply_from_another_address_than_asked_is_ignored():
    a, b, c = make_core(1), make_core(2), make_core(3)
    tid, out = a.make_request(Command.PING, b.address, NOW)
    replies, _ = c.receive_datagram(out.data, a.address, NOW)
    _, event = a.receive_datagram(replies[0].data, c.address, NOW)
    assert event is None and tid in a._pending


def test_find_node_returns_closest_contacts_without_the_asker():
    server = make_core(1)
    others = [make_core(n) for n in range(2, 40)]
    for other in others:
        exchange(other, server, Command.PING)
    asker = others[0]
    target = node_id_for("10.0.0.30", 9000)
    event = exchange(asker, server, Command.FIND_NODE, target=target)
    closer = event.response.closer
    assert 0 < len(closer) <= 20
    assert asker.address not in [c.address for c in closer]
    distances = [int.from_bytes(c.id, "big") ^ int.from_bytes(target, "big") for c in closer]
    assert distances == sorted(distances)


def test_announce_then_lookup_returns_the_verified_record():
    announcer, server, looker = make_core(1), make_core(2), make_core(3)
    record = signed_record()
    assert announce(announcer, server, record).response.error is None
    event = exchange(looker, server, Command.LOOKUP, target=TOPIC)
    assert event.response.value == [record.to_wire()]


def test_a_crowded_topic_shows_every_announcer_across_a_few_lookups():
    """A reply fits about ten signed records; with thirty announcers, replies
    carry random samples, so a few dozen replies show them all."""
    server, looker = make_core(2), make_core(3)
    announcers = [KeyPair.from_seed(bytes([n]) * 32) for n in range(30)]
    for n, keypair in enumerate(announcers):
        record = sign_record(keypair, TOPIC, addresses=[("10.1.1.1", 7000 + n)], seq=1,
                             expires=int(NOW + 600))
        assert announce(make_core(1), server, record).response.error is None
    seen, per_reply = set(), []
    for _ in range(30):
        value = exchange(looker, server, Command.LOOKUP, target=TOPIC).response.value
        per_reply.append(len(value))
        seen |= {wire[0] for wire in value}
    assert max(per_reply) < 30  # one reply cannot carry them all...
    assert seen == {k.public_key for k in announcers}  # ...but the samples do


def test_announce_without_a_valid_token_is_refused():
    announcer, server = make_core(1), make_core(2)
    event = announce(announcer, server, signed_record(), token=b"\x00" * 16)
    assert event.response.error == "INVALID_TOKEN"
    other = make_core(3)
    stolen = exchange(other, server, Command.PING).response.token  # bound to other's address
    assert announce(announcer, server, signed_record(), token=stolen).response.error == (
        "INVALID_TOKEN"
    )
    assert len(server.store) == 0
    assert server.statistics().invalid_tokens == 2


@pytest.mark.parametrize(
    "record, topic, code",
    [
        (signed_record(topic=derive_topic("test", "other")), TOPIC, "BAD_SIGNATURE"),
        (signed_record(expires=NOW - 1), TOPIC, "EXPIRED"),
        (signed_record(expires=NOW + 3600), TOPIC, "EXPIRES_TOO_FAR"),
    ],
)
def test_forged_or_stale_records_are_refused_with_their_code(record, topic, code):
    announcer, server = make_core(1), make_core(2)
    assert announce(announcer, server, record, topic=topic).response.error == code
    assert len(server.store) == 0


def test_a_replayed_older_seq_does_not_replace_the_newer_record():
    announcer, server, looker = make_core(1), make_core(2), make_core(3)
    newer, older = signed_record(seq=5), signed_record(seq=4)
    announce(announcer, server, newer)
    assert announce(announcer, server, older).response.error == "SEQ_TOO_LOW"
    event = exchange(looker, server, Command.LOOKUP, target=TOPIC)
    assert event.response.value == [newer.to_wire()]


def test_a_signed_unannounce_removes_the_record_and_a_forged_one_does_not():
    announcer, server = make_core(1), make_core(2)
    announce(announcer, server, signed_record(seq=3))
    token = exchange(announcer, server, Command.PING).response.token
    forged = [ANNOUNCER.public_key, 3, KeyPair.generate().sign(b"x")]
    event = exchange(announcer, server, Command.UNANNOUNCE, target=TOPIC, token=token,
                     value=forged)
    assert event.response.error == "BAD_SIGNATURE" and len(server.store) == 1
    value = [ANNOUNCER.public_key, 3, sign_unannounce(ANNOUNCER, TOPIC, 3)]
    event = exchange(announcer, server, Command.UNANNOUNCE, target=TOPIC, token=token,
                     value=value)
    assert event.response.error is None and len(server.store) == 0


def test_records_expire_from_the_store():
    announcer, server, looker = make_core(1), make_core(2), make_core(3)
    announce(announcer, server, signed_record(expires=NOW + 60))
    server.maintenance(NOW + 61)
    event = exchange(looker, server, Command.LOOKUP, target=TOPIC, now=NOW + 61)
    assert event.response.value == []


def test_unanswered_requests_time_out():
    a, b = make_core(1), make_core(2)
    tid, _ = a.make_request(Command.PING, b.address, NOW)
    assert a.next_deadline() == NOW + a.config.request_timeout_s
    assert a.expire(NOW + 0.5) == []
    assert a.expire(NOW + 1.0) == [tid]
    assert a.statistics().timeouts == 1


def far_crowd(server, count):
    """Addresses whose ids share exactly their first 5 bits, unlike the server's
    (kademlia's table stops splitting such a bucket, so it fills up)."""
    own = node_id_for(*server.address)[0] >> 3
    chosen, sixth_bits = [], set()
    for n in range(2, 60_000):
        address = (f"10.1.{n >> 8 & 255}.{n & 255}", 9000)
        first = node_id_for(*address)[0]
        if first >> 3 == (own ^ 0b10000):
            chosen.append(address)
            sixth_bits.add(first >> 2 & 1)
            if len(chosen) >= count and len(sixth_bits) == 2:
                return chosen
    raise AssertionError("not enough addresses")


def fill_a_far_bucket(server, count=25):
    """Have ``count`` nodes of one far bucket ping ``server`` (more than k fit)."""
    for address in far_crowd(server, count):
        client = NodeCore(now=NOW, persistent=True, reachable=True, address=address,
                          rng=random.Random(1),
                          token_seed=b"c" * 32)
        exchange(client, server, Command.PING)


def test_a_full_bucket_pings_its_head_and_keeps_it_if_it_answers():
    server = make_core(1)
    fill_a_far_bucket(server)
    pings = server.maintenance(NOW)
    assert len(pings) == 1  # one full bucket, one head to check
    head_address = pings[0].address
    assert decode(pings[0].data).command is Command.PING
    head = NodeCore(now=NOW, persistent=True, reachable=True, address=head_address,
                    rng=random.Random(2),
                    token_seed=b"h" * 32)
    replies, _ = head.receive_datagram(pings[0].data, server.address, NOW)
    server.receive_datagram(replies[0].data, head_address, NOW)
    assert head_address in [c.address for c in server.routing.contacts()]


def test_a_head_that_does_not_answer_is_replaced_by_the_newcomer():
    server = make_core(1)
    fill_a_far_bucket(server)
    (ping,) = server.maintenance(NOW)
    server.expire(NOW + 5)  # the head never answered
    assert ping.address not in [c.address for c in server.routing.contacts()]


@settings(max_examples=examples(300))
@given(st.binary(max_size=600))
def test_arbitrary_datagrams_never_crash_the_node_and_it_keeps_answering(data):
    server, client = make_core(2), make_core(1)
    _, event = server.receive_datagram(data, ("10.0.0.1", 9000), NOW)
    assert event is None
    exchange(client, server, Command.PING)


@settings(max_examples=examples(200))
@given(st.integers(0, 200), st.integers(1, 255))
def test_mutated_requests_never_crash_the_node(position, mask):
    server, client = make_core(2), make_core(1)
    _, out = client.make_request(Command.ANNOUNCE, server.address, NOW, target=TOPIC,
                                 token=b"t" * 16, value=signed_record().to_wire())
    data = bytearray(out.data)
    data[position % len(data)] ^= mask
    server.receive_datagram(bytes(data), client.address, NOW)
    assert len(server.store) == 0  # nothing mutated (or untokened) is ever stored


def test_a_request_with_garbage_values_gets_an_error_reply_not_a_crash():
    server, client = make_core(2), make_core(1)
    token = exchange(client, server, Command.PING).response.token
    request = Request(77, Command.ANNOUNCE, TOPIC, None, token, ["not", "a", "record"])
    replies, _ = server.receive_datagram(encode(request), client.address, NOW)
    reply = decode(replies[0].data)
    assert reply.error in ("BAD_RECORD", "DECODE_ERROR")
    assert msgpack.unpackb(replies[0].data) is not None
