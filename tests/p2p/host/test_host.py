"""The host: one accept path, one connection per peer, services that come and go.

Everything here runs on in-memory streams under the autojump clock: the
host's accept path takes any stream, so no socket is needed to prove it.
"""

from __future__ import annotations

import pydantic
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.connection import Connection
from p2p.host import ChannelService, HostConfig, PeerHost, RpcService, Service
from p2p.keys import KeyPair
from p2p.mux import ChannelRejected
from p2p.noise import Handshake, SecretStream
from p2p.rpc import CallContext, Method, Router, RpcClient, RpcError
from tests.examples import examples

from ..helpers import ALICE, BOB, MALLORY

SERVER = BOB


async def echo(channel, connection):
    async for message in channel:
        await channel.send(message)


def refused(host: PeerHost, reason: str) -> float:
    return host.metrics.registry.get_sample_value(
        "peer_connections_refused_total", {"reason": reason}) or 0


async def dial(nursery, host: PeerHost, keypair: KeyPair) -> Connection:
    """Connect ``keypair`` to ``host`` over a memory stream; return our side, running."""
    ours, theirs = trio.testing.memory_stream_pair()
    nursery.start_soon(host.accept, theirs, ("127.0.0.9", 1))
    stream = await SecretStream.initiator(ours, keypair, host.public_key)
    connection = Connection(stream)
    await nursery.start(connection.run)
    return connection


async def echo_once(connection: Connection, protocol: str, message: bytes) -> bytes:
    channel = await connection.open_channel(protocol)
    await channel.send(message)
    reply = await channel.receive()
    await channel.aclose()
    return reply


@pytest.fixture
async def host(nursery):
    host = PeerHost(SERVER)
    await nursery.start(host.run)
    return host


async def test_a_service_added_while_running_is_served_on_live_connections(
        host, nursery, autojump_clock):
    with trio.fail_after(30):
        client = await dial(nursery, host, ALICE)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(ChannelRejected):
            await client.open_channel("echo/1")  # nobody serves it yet
        host.add_service(ChannelService("echo/1", echo))
        assert await echo_once(client, "echo/1", b"now") == b"now"


async def test_a_removed_service_stops_its_channels_and_hook_on_every_connection(
        host, nursery, autojump_clock):
    hooks_running = 0
    hooks_cancelled = 0

    async def hook(connection):
        nonlocal hooks_running, hooks_cancelled
        hooks_running += 1
        try:
            await trio.sleep_forever()
        finally:
            hooks_running -= 1
            hooks_cancelled += 1

    host.add_service(ChannelService("echo/1", echo, on_connection=hook))
    with trio.fail_after(30):
        clients = [await dial(nursery, host, key) for key in (ALICE, MALLORY)]
        channel = await clients[0].open_channel("echo/1")
        await trio.testing.wait_all_tasks_blocked()
        assert hooks_running == 2
        host.remove_service("echo/1")
        await trio.testing.wait_all_tasks_blocked()
        assert (hooks_running, hooks_cancelled) == (0, 2)
        with pytest.raises((trio.EndOfChannel, trio.BrokenResourceError)):
            await channel.receive()  # the open channel was ended
        for client in clients:
            with pytest.raises(ChannelRejected):
                await client.open_channel("echo/1")
        assert len(host.connections) == 2  # the connections themselves go on


async def test_every_firewall_must_allow_a_peer(host, nursery, autojump_clock):
    host.add_firewall(lambda key, how: key != MALLORY.public_key)
    host.add_service(ChannelService("echo/1", echo,
                                    firewall=lambda key, how: key != ALICE.public_key))
    third = KeyPair.generate()
    with trio.fail_after(30):
        for refused_key in (ALICE, MALLORY):
            connection = await dial(nursery, host, refused_key)
            await connection.mux.wait_closed()
        allowed = await dial(nursery, host, third)
        assert await echo_once(allowed, "echo/1", b"in") == b"in"
    assert refused(host, "firewall") == 2
    assert list(host.connections) == [third.public_key]


async def test_a_firewall_that_raises_refuses(host, nursery, autojump_clock):
    def broken(key, how):
        raise RuntimeError("bug")

    remove = host.add_firewall(broken)
    assert not host.allows(ALICE.public_key, "incoming")
    remove()
    assert host.allows(ALICE.public_key, "incoming")


async def test_connections_beyond_the_cap_are_refused_and_counted(nursery, autojump_clock):
    host = PeerHost(SERVER, config=HostConfig(max_connections=2, max_connections_per_address=2))
    await nursery.start(host.run)
    host.add_service(ChannelService("echo/1", echo))
    with trio.fail_after(30):
        kept = [await dial(nursery, host, KeyPair.generate()) for _ in range(2)]
        for connection in kept:  # busy: each asked for something
            assert await echo_once(connection, "echo/1", b"x") == b"x"
        extra = await dial(nursery, host, KeyPair.generate())
        await extra.mux.wait_closed()
        assert refused(host, "full") == 1
        assert len(host.connections) == 2
        await kept[0].aclose()
        await trio.testing.wait_all_tasks_blocked()
        again = await dial(nursery, host, KeyPair.generate())  # a slot freed up
        assert await echo_once(again, "echo/1", b"x") == b"x"


async def test_a_stranger_that_asks_for_nothing_gives_its_slot_to_a_newcomer_at_once(
        nursery, autojump_clock):
    host = PeerHost(SERVER, config=HostConfig(max_connections=2, max_connections_per_address=2))
    await nursery.start(host.run)
    host.add_service(ChannelService("echo/1", echo))
    with trio.fail_after(30):
        idle = await dial(nursery, host, KeyPair.generate())
        busy = await dial(nursery, host, KeyPair.generate())
        assert await echo_once(busy, "echo/1", b"x") == b"x"
        newcomer = await dial(nursery, host, KeyPair.generate())
        await idle.mux.wait_closed()
        assert refused(host, "preempted") == 1
        assert await echo_once(newcomer, "echo/1", b"y") == b"y"
        assert await echo_once(busy, "echo/1", b"z") == b"z"


async def test_a_silent_socket_holding_the_last_handshake_slot_gives_way_to_a_peer(
        nursery, autojump_clock):
    host = PeerHost(SERVER, config=HostConfig(max_handshakes=1))
    await nursery.start(host.run)
    host.add_service(ChannelService("echo/1", echo))
    with trio.fail_after(30):
        silent, silent_theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(host.accept, silent_theirs, None)  # says nothing: holds the slot
        await trio.testing.wait_all_tasks_blocked()
        peer = await dial(nursery, host, ALICE)
        assert await echo_once(peer, "echo/1", b"x") == b"x"
        assert await silent.receive_some() == b""  # closed without a word
        await trio.testing.wait_all_tasks_blocked()
        assert refused(host, "evicted") == 1


async def test_a_newcomer_is_refused_only_while_every_handshake_is_younger_than_the_floor(
        nursery, autojump_clock):
    host = PeerHost(SERVER, config=HostConfig(max_handshakes=1, handshake_grace_s=1.0,
                                              handshake_min_age_s=0.25))
    await nursery.start(host.run)
    with trio.fail_after(30):
        talking, talking_theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(host.accept, talking_theirs, None)
        # A whole message 1 (it parses and is answered), then nothing.
        await talking.send_all(Handshake(KeyPair.generate(), initiator=True).initiate())
        assert await talking.receive_some()  # message 2: the daemon parsed it
        await trio.testing.wait_all_tasks_blocked()
        late, late_theirs = trio.testing.memory_stream_pair()
        await host.accept(late_theirs, None)
        assert await late.receive_some() == b""
        assert refused(host, "busy") == 1
        await trio.sleep(0.3)  # past the floor, within the grace: it may now be evicted
        _later, later_theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(host.accept, later_theirs, None)
        assert await talking.receive_some() == b""
        await trio.testing.wait_all_tasks_blocked()
        assert refused(host, "evicted") == 1


async def test_a_stray_byte_does_not_spare_a_handshake(nursery, autojump_clock):
    host = PeerHost(SERVER, config=HostConfig(max_handshakes=1))
    await nursery.start(host.run)
    with trio.fail_after(30):
        talking, talking_theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(host.accept, talking_theirs, None)
        await talking.send_all(b"\x20\x00")  # the start of message 1, then nothing
        await trio.testing.wait_all_tasks_blocked()
        _late, late_theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(host.accept, late_theirs, None)
        assert await talking.receive_some() == b""
        await trio.testing.wait_all_tasks_blocked()
    assert refused(host, "evicted") == 1 and refused(host, "busy") == 0


@pytest.mark.parametrize("first_bytes", [
    b"\x20\x00\x00\x00" + bytes(32),  # message 1 with an all-zero ephemeral key
    b"\xff\xff\xff\xff" + bytes(8),    # a length far beyond any handshake message
    b"\x00\x00\x00\x00",               # an empty message
])
async def test_hostile_first_bytes_end_that_socket_and_the_host_goes_on(
        host, nursery, autojump_clock, first_bytes):
    host.add_service(ChannelService("echo/1", echo))
    with trio.fail_after(60):
        attacker, theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(host.accept, theirs, None)
        await attacker.send_all(first_bytes)
        await attacker.send_eof()
        while await attacker.receive_some():
            pass  # closed, not crashed
        await trio.testing.wait_all_tasks_blocked()
        assert refused(host, "handshake") == 1
        honest = await dial(nursery, host, ALICE)
        assert await echo_once(honest, "echo/1", b"still here") == b"still here"


async def test_the_same_peer_dialling_again_replaces_its_old_connection(
        host, nursery, autojump_clock):
    host.add_service(ChannelService("echo/1", echo))
    with trio.fail_after(30):
        old = await dial(nursery, host, ALICE)
        new = await dial(nursery, host, ALICE)
        await old.mux.wait_closed()
        assert host.connections[ALICE.public_key].remote_public_key == ALICE.public_key
        assert len(host.connections) == 1
        assert await echo_once(new, "echo/1", b"new") == b"new"
        assert refused(host, "duplicate") == 0


async def test_a_host_refuses_its_own_key(host, nursery, autojump_clock):
    with trio.fail_after(30):
        loop = await dial(nursery, host, SERVER)
        await loop.mux.wait_closed()
    assert refused(host, "self") == 1 and not host.connections


async def test_adding_a_protocol_twice_is_refused(host):
    host.add_service(ChannelService("echo/1", echo))
    with pytest.raises(Exception) as info:
        host.add_service(ChannelService("echo/1", echo))
    assert info.value.code == "DUPLICATE_SERVICE"
    with pytest.raises(Exception) as info:
        host.add_service(Service())
    assert info.value.code == "BAD_SERVICE"


class Empty(pydantic.BaseModel):
    pass


class Who(pydantic.BaseModel):
    key: bytes


WHO = Method("who", Empty, Who)


async def test_rpc_handlers_know_their_caller_and_authorise_by_its_key(
        host, nursery, autojump_clock):
    seen: list[Connection] = []

    async def who(params: Empty, ctx: CallContext) -> Who:
        if ctx.remote_public_key == MALLORY.public_key:
            raise RpcError("NOT_ALLOWED", "not you")
        seen.append(ctx.connection)
        return Who(key=ctx.remote_public_key)

    router = Router()
    router.add(WHO, who)
    host.add_service(RpcService("who/1", router))

    async def ask(connection: Connection) -> bytes:
        client = RpcClient(await connection.open_channel("who/1"))
        await nursery.start(client.run)  # ends with the connection
        return (await client.call(WHO, Empty(), timeout_s=5)).key

    with trio.fail_after(30):
        alice = await dial(nursery, host, ALICE)
        assert await ask(alice) == ALICE.public_key
        assert seen == [host.connections[ALICE.public_key]]
        with pytest.raises(RpcError) as info:
            await ask(await dial(nursery, host, MALLORY))
        assert info.value.code == "NOT_ALLOWED"


async def test_a_hook_that_raises_is_logged_and_the_connection_goes_on(
        host, nursery, autojump_clock, caplog):
    async def broken(connection):
        raise RuntimeError("hook bug")

    host.add_service(ChannelService("echo/1", echo, on_connection=broken))
    with trio.fail_after(30):
        client = await dial(nursery, host, ALICE)
        assert await echo_once(client, "echo/1", b"ok") == b"ok"
    assert any(r.getMessage().startswith("host.hook_failed") for r in caplog.records)


async def test_adopt_needs_a_running_host():
    host = PeerHost(SERVER)
    with pytest.raises(Exception) as info:
        await host.adopt(None, None)  # type: ignore[arg-type]
    assert info.value.code == "NOT_RUNNING"


def test_host_limits_are_checked():
    for bad in ({"max_connections": 0}, {"max_handshakes": 0}, {"drain_timeout_s": -1},
                {"max_handshakes_per_address": 0}, {"first_bytes_timeout_s": 0},
                {"first_bytes_timeout_s": 6, "handshake_timeout_s": 5},
                {"max_connections": 4, "reserved_connections": 4},
                {"max_connections_per_address": 0}, {"handshake_grace_s": -1}):
        with pytest.raises(Exception) as info:
            HostConfig(**bad)
        assert info.value.code == "BAD_CONFIG"



@settings(max_examples=examples(25), deadline=None)
@given(cap=st.integers(1, 4),
       steps=st.lists(st.one_of(st.just("connect"), st.integers(0, 7)), max_size=12))
def test_live_connections_never_exceed_the_cap_whatever_the_order(cap, steps):
    """Connects from fresh keys and closes of random live ones, in any order:
    the host holds at most ``cap``, refuses (and counts) exactly the connects
    that found it full, and serves every one it holds."""

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            host = PeerHost(SERVER, config=HostConfig(max_connections=cap,
                                                      max_connections_per_address=cap))
            await nursery.start(host.run)
            host.add_service(ChannelService("echo/1", echo))
            ours: list[Connection] = []
            full = 0
            for step in steps:
                if step == "connect":
                    expect_full = len(host.connections) >= cap
                    connection = await dial(nursery, host, KeyPair.generate())
                    await trio.testing.wait_all_tasks_blocked()
                    if expect_full:
                        full += 1
                        assert connection.mux.closed_reason is not None
                    else:
                        ours.append(connection)
                        assert await echo_once(connection, "echo/1", b"?") == b"?"
                elif ours:
                    await ours.pop(step % len(ours)).aclose()
                    await trio.testing.wait_all_tasks_blocked()
                assert len(host.connections) <= cap
                assert len(host.connections) == len(ours)
                assert refused(host, "full") == full
            nursery.cancel_scope.cancel()

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_swarm_says_what_it_serves(nursery, autojump_clock):
    from p2p.net import MemoryInternet
    from p2p.swarm import Swarm, SwarmConfig

    internet = MemoryInternet()
    await nursery.start(internet.run)
    swarm = Swarm(ALICE, config=SwarmConfig(host="127.0.0.2"),
                  network=internet.host("127.0.0.2"),
                  services=[ChannelService("echo/1", echo)])
    with trio.fail_after(30):
        await nursery.start(swarm.run)
        swarm.add_service(ChannelService("logs/1", echo))
        stats = swarm.statistics()
        assert stats.services == ("echo/1", "logs/1") and stats.connections == 0
        swarm.remove_service("echo/1")
        assert swarm.statistics().services == ("logs/1",)
