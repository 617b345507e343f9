"""Swarms reaching a peer through a blind relay, in one process.

The first test runs on real sockets; the second on a MemoryInternet under the
autojump clock. The namespace tests (tests/netns) show the same with a real
firewall; here the peer simply announces an address nobody listens on, so
direct dials fail fast.
"""

import os

import pytest
import trio

from p2p.host import ChannelService
from p2p.keys import KeyPair

from ..helpers import wait_until
from .helpers import memory_swarm_net, swarm_net


def closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_a_dialer_reaches_a_relay_only_peer_and_the_relay_sees_only_ciphertext():
    """On real sockets: the relay splices two kernel TCP connections."""
    relay_key = KeyPair.generate()
    forwarded = bytearray()
    marker = b"CLEARTEXT-MARKER-" + os.urandom(8).hex().encode()
    with trio.fail_after(30):
        async with swarm_net() as net:
            await net.start_relay(relay_key,
                                  observer=lambda direction, chunk: forwarded.extend(chunk))
            # No hole punching: the connection must stay on the relay to be watched.
            agent = await net.start(relays=(relay_key.public_key,), hole_punching=None,
                                    announce_addresses=(("127.0.0.1", closed_port()),))
            await wait_until(lambda: relay_key.public_key in agent.reserved_relays)
            received = trio.Event()
            got = []

            async def echo(channel):
                got.append(await channel.receive())
                await channel.send(got[-1][::-1])
                received.set()

            agent.add_service(ChannelService.of_handler("echo", echo))
            worker = await net.start(hole_punching=None)
            connection = await worker.connect(agent.public_key)
            assert connection.relayed and connection.relay_key == relay_key.public_key
            channel = await connection.open_channel("echo")
            await channel.send(marker)
            assert await channel.receive() == marker[::-1]
            await received.wait()
            await wait_until(lambda: worker.public_key in agent.connections)
            assert agent.connections[worker.public_key].relayed
            assert len(forwarded) > 100  # the relay forwarded the handshake and data...
            assert marker not in bytes(forwarded)  # ...but never saw the plaintext
            assert marker[::-1] not in bytes(forwarded)


async def test_a_peer_re_reserves_after_the_relay_restarts_with_the_same_key(autojump_clock):
    relay_key = KeyPair.generate()
    with trio.fail_after(40):
        async with memory_swarm_net() as net:
            _, first = await net.start_relay(relay_key)
            nowhere, _ = net.host()  # a host with nothing listening: dials are refused
            agent = await net.start(relays=(relay_key.public_key,), reservation_retry_max_s=1.0,
                                    announce_addresses=((nowhere, 4000),))
            await wait_until(lambda: relay_key.public_key in agent.reserved_relays)
            first.cancel()
            await wait_until(lambda: relay_key.public_key not in agent.reserved_relays)
            await net.start_relay(relay_key)  # same key, new host
            await wait_until(lambda: relay_key.public_key in agent.reserved_relays,
                             limit_s=20)
            worker = await net.start()
            connection = await worker.connect(agent.public_key)
            assert connection.relayed


async def test_connect_through_given_relays_skips_the_dht(autojump_clock):
    """``connect(key, relays=...)``: a caller told where the peer reserved (a CLI's
    command line) dials through those relays, with no DHT lookup."""
    relay_key = KeyPair.generate()
    with trio.fail_after(40):
        async with memory_swarm_net() as net:
            await net.start_relay(relay_key)
            nowhere, _ = net.host()
            agent = await net.start(relays=(relay_key.public_key,),
                                    announce_addresses=((nowhere, 4000),))
            await wait_until(lambda: relay_key.public_key in agent.reserved_relays)
            worker = await net.start()

            find = worker.dialer.find

            async def no_lookup_of_the_agent(public_key):
                assert public_key != agent.public_key, "the DHT was asked for the agent"
                return await find(public_key)  # the relay's own address: the DHT's

            worker.dialer.find = no_lookup_of_the_agent
            connection = await worker.connect(agent.public_key,
                                              relays=[relay_key.public_key])
            assert connection.relayed and connection.relay_key == relay_key.public_key


async def test_a_peer_the_dht_does_not_know_is_tried_through_our_own_relays(autojump_clock):
    """A job VM on a network that reaches only the relay box holds a reservation
    there and announces nowhere else: a daemon of the same deployment (which lists
    that relay) reaches it through the relay; one without relays gets NOT_FOUND."""
    from p2p.swarm import PeerNotFound

    relay_key = KeyPair.generate()
    with trio.fail_after(40):
        async with memory_swarm_net() as net:
            await net.start_relay(relay_key)
            agent = await net.start(relays=(relay_key.public_key,), announce_key=False)
            await wait_until(lambda: relay_key.public_key in agent.reserved_relays)
            stranger = await net.start()
            with pytest.raises(PeerNotFound) as info:
                await stranger.connect(agent.public_key)
            assert info.value.code == "NOT_FOUND"
            proxy = await net.start(relays=(relay_key.public_key,))
            connection = await proxy.connect(agent.public_key)
            assert connection.relayed and connection.relay_key == relay_key.public_key
            other = await net.start(relays=(relay_key.public_key,))
            with pytest.raises(PeerNotFound, match="not through our relays either"):
                await other.connect(KeyPair.generate().public_key)


async def test_with_no_dht_peers_reach_a_relay_by_its_known_address_and_pair_through_it(
        autojump_clock):
    """A deployment's relay, known by key and address (``known_peers``), serves peers
    that reach no DHT: the agent reserves on it, a CLI pairs through it."""
    import pytest

    from p2p.swarm import PeerNotFound

    relay_key = KeyPair.generate()
    with trio.fail_after(40):
        async with memory_swarm_net() as net:
            where, _ = await net.start_relay(relay_key, bootstrap=())  # a DHT of its own
            known = ((relay_key.public_key, (where.tcp,)),)
            nowhere, _ = net.host()
            agent = await net.start(relays=(relay_key.public_key,), bootstrap=(),
                                    known_peers=known, announce_addresses=((nowhere, 4000),))
            await wait_until(lambda: relay_key.public_key in agent.reserved_relays)
            cli = await net.start(bootstrap=(), known_peers=known)
            with pytest.raises(PeerNotFound) as lost:
                await cli.connect(agent.public_key)
            assert lost.value.code == "DHT_UNREACHABLE"
            assert "no DHT node answered (bootstrap: none configured)" in str(lost.value)
            connection = await cli.connect(agent.public_key, relays=[relay_key.public_key])
            assert connection.relayed and connection.relay_key == relay_key.public_key


async def test_a_client_with_the_dht_in_the_background_is_not_held_by_an_unreachable_dht(
        autojump_clock):
    """``dht_in_background``: a CLI whose DHT bootstrap does not answer (a firewalled
    workstation) starts at once and pairs through the relay it knows by address; a
    swarm that waits for its DHT takes the bootstrap's timeouts first."""
    relay_key = KeyPair.generate()
    with trio.fail_after(60):
        async with memory_swarm_net() as net:
            where, _ = await net.start_relay(relay_key, bootstrap=())
            known = ((relay_key.public_key, (where.tcp,)),)
            agent = await net.start(relays=(relay_key.public_key,), bootstrap=(),
                                    known_peers=known, announce_key=False)
            await wait_until(lambda: relay_key.public_key in agent.reserved_relays)
            silent, _ = net.host()  # nothing answers there
            timings = {}
            for background in (False, True):
                started = trio.current_time()
                cli = await net.start(bootstrap=((silent, 49737),), known_peers=known,
                                      announce_key=False, dht_in_background=background)
                timings[background] = trio.current_time() - started
                connection = await cli.connect(agent.public_key,
                                               relays=[relay_key.public_key])
                assert connection.relayed
            assert timings[True] < 0.5 < 2.0 < timings[False]
