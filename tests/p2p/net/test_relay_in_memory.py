"""A relay, a firewalled target and a dialer on one MemoryInternet, under the autojump clock.

The relay client's ``attach`` (and ``dial_via_relay`` / ``accept_via_relay``)
take the ``network`` that opens their stream, so relayed connections run with
no sockets; by default they still use real TCP (tests/relay covers that).
"""

import pytest
import trio

from p2p.connection import Connection
from p2p.keys import KeyPair
from p2p.net import MemoryHost, MemoryInternet, StreamListener
from p2p.noise import SecretStream
from p2p.relay import (
    Incoming,
    RelayUnavailable,
    Role,
    accept_via_relay,
    attach,
    dial_via_relay,
    keep_reservation,
    request_pair,
)
from relay import RelayServer

from ..helpers import ALICE, BOB

RELAY = KeyPair.from_seed(b"\x52" * 32)
RELAY_HOST, TARGET_HOST, DIALER_HOST = "127.0.0.10", "127.0.0.20", "127.0.0.30"
RELAY_PORT = 49737


async def serve(listener: StreamListener, server: RelayServer, nursery: trio.Nursery) -> None:
    while True:
        try:
            stream, _ = await listener.accept()
        except trio.ClosedResourceError:
            return  # the relay's host went down
        nursery.start_soon(server.handle_stream, stream)


async def control(nursery, host: MemoryHost, keypair: KeyPair) -> Connection:
    raw = await host.open_stream((RELAY_HOST, RELAY_PORT))
    connection = Connection(await SecretStream.initiator(raw, keypair, RELAY.public_key))
    await nursery.start(connection.run)
    return connection


@pytest.fixture
async def world(nursery):
    internet = MemoryInternet(latency_s=0.005)
    await nursery.start(internet.run)
    # The target sits behind a firewall: nothing may connect in, it dials out.
    internet.block_inbound(TARGET_HOST)
    server = RelayServer(RELAY)
    await nursery.start(server.run)
    listener = await internet.host(RELAY_HOST).listen_stream("0.0.0.0", RELAY_PORT)
    nursery.start_soon(serve, listener, server, nursery)
    target, dialer = internet.host(TARGET_HOST), internet.host(DIALER_HOST)
    send, incoming = trio.open_memory_channel[Incoming](16)
    await nursery.start(keep_reservation, await control(nursery, target, BOB), send.send)
    return internet, target, dialer, incoming


async def test_raw_attaches_over_memory_hosts_join_a_firewalled_target_and_its_dialer(
    world, nursery, autojump_clock
):
    _, target, dialer, incoming = world
    relay_address = (RELAY_HOST, RELAY_PORT)
    with trio.fail_after(60):
        with pytest.raises(trio.TooSlowError), trio.fail_after(5):
            await dialer.open_stream((TARGET_HOST, 4000))  # no way in directly
        ticket = await request_pair(await control(nursery, dialer, ALICE), BOB.public_key)
        item = await incoming.receive()
        streams = {}

        async def responder():
            streams["responder"] = await attach(relay_address, item.token,
                                                role=Role.RESPONDER, network=target)

        async with trio.open_nursery() as inner:
            inner.start_soon(responder)
            streams["initiator"] = await attach(relay_address, ticket.token,
                                                role=Role.INITIATOR, network=dialer)
        await streams["initiator"].send_all(b"through the relay")
        assert await streams["responder"].receive_some() == b"through the relay"
        await streams["responder"].send_all(b"and back")
        assert await streams["initiator"].receive_some() == b"and back"


async def test_attach_to_a_closed_relay_host_is_unreachable(autojump_clock):
    internet = MemoryInternet()
    relay_host = internet.host(RELAY_HOST)
    await relay_host.listen_stream(RELAY_HOST, RELAY_PORT)
    dialer = internet.host(DIALER_HOST)
    await relay_host.aclose()
    with trio.fail_after(60), pytest.raises(RelayUnavailable) as info:
        await attach((RELAY_HOST, RELAY_PORT), b"\x00" * 32, role=Role.INITIATOR,
                     network=dialer)
    assert info.value.code == "RELAY_UNREACHABLE"


async def test_dial_and_accept_via_relay_run_on_memory_hosts(world, nursery, autojump_clock):
    _, target, dialer, incoming = world
    accepted = {}

    async def accept():
        item = await incoming.receive()
        accepted["connection"] = await accept_via_relay((RELAY_HOST, RELAY_PORT), item, BOB,
                                                        network=target)

    with trio.fail_after(60):
        relay_control = await control(nursery, dialer, ALICE)
        async with trio.open_nursery() as inner:
            inner.start_soon(accept)
            dialed = await dial_via_relay(relay_control, (RELAY_HOST, RELAY_PORT), ALICE,
                                          BOB.public_key, network=dialer)
        assert dialed.remote_public_key == BOB.public_key
        assert accepted["connection"].remote_public_key == ALICE.public_key
