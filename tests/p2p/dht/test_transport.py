"""DHT datagram transports: real UDP on loopback (IPv4, IPv6) and the memory network."""

import pytest
import trio

from p2p.dht._transport import LinkProfile, MemoryNetwork, UdpTransport


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
async def test_udp_datagrams_travel_between_two_sockets(host):
    with trio.fail_after(10):
        left = await UdpTransport.bind(host)
        right = await UdpTransport.bind(host)
        await left.send(b"hello", right.local_address)
        data, source = await right.receive()
        assert data == b"hello" and source == left.local_address
        await left.aclose()
        await right.aclose()


async def test_a_dual_stack_socket_hears_ipv4_peers_as_ipv4():
    with trio.fail_after(10):
        dual = await UdpTransport.bind("::", dual_stack=True)
        v4 = await UdpTransport.bind("127.0.0.1")
        await v4.send(b"from v4", ("127.0.0.1", dual.local_address[1]))
        data, source = await dual.receive()
        assert data == b"from v4" and source == v4.local_address
        await dual.send(b"back", source)
        assert await v4.receive() == (b"back", ("127.0.0.1", dual.local_address[1]))
        await dual.aclose()
        await v4.aclose()


async def test_sending_to_a_closed_port_is_a_lost_datagram_not_an_error():
    with trio.fail_after(10):
        sender = await UdpTransport.bind("127.0.0.1")
        gone = await UdpTransport.bind("127.0.0.1")
        address = gone.local_address
        await gone.aclose()
        for _ in range(3):
            await sender.send(b"anyone?", address)
        await sender.aclose()


async def memory_pair(network, nursery):
    await nursery.start(network.run)
    return network.transport(), network.transport()


async def test_memory_network_delivers_after_its_latency(autojump_clock):
    network = MemoryNetwork(LinkProfile(latency_s=0.25))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            a, b = await memory_pair(network, nursery)
            start = trio.current_time()
            await a.send(b"x", b.local_address)
            assert await b.receive() == (b"x", a.local_address)
            assert trio.current_time() - start == pytest.approx(0.25)
            nursery.cancel_scope.cancel()


async def test_memory_network_loses_and_duplicates_as_seeded(autojump_clock):
    network = MemoryNetwork(LinkProfile(loss=0.3, duplicate=0.2), seed=42)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            a, b = await memory_pair(network, nursery)
            for index in range(1000):
                await a.send(index.to_bytes(2, "big"), b.local_address)
            await trio.sleep(1)
            received = []
            while True:
                try:
                    received.append(b._receive.receive_nowait()[0])
                except trio.WouldBlock:
                    break
            nursery.cancel_scope.cancel()
    assert 600 < len(received) < 900  # ~ 1000 * 1.2 * 0.7 = 840
    assert len(set(received)) < len(received)  # some arrived twice
    assert network.lost > 200


async def test_a_firewall_filter_drops_unwanted_datagrams(autojump_clock):
    network = MemoryNetwork()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            a, b = await memory_pair(network, nursery)
            network.allow = lambda source, destination: destination != b.local_address
            await a.send(b"blocked", b.local_address)
            await b.send(b"allowed", a.local_address)
            assert await a.receive() == (b"allowed", b.local_address)
            await trio.sleep(1)
            with pytest.raises(trio.WouldBlock):
                b._receive.receive_nowait()
            nursery.cancel_scope.cancel()


async def test_a_full_receive_queue_drops_and_counts(autojump_clock):
    network = MemoryNetwork(receive_queue=4)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            a, b = await memory_pair(network, nursery)
            for _ in range(10):
                await a.send(b"flood", b.local_address)
            await trio.sleep(1)
            assert b.stats.dropped_queue_full == 6
            nursery.cancel_scope.cancel()
