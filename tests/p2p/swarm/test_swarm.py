"""Swarms: discovery by topic, one connection per peer, firewall, reconnects, leaving.

Every swarm runs on its own host of a MemoryInternet under the autojump clock,
except the first test, which runs the same discovery on real TCP and UDP
sockets on 127.0.0.1.
"""

import pytest
import trio

from p2p.dht import record_topic_for_key
from p2p.keys import KeyPair, derive_topic
from p2p.swarm import PeerNotFound, PeerRefused, PeerUnreachable, SwarmClosed

from ..helpers import ClosingResponder, wait_until
from .helpers import FAST_STREAMS, memory_swarm_net, swarm_net

TOPIC = derive_topic("test", "swarm")


def same_connection(a, b) -> bool:
    """Both ends of one connection share the handshake hash."""
    mine = a.connections.get(b.public_key)
    theirs = b.connections.get(a.public_key)
    return (
        mine is not None
        and theirs is not None
        and mine.stream.handshake_hash == theirs.stream.handshake_hash
    )


async def test_a_client_finds_a_server_by_topic_and_knows_how_it_got_there():
    """On real sockets: the kernel's TCP and UDP, not the model of them, carry
    the DHT lookup, the dial and a channel."""
    with trio.fail_after(20):
        async with swarm_net() as net:
            server = await net.start()
            client = await net.start()
            server.join(TOPIC, server=True, client=False)
            await server.flush()
            client.join(TOPIC, server=False, client=True)
            await client.flush()
            connection = client.connections[server.public_key]
            assert connection.remote_public_key == server.public_key
            assert connection.remote_address == server.address
            assert connection.is_local and not connection.relayed
            assert connection.is_initiator
            assert TOPIC in connection.topics
            await wait_until(lambda: client.public_key in server.connections)
            incoming = server.connections[client.public_key]
            assert not incoming.is_initiator and incoming.topics == set()
            assert same_connection(client, server)
            # Channels work over it.
            listener = incoming.listen("echo")
            channel = await connection.open_channel("echo")
            accepted = await listener.accept()
            await channel.send(b"hello")
            assert await accepted.receive() == b"hello"


async def test_ten_swarms_on_one_topic_connect_pairwise_exactly_once(autojump_clock):
    """Ten joining at once find each other and dial from both ends (45 pairs,
    each of which must settle on one connection both ends agree on); twenty
    proved nothing more at four times the CPU (each pair is a Noise handshake)."""
    with trio.fail_after(60):
        async with memory_swarm_net() as net:
            swarms = [await net.start() for _ in range(10)]
            for swarm in swarms:
                swarm.join(TOPIC)

            def all_connected() -> bool:
                return all(len(s.connections) == len(swarms) - 1 for s in swarms)

            await wait_until(all_connected, limit_s=45)
            await trio.sleep(1.0)  # autojump clock: no late duplicate appears in 1 s
            assert all_connected()
            for i, a in enumerate(swarms):
                for b in swarms[i + 1 :]:
                    assert same_connection(a, b), "the two ends kept different connections"


async def test_simultaneous_dials_keep_one_connection(autojump_clock):
    with trio.fail_after(30):
        async with memory_swarm_net() as net:
            for _ in range(5):
                a, b = await net.start(), await net.start()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(a.connect, b.public_key)
                    nursery.start_soon(b.connect, a.public_key)
                await wait_until(lambda a=a, b=b: same_connection(a, b), limit_s=5)
                await trio.sleep(0.3)  # autojump clock: and no second one appears later
                assert len(a.connections) == len(b.connections) == 1
                assert same_connection(a, b)
                net.stop(a)
                net.stop(b)


async def test_the_firewall_refuses_before_any_channel_opens(autojump_clock):
    with trio.fail_after(20):
        async with memory_swarm_net() as net:
            refused = []

            def no_strangers(key, how):
                refused.append(how)
                return False

            opened = []
            guarded = await net.start(
                firewall=no_strangers, handlers={"echo": lambda ch: opened.append(ch)}
            )
            visitor = await net.start()
            try:
                connection = await visitor.connect(guarded.public_key)
                with pytest.raises(trio.BrokenResourceError):
                    await connection.open_channel("echo")
            except Exception:
                pass  # the connection may already be gone
            await wait_until(lambda: refused == ["incoming"])
            assert guarded.connections == {} and opened == []

            # An outgoing dial the firewall refuses never touches the network.
            with pytest.raises(PeerRefused):
                await guarded.connect(visitor.public_key)
            assert refused == ["incoming", "connect"]


async def test_a_peer_that_restarts_on_a_new_port_is_reconnected(autojump_clock):
    with trio.fail_after(30):
        async with memory_swarm_net() as net:
            keypair = KeyPair.generate()
            server = await net.start(keypair)
            server.join(TOPIC, client=False)
            await server.flush()
            client = await net.start()
            client.join(TOPIC, server=False)
            await client.flush()
            old_address = client.connections[keypair.public_key].remote_address
            net.stop(server)
            await wait_until(lambda: keypair.public_key not in client.connections)
            reborn = await net.start(keypair)
            reborn.join(TOPIC, client=False)
            assert reborn.address != old_address
            await wait_until(lambda: keypair.public_key in client.connections, limit_s=15)
            assert client.connections[keypair.public_key].remote_address == reborn.address


async def test_a_silent_peer_is_dropped_within_the_idle_timeout(autojump_clock):
    from p2p.noise import SecretStream

    with trio.fail_after(20):
        async with memory_swarm_net() as net:
            swarm = await net.start(connection=FAST_STREAMS)
            mute_key = KeyPair.generate()
            mute_host, network = net.host()
            listener = await network.listen_stream(mute_host, 0)
            held = []

            async def accept_then_say_nothing(task_status=trio.TASK_STATUS_IGNORED):
                task_status.started()
                raw, _ = await listener.accept()
                held.append(await SecretStream.responder(raw, mute_key))
                await trio.sleep_forever()  # no keep-alives, no mux: a hung peer

            await net.nursery.start(accept_then_say_nothing)
            connection = await swarm.connect(
                mute_key.public_key, addresses=[listener.local_address]
            )
            assert mute_key.public_key in swarm.connections
            start = trio.current_time()
            await connection.wait_closed()
            # The idle timeout is 1 s in tests, counted from the handshake's last
            # bytes (just before `start`); on the autojump clock the time is exact.
            assert 0.9 < trio.current_time() - start <= 1.0 + 1e-9
            assert mute_key.public_key not in swarm.connections


async def test_connect_names_every_address_it_could_not_reach(autojump_clock):
    with trio.fail_after(20):
        async with memory_swarm_net() as net:
            swarm = await net.start()
            host, network = net.host()
            closed = await network.listen_stream(host, 0)
            port = closed.local_address[1]
            await closed.aclose()
            target = KeyPair.generate().public_key
            with pytest.raises(PeerUnreachable) as caught:
                await swarm.connect(target, addresses=[(host, port)])
            assert f"{host}:{port}" in str(caught.value)
            assert "connection refused" in str(caught.value)
            assert caught.value.code == "UNREACHABLE"
            with pytest.raises(PeerNotFound):
                await swarm.connect(KeyPair.generate().public_key)


@pytest.mark.parametrize(("closes", "connects"), [(2, True), (3, False)])
async def test_connect_takes_a_new_socket_when_a_handshake_is_closed_unread(
    autojump_clock, closes, connects
):
    """A daemon under a flood closes handshakes it has not read yet: the swarm
    dials the same address again, twice at most, before it gives up on it."""
    with trio.fail_after(20):
        async with memory_swarm_net() as net:
            swarm = await net.start()
            host, network = net.host()
            listener = await network.listen_stream(host, 0)
            server = KeyPair.generate()
            responder = ClosingResponder(server, closes=closes)
            net.nursery.start_soon(responder.serve, listener)
            if connects:
                connection = await swarm.connect(
                    server.public_key, addresses=[listener.local_address]
                )
                assert connection.remote_public_key == server.public_key
            else:
                with pytest.raises(PeerUnreachable) as caught:
                    await swarm.connect(server.public_key, addresses=[listener.local_address])
                assert "during the handshake" in str(caught.value)
            assert responder.accepted == 3


async def test_leave_unannounces_the_topic(autojump_clock):
    with trio.fail_after(30):
        async with memory_swarm_net() as net:
            server = await net.start()
            server.join(TOPIC, client=False)
            await server.flush()
            looker = net.dht.nodes[2]

            async def keys_on_topic():
                return {r.public_key async for r in looker.lookup(TOPIC)}

            assert server.public_key in await keys_on_topic()
            await server.leave(TOPIC)
            assert server.public_key not in await keys_on_topic()
            # Its key stays findable for connect(): only the topic was left.
            found = {
                r.public_key async for r in looker.lookup(record_topic_for_key(server.public_key))
            }
            assert server.public_key in found


async def test_two_swarms_that_join_at_the_same_instant_meet_quickly(autojump_clock):
    with trio.fail_after(20):
        async with memory_swarm_net() as net:
            a, b = await net.start(), await net.start()
            start = trio.current_time()
            a.join(TOPIC)
            b.join(TOPIC)
            await wait_until(lambda: same_connection(a, b), limit_s=5)
            assert trio.current_time() - start < 2.0


async def test_metrics_count_connections_and_bytes(autojump_clock):
    with trio.fail_after(20):
        async with memory_swarm_net() as net:
            a, b = await net.start(), await net.start()
            await a.connect(b.public_key)
            from prometheus_client import generate_latest

            text = generate_latest(a.metrics.registry).decode()
            assert 'swarm_connections{path="direct"} 1.0' in text
            assert 'swarm_connection_attempts_total{path="direct"} 1.0' in text
            sent = [
                line
                for line in text.splitlines()
                if line.startswith('swarm_bytes_total{direction="sent"}')
            ]
            assert sent and float(sent[0].split()[-1]) >= 0


async def test_a_stopped_swarm_refuses_to_connect():
    from p2p.swarm import Swarm

    swarm = Swarm(KeyPair.generate())
    with pytest.raises(SwarmClosed):
        await swarm.connect(KeyPair.generate().public_key)


async def test_a_handler_reads_everything_sent_before_the_peer_hung_up(autojump_clock):
    with trio.fail_after(20):
        async with memory_swarm_net() as net:
            got, finished = [], trio.Event()

            async def slow_reader(channel):
                await trio.sleep(0.3)  # autojump clock: the peer is long gone by now
                try:
                    while True:
                        got.append(await channel.receive())
                except trio.EndOfChannel:
                    pass
                finished.set()

            server = await net.start(handlers={"drain": slow_reader})
            client = await net.start()
            connection = await client.connect(server.public_key)
            channel = await connection.open_channel("drain")
            for n in range(50):
                await channel.send(b"%d" % n)
            await channel.send_eof()
            await connection.aclose()
            await finished.wait()
            assert got == [b"%d" % n for n in range(50)]
