"""Relay timers on trio's autojump clock, over in-memory streams: pairing, idle, first bytes."""

import functools

import pytest
import trio

from p2p.relay import (
    RefusalCode,
    RelayRefused,
    Role,
    attach_stream,
    keep_reservation,
    request_pair,
)
from relay import RelayConfig

from ..p2p.helpers import ALICE, BOB
from .helpers import MemoryRelay


async def reserved_relay(nursery, config):
    relay = MemoryRelay(nursery, config)
    await relay.start()
    send, incoming = trio.open_memory_channel(16)
    await nursery.start(keep_reservation, await relay.control(BOB), send.send)
    dialer = await relay.control(ALICE)
    return relay, incoming, dialer


async def test_a_pairing_not_completed_in_time_answers_pair_timeout_and_frees_its_slot(
    nursery, autojump_clock
):
    config = RelayConfig(pair_timeout_s=15.0, max_pairs_per_key=1)
    relay, incoming, dialer = await reserved_relay(nursery, config)
    with trio.fail_after(60):
        ticket = await request_pair(dialer, BOB.public_key)
        assert ticket.timeout_s == 15.0
        item = await incoming.receive()
        started = trio.current_time()
        with pytest.raises(RelayRefused) as info:
            await attach_stream(relay.connect(), ticket.token, role=Role.INITIATOR)
        assert info.value.code == RefusalCode.PAIR_TIMEOUT
        assert 14.0 <= trio.current_time() - started <= 15.5
        # The late side's token is gone too.
        with pytest.raises(RelayRefused) as info:
            await attach_stream(relay.connect(), item.token, role=Role.RESPONDER)
        assert info.value.code == RefusalCode.UNKNOWN_TOKEN
        stats = relay.server.stats
        assert (stats.pending_pairs, stats.active_pairs) == (0, 0)
        assert stats.refusals[RefusalCode.PAIR_TIMEOUT] == 1
        # The per-key slot (max 1) is free again.
        await request_pair(dialer, BOB.public_key)


async def test_a_pairing_nobody_attaches_to_expires_and_frees_its_slot(nursery, autojump_clock):
    config = RelayConfig(pair_timeout_s=5.0, max_pairs_per_key=1)
    relay, _, dialer = await reserved_relay(nursery, config)
    with trio.fail_after(60):
        await request_pair(dialer, BOB.public_key)
        with pytest.raises(RelayRefused):
            await request_pair(dialer, BOB.public_key)
        await trio.sleep(5.01)
        assert relay.server.stats.pending_pairs == 0
        await request_pair(dialer, BOB.public_key)


async def attached_pair(relay, incoming, dialer):
    ticket = await request_pair(dialer, BOB.public_key)
    item = await incoming.receive()
    initiator, responder = relay.connect(), relay.connect()
    async with trio.open_nursery() as both:
        both.start_soon(functools.partial(attach_stream, responder, item.token,
                                          role=Role.RESPONDER))
        await attach_stream(initiator, ticket.token, role=Role.INITIATOR)
    return initiator, responder


async def test_a_silent_pair_is_closed_at_the_idle_timeout_and_a_talking_one_is_not(
    nursery, autojump_clock
):
    relay, incoming, dialer = await reserved_relay(nursery, RelayConfig(idle_timeout_s=120.0))
    with trio.fail_after(600):
        silent = await attached_pair(relay, incoming, dialer)
        talking = await attached_pair(relay, incoming, dialer)
        started = trio.current_time()
        assert relay.server.stats.active_pairs == 2

        async def keep_talking():
            # A keep-alive-sized message every 5 s, answered, for 300 s.
            initiator, responder = talking
            for _ in range(60):
                await trio.sleep(5.0)
                await initiator.send_all(b"k" * 20)
                assert await responder.receive_some() == b"k" * 20

        async with trio.open_nursery() as inner:
            inner.start_soon(keep_talking)
            assert await silent[0].receive_some() == b""
            assert await silent[1].receive_some() == b""
            assert 119.0 <= trio.current_time() - started <= 121.0
        assert trio.current_time() - started >= 300.0
        assert relay.server.stats.active_pairs == 1


async def test_a_connection_that_says_nothing_is_closed_after_the_first_bytes_timeout(
    nursery, autojump_clock
):
    relay = MemoryRelay(nursery, RelayConfig(first_bytes_timeout_s=10.0))
    await relay.start()
    with trio.fail_after(60):
        stream = relay.connect()
        started = trio.current_time()
        assert await stream.receive_some() == b""
        assert 9.5 <= trio.current_time() - started <= 10.5
        assert relay.server.stats.connections == 0

