"""The relay end to end over real TCP on 127.0.0.1: reserve, pair, attach, relay, refuse."""

import hashlib
import os
import random

import pydantic
import pytest
import trio

from p2p.errors import KeyFormatError
from p2p.noise import SecretStream
from p2p.relay import (
    ATTACH_MAGIC,
    PROTOCOL,
    AttachStatus,
    PairReply,
    RefusalCode,
    RelayKeyMismatch,
    RelayRefused,
    Role,
    accept_via_relay,
    attach,
    dial_via_relay,
    keep_reservation,
    request_pair,
)
from p2p.rpc import Method, RpcClient, RpcError
from relay import RelayConfig

from ..p2p.helpers import ALICE, BOB, MALLORY
from .helpers import control, reserve, start_relay, wait_until

MIB = 1024 * 1024


class AnyTarget(pydantic.BaseModel):
    target: object


#: ``pair`` declared without our client's validation, as another client might send it.
PAIR_ANY_TARGET = Method("pair", params=AnyTarget, result=PairReply)
MARKER = b"PLAINTEXT-MARKER-the-relay-must-never-see-this"


def marked_payload(seed: int, size: int = MIB) -> bytes:
    """``size`` bytes of seeded noise with MARKER every 4 KiB."""
    rng = random.Random(seed)
    block = 4096
    return b"".join(MARKER + rng.randbytes(block - len(MARKER)) for _ in range(size // block))


async def relayed_pair(nursery, address, *, dialer=ALICE, target=BOB):
    """A dialer connection and the target's accepted connection, through the relay."""
    target_control = await control(nursery, address, target)
    incoming = await reserve(nursery, target_control)
    dialer_control = await control(nursery, address, dialer)
    accepted = {}

    async def accept():
        item = await incoming.receive()
        assert item.initiator == dialer.public_key
        accepted["connection"] = await accept_via_relay(address, item, target)

    async with trio.open_nursery() as inner:
        inner.start_soon(accept)
        dialed = await dial_via_relay(dialer_control, address, dialer, target.public_key)
    return dialed, accepted["connection"]


async def raw_pair(nursery, address):
    """Two raw attached sockets (no end-to-end handshake): (initiator, responder)."""
    target_control = await control(nursery, address, BOB)
    incoming = await reserve(nursery, target_control)
    dialer_control = await control(nursery, address, ALICE)
    ticket = await request_pair(dialer_control, BOB.public_key)
    item = await incoming.receive()
    streams = {}

    async def responder():
        streams["responder"] = await attach(address, item.token, role=Role.RESPONDER)

    async with trio.open_nursery() as inner:
        inner.start_soon(responder)
        streams["initiator"] = await attach(address, ticket.token, role=Role.INITIATOR)
    return streams["initiator"], streams["responder"], ticket, item


async def receive_all(stream) -> bytes:
    chunks = []
    while chunk := await stream.receive_some():
        chunks.append(chunk)
    return b"".join(chunks)


async def test_a_relayed_secret_stream_moves_a_mebibyte_each_way_and_the_relay_sees_no_plaintext(
    nursery,
):
    seen = bytearray()
    server, address = await start_relay(
        nursery, observer=lambda direction, chunk: seen.extend(chunk)
    )
    with trio.fail_after(30):
        dialed, accepted = await relayed_pair(nursery, address)
        assert dialed.remote_public_key == BOB.public_key
        assert accepted.remote_public_key == ALICE.public_key
        outbound, inbound = marked_payload(1), marked_payload(2)
        received = {}

        async def send(stream, data):
            await stream.send_all(data)
            await stream.send_eof()

        async def receive(name, stream):
            received[name] = await receive_all(stream)

        async with trio.open_nursery() as transfer:
            transfer.start_soon(send, dialed.stream, outbound)
            transfer.start_soon(send, accepted.stream, inbound)
            transfer.start_soon(receive, "at_target", accepted.stream)
            transfer.start_soon(receive, "at_dialer", dialed.stream)
        await dialed.stream.aclose()
        await accepted.stream.aclose()
    sha = hashlib.sha256
    assert sha(received["at_target"]).digest() == sha(outbound).digest()
    assert sha(received["at_dialer"]).digest() == sha(inbound).digest()
    # The relay forwarded every byte (ciphertext and framing exceed the payload)...
    assert len(seen) > 2 * MIB
    assert server.stats.bytes_relayed == len(seen)
    assert server.stats.pairs_made == 1
    # ...and none of it was plaintext.
    assert MARKER not in seen
    assert MARKER[:16] not in seen


async def test_a_relayed_connection_carries_channels_like_a_direct_one(nursery):
    _, address = await start_relay(nursery)
    with trio.fail_after(20):
        dialed, accepted = await relayed_pair(nursery, address)
        listener = accepted.listen("echo")
        await nursery.start(accepted.run)
        await nursery.start(dialed.run)
        channel = await dialed.open_channel("echo")
        served = await listener.accept()
        await channel.send(b"hello through the relay")
        message = await served.receive()
        await served.send(message.upper())
        assert await channel.receive() == b"HELLO THROUGH THE RELAY"
        await dialed.aclose()
        await accepted.aclose()


async def test_pairing_with_a_peer_without_reservation_is_refused_not_reserved(nursery):
    server, address = await start_relay(nursery)
    with trio.fail_after(10):
        connection = await control(nursery, address, ALICE)
        with pytest.raises(RelayRefused) as info:
            await request_pair(connection, BOB.public_key)
    assert info.value.code == RefusalCode.NOT_RESERVED
    assert "no reservation" in info.value.message
    assert server.stats.refusals[RefusalCode.NOT_RESERVED] == 1


async def test_the_allow_list_refuses_unlisted_keys_and_admits_listed_ones(nursery):
    config = RelayConfig(allow=frozenset({BOB.public_key}))
    server, address = await start_relay(nursery, config)
    with trio.fail_after(10):
        stranger = await control(nursery, address, MALLORY)
        with pytest.raises(RelayRefused) as info:
            await nursery.start(keep_reservation, stranger, lambda incoming: None)
        assert info.value.code == RefusalCode.NOT_ALLOWED
        allowed = await control(nursery, address, BOB)
        await reserve(nursery, allowed)
    assert server.stats.reservations == 1


async def test_attaching_with_an_unknown_token_is_refused(nursery):
    _, address = await start_relay(nursery)
    with trio.fail_after(10), pytest.raises(RelayRefused) as info:
        await attach(address, os.urandom(32), role=Role.INITIATOR)
    assert info.value.code == RefusalCode.UNKNOWN_TOKEN


async def test_a_token_cannot_be_used_twice(nursery):
    _, address = await start_relay(nursery)
    with trio.fail_after(10):
        initiator, responder, ticket, item = await raw_pair(nursery, address)
        for token, role in ((ticket.token, Role.INITIATOR), (item.token, Role.RESPONDER)):
            with pytest.raises(RelayRefused) as info:
                await attach(address, token, role=role)
            assert info.value.code == RefusalCode.UNKNOWN_TOKEN
        await initiator.aclose()
        await responder.aclose()


async def test_the_dialer_cannot_attach_in_the_targets_place(nursery):
    _, address = await start_relay(nursery)
    with trio.fail_after(10):
        target_control = await control(nursery, address, BOB)
        await reserve(nursery, target_control)
        dialer_control = await control(nursery, address, ALICE)
        ticket = await request_pair(dialer_control, BOB.public_key)
        with pytest.raises(RelayRefused) as info:
            await attach(address, ticket.token, role=Role.RESPONDER)
        assert info.value.code == RefusalCode.WRONG_ROLE


async def test_an_attach_with_an_unknown_role_is_refused_bad_attach(nursery):
    server, address = await start_relay(nursery)
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream(*address)
        await stream.send_all(ATTACH_MAGIC + b"\x07" + os.urandom(32))
        assert await stream.receive_some(1) == bytes([AttachStatus.BAD_ATTACH])
        assert await stream.receive_some(1) == b""  # and closed
        await stream.aclose()
    assert server.stats.refusals[RefusalCode.BAD_ATTACH] == 1


async def test_a_newer_reservation_by_the_same_key_replaces_the_older(nursery):
    _, address = await start_relay(nursery)
    ended = trio.Event()
    errors = []

    async def first_reservation(task_status=trio.TASK_STATUS_IGNORED):
        connection = await control(nursery, address, BOB)
        try:
            await keep_reservation(connection, lambda incoming: None, task_status=task_status)
        except RelayRefused as exc:
            errors.append(exc)
            ended.set()

    with trio.fail_after(10):
        await nursery.start(first_reservation)
        incoming = await reserve(nursery, await control(nursery, address, BOB))
        await ended.wait()
        assert [error.code for error in errors] == [RefusalCode.REPLACED]
        # Pairings now reach the newer reservation.
        dialer = await control(nursery, address, ALICE)
        await request_pair(dialer, BOB.public_key)
        item = await incoming.receive()
        assert item.initiator == ALICE.public_key


async def test_the_target_refuses_a_dialer_that_proves_another_key_than_announced(nursery):
    _, address = await start_relay(nursery)
    with trio.fail_after(10):
        incoming = await reserve(nursery, await control(nursery, address, BOB))
        # Mallory asks for the pairing under her own key...
        ticket = await request_pair(await control(nursery, address, MALLORY), BOB.public_key)
        failure = {}

        async def target():
            item = await incoming.receive()
            try:
                await accept_via_relay(address, item, BOB)
            except RelayKeyMismatch as exc:
                failure["error"] = exc

        async with trio.open_nursery() as inner:
            inner.start_soon(target)
            raw = await attach(address, ticket.token, role=Role.INITIATOR)
            # ...then handshakes through the relay as Alice.
            stream = await SecretStream.initiator(raw, ALICE, BOB.public_key)
        error = failure["error"]
        assert error.code == "KEY_MISMATCH"
        assert (error.expected, error.actual) == (MALLORY.public_key, ALICE.public_key)
        # The target hung up: the dialer's stream ends (cleanly or broken).
        try:
            data = await stream.receive_some()
        except trio.BrokenResourceError:
            data = b""
        assert data == b""
        await stream.aclose()


async def test_half_close_propagates_through_the_relay_and_the_other_way_keeps_flowing(nursery):
    server, address = await start_relay(nursery)
    with trio.fail_after(10):
        initiator, responder, _, _ = await raw_pair(nursery, address)
        await initiator.send_all(b"last words")
        await initiator.send_eof()
        assert await receive_all(responder) == b"last words"  # EOF arrived
        await responder.send_all(b"still talking")
        assert await initiator.receive_some() == b"still talking"
        await responder.send_eof()
        assert await initiator.receive_some() == b""
        await initiator.aclose()
        await responder.aclose()
        # Both directions ended: the pair is gone and its slots are free.
        await wait_until(lambda: server.stats.active_pairs == 0)
    assert server.state.pairs_of(ALICE.public_key) == 0
    assert server.state.pairs_of(BOB.public_key) == 0


async def test_pairs_per_key_relay_limits_and_self_pairing_are_refused(nursery):
    config = RelayConfig(max_pairs_per_key=1, max_reservations=1)
    server, address = await start_relay(nursery, config)
    with trio.fail_after(10):
        await reserve(nursery, await control(nursery, address, BOB))
        with pytest.raises(RelayRefused) as info:
            await nursery.start(keep_reservation, await control(nursery, address, MALLORY),
                                lambda incoming: None)
        assert info.value.code == RefusalCode.TOO_MANY_RESERVATIONS
        dialer = await control(nursery, address, ALICE)
        await request_pair(dialer, BOB.public_key)
        with pytest.raises(RelayRefused) as info:
            await request_pair(dialer, BOB.public_key)
        assert info.value.code == RefusalCode.TOO_MANY_PAIRS
        with pytest.raises(RelayRefused) as info:
            await request_pair(await control(nursery, address, BOB), BOB.public_key)
        assert info.value.code == RefusalCode.SELF_PAIR
    refusals = server.stats.refusals
    assert refusals[RefusalCode.TOO_MANY_PAIRS] == 1
    assert refusals[RefusalCode.TOO_MANY_RESERVATIONS] == 1
    assert refusals[RefusalCode.SELF_PAIR] == 1


async def test_connections_beyond_the_limit_are_closed_unread(nursery):
    server, address = await start_relay(nursery, RelayConfig(max_connections=1))
    with trio.fail_after(10):
        first = await trio.open_tcp_stream(*address)
        await first.send_all(ATTACH_MAGIC[:3])  # undecided: the relay keeps reading
        await wait_until(lambda: server.stats.connections == 1)
        second = await trio.open_tcp_stream(*address)
        assert await second.receive_some() == b""
        await first.aclose()
        await second.aclose()
    assert server.stats.refusals[RefusalCode.TOO_MANY_CONNECTIONS] == 1


async def test_a_malformed_target_is_refused_locally_or_by_the_relay(nursery):
    _, address = await start_relay(nursery)
    with trio.fail_after(10):
        connection = await control(nursery, address, ALICE)
        with pytest.raises(KeyFormatError):
            await request_pair(connection, b"\x01" * 31)
        # A peer that skips our client's check gets INVALID_PARAMS, not a dead link.
        channel = await connection.open_channel(PROTOCOL, b"raw")
        client = RpcClient(channel)
        await nursery.start(client.run)
        with pytest.raises(RpcError) as info:
            await client.call(PAIR_ANY_TARGET, {"target": "not bytes"}, timeout_s=5)
        assert info.value.code == "INVALID_PARAMS"
        await client.aclose()
