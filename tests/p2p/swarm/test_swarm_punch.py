"""Hole punching in one process on 127.0.0.1: a connection that starts on a blind
relay moves to a direct TCP path with the session, its channels and the bytes in
flight kept. (The NAT lab, tests/netns/test_punch_lab.py, punches through real
Linux NATs; here nothing blocks the direct path but the peer's announced address.)"""

import hashlib

import pytest
import trio

from p2p.host import ChannelService
from p2p.keys import KeyPair

from ..helpers import wait_until
from .helpers import swarm_net
from .test_swarm_relay import closed_port

TOTAL = 8 * 1024 * 1024


async def _relay_only_agent(net, relay_key: KeyPair, **options):
    """A swarm that announces an address nobody listens on and holds a reservation
    on the relay: every dial to it goes through the relay."""
    agent = await net.start(relays=(relay_key.public_key,),
                            announce_addresses=(("127.0.0.1", closed_port()),), **options)
    await wait_until(lambda: relay_key.public_key in agent.reserved_relays)
    return agent
PIECE = 16 * 1024


async def test_a_relayed_connection_moves_to_a_punched_path_mid_stream_and_keeps_every_byte():
    relay_key = KeyPair.generate()
    forwarded = bytearray()
    pattern = hashlib.sha256(b"punch").digest() * (PIECE // 32)
    received = bytearray()
    done = trio.Event()

    async def sink(channel):
        while len(received) < TOTAL:
            received.extend(await channel.receive())
        await channel.send(hashlib.sha256(received).digest())
        done.set()

    async def echo(channel):
        await channel.send(await channel.receive())

    with trio.fail_after(60):
        async with swarm_net() as net:
            await net.start_relay(relay_key,
                                  observer=lambda direction, chunk: forwarded.extend(chunk))
            agent = await _relay_only_agent(net, relay_key, services=[
                ChannelService.of_handler("sink", sink),
                ChannelService.of_handler("echo", echo)])
            worker = await net.start()
            connection = await worker.connect(agent.public_key)
            assert connection.relayed
            # A channel opened on the relay, streaming while the session moves.
            channel = await connection.open_channel("sink")
            sent = hashlib.sha256()
            for offset in range(0, TOTAL, PIECE):
                piece = bytes([offset // PIECE % 251]) + pattern[1:]
                await channel.send(piece)
                sent.update(piece)
                if offset == PIECE * 8:
                    await trio.sleep(0.05)  # the punch runs meanwhile
            assert await channel.receive() == sent.digest()
            await done.wait()
            await wait_until(lambda: connection.path == "punched_tcp", limit_s=15)
            theirs = agent.connections[worker.public_key]
            await wait_until(lambda: theirs.path == "punched_tcp")
            assert connection is worker.connections[agent.public_key]  # the same session
            assert not connection.relayed and connection.relay_key is None
            assert connection.punch_outcome == theirs.punch_outcome == "direct"
            # The stream started on the relay and finished on the punched path...
            assert PIECE * 4 < len(forwarded) < TOTAL
            # ...which carries every new channel: the relay sees nothing more.
            relayed_before = len(forwarded)
            fresh = await connection.open_channel("echo")
            await fresh.send(b"after the move")
            assert await fresh.receive() == b"after the move"
            assert len(forwarded) == relayed_before
            metrics = worker.metrics.registry
            assert metrics.get_sample_value(
                "swarm_punch_total", {"pair": "unknown/unknown", "outcome": "direct"}) == 1
            assert metrics.get_sample_value("swarm_connections", {"path": "punched_tcp"}) == 1
            assert metrics.get_sample_value("swarm_connections", {"path": "relayed"}) == 0


async def test_garbage_on_the_punch_channel_ends_the_punch_not_the_connection():
    """A peer (here one that does not punch itself) sends bytes that are no punch
    message: the punch is over, counted as a protocol error; the session lives on."""
    relay_key = KeyPair.generate()

    async def echo(channel):
        await channel.send(await channel.receive())

    with trio.fail_after(30):
        async with swarm_net() as net:
            await net.start_relay(relay_key)
            agent = await _relay_only_agent(net, relay_key, services=[
                ChannelService.of_handler("echo", echo)])
            hostile = await net.start(hole_punching=None)
            connection = await hostile.connect(agent.public_key)
            assert connection.relayed
            channel = await connection.open_channel("holepunch/1")
            await channel.send(b"\xc1 not msgpack")
            theirs = agent.connections[hostile.public_key]
            await wait_until(lambda: theirs.punch_outcome is not None)
            assert theirs.punch_outcome == "protocol_error"
            assert theirs.path == "relayed"
            probe = await connection.open_channel("echo")
            await probe.send(b"still here")
            assert await probe.receive() == b"still here"
            assert agent.metrics.registry.get_sample_value(
                "swarm_punch_total", {"pair": "unknown/unknown", "outcome": "protocol_error"}
            ) == 1


async def test_a_punch_asked_on_a_direct_connection_is_ignored():
    async with swarm_net() as net:
        agent = await net.start()
        other = await net.start(hole_punching=None)
        connection = await other.connect(agent.public_key)
        assert not connection.relayed
        channel = await connection.open_channel("holepunch/1")
        await channel.send(b"anything")
        with trio.fail_after(5), pytest.raises(trio.EndOfChannel):
            await channel.receive()  # the agent closed it unanswered
        theirs = agent.connections[other.public_key]
        assert theirs.punch_outcome is None and theirs.path == "direct"


async def test_between_a_consistent_and_a_random_nat_the_session_moves_to_quic_over_udp():
    """The NAT types the DHT would report are given here (loopback has no NAT): the
    random side opens birthday sockets, the consistent side sprays, QUIC runs on the
    5-tuple, and a stream running across the move arrives whole."""
    from p2p.dht._nat import NatType

    relay_key = KeyPair.generate()
    total = 2 * 1024 * 1024
    received = bytearray()
    done = trio.Event()

    async def sink(channel):
        while len(received) < total:
            received.extend(await channel.receive())
        await channel.send(hashlib.sha256(received).digest())
        done.set()

    with trio.fail_after(60):
        async with swarm_net() as net:
            await net.start_relay(relay_key)
            agent = await _relay_only_agent(net, relay_key, services=[
                ChannelService.of_handler("sink", sink)])
            worker = await net.start()
            agent.punch._nat_type = lambda: NatType.RANDOM
            worker.punch._nat_type = lambda: NatType.CONSISTENT
            connection = await worker.connect(agent.public_key)
            channel = await connection.open_channel("sink")
            sent = hashlib.sha256()
            for offset in range(0, total, 4096):
                piece = offset.to_bytes(8, "big") * 512
                await channel.send(piece)
                sent.update(piece)
                await trio.sleep(0.003)  # ~1.5 s of stream: the move comes in the middle
                if offset == 0:
                    moved_at_start = connection.path
            assert await channel.receive() == sent.digest()
            await channel.aclose()
            assert moved_at_start == "relayed"
            await wait_until(lambda: connection.path == "punched_udp", limit_s=30)
            theirs = agent.connections[worker.public_key]
            await wait_until(lambda: theirs.path == "punched_udp")
            received.clear()
            probe = await connection.open_channel("sink", b"2")  # a new channel, on QUIC
            for _ in range(total // 65536):
                await probe.send(b"x" * 65536)
            assert await probe.receive() == hashlib.sha256(b"x" * total).digest()
            assert worker.metrics.registry.get_sample_value(
                "swarm_connections", {"path": "punched_udp"}) == 1


async def test_when_the_punched_path_dies_the_session_falls_back_to_the_relay_losing_nothing():
    import socket as socket_module

    relay_key = KeyPair.generate()
    total = 16 * 1024 * 1024
    received = bytearray()

    async def sink(channel):
        while len(received) < total:
            received.extend(await channel.receive())
        await channel.send(hashlib.sha256(received).digest())

    with trio.fail_after(60):
        async with swarm_net() as net:
            await net.start_relay(relay_key)
            agent = await _relay_only_agent(net, relay_key, services=[
                ChannelService.of_handler("sink", sink)])
            worker = await net.start()
            connection = await worker.connect(agent.public_key)
            await wait_until(lambda: connection.path == "punched_tcp", limit_s=15)
            theirs = agent.connections[worker.public_key]
            await wait_until(lambda: theirs.path == "punched_tcp")
            channel = await connection.open_channel("sink")
            sent = hashlib.sha256()
            for offset in range(0, total, 65536):
                piece = offset.to_bytes(8, "big") * 8192
                await channel.send(piece)
                sent.update(piece)
                if offset == total // 2:
                    # The punched path dies under both ends (a NAT forgot it).
                    punched = connection.stream.transport_stream
                    punched.socket.shutdown(socket_module.SHUT_RDWR)
            assert await channel.receive() == sent.digest()
            await wait_until(lambda: connection.path == "relayed")
            await wait_until(lambda: theirs.path == "relayed")
            assert connection.punch_outcome == theirs.punch_outcome == "fell_back"
            assert connection.relay_key == relay_key.public_key
            assert worker.metrics.registry.get_sample_value("swarm_punch_fallbacks_total") == 1


async def test_a_tcp_punch_whose_first_round_fails_tries_again_from_fresh_ports():
    relay_key = KeyPair.generate()
    with trio.fail_after(60):
        async with swarm_net() as net:
            await net.start_relay(relay_key)
            agent = await _relay_only_agent(net, relay_key)
            worker = await net.start()
            assert worker.punch is not None
            race = worker.punch._race
            ports: list[int] = []

            async def first_round_fails(connection, holder, peer, initiator):
                ports.append(holder.port)
                if len(ports) == 1:
                    return None  # as when every SYN of the round was lost
                return await race(connection, holder, peer, initiator)

            worker.punch._race = first_round_fails
            connection = await worker.connect(agent.public_key)
            await wait_until(lambda: connection.path == "punched_tcp", limit_s=40)
            assert len(ports) == 2 and ports[0] != ports[1]
            theirs = agent.connections[worker.public_key]
            await wait_until(lambda: theirs.path == "punched_tcp")
