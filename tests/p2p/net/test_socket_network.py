"""SocketNetwork on real loopback sockets: the Network protocol over trio's TCP and UDP."""

import errno
import ipaddress
import socket

import pytest
import trio

from p2p.addresses import interface_addresses
from p2p.dht import UdpTransport
from p2p.net import Network, SocketNetwork, StreamListener


async def test_a_stream_opens_to_a_listener_and_both_ends_know_each_other():
    network = SocketNetwork()
    assert isinstance(network, Network)
    with trio.fail_after(10):
        listener = await network.listen_stream("127.0.0.1", 0)
        assert isinstance(listener, StreamListener)
        host, port = listener.local_address
        assert host == "127.0.0.1" and port > 0
        async with trio.open_nursery() as nursery:
            accepted = []

            async def accept():
                accepted.append(await listener.accept())

            nursery.start_soon(accept)
            dialed = await network.open_stream(("127.0.0.1", port))
        served, remote = accepted[0]
        assert remote == dialed.socket.getsockname()[:2]
        for stream in (dialed, served):
            assert stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        await dialed.send_all(b"hello")
        await dialed.send_eof()
        assert await served.receive_some() == b"hello"
        assert await served.receive_some() == b""
        await served.aclose()
        await dialed.aclose()
        await listener.aclose()


async def test_a_taken_port_is_eaddrinuse_and_a_port_without_listener_refuses():
    network = SocketNetwork()
    with trio.fail_after(10):
        listener = await network.listen_stream("127.0.0.1", 0)
        port = listener.local_address[1]
        with pytest.raises(OSError) as info:
            await network.listen_stream("127.0.0.1", port)
        assert info.value.errno == errno.EADDRINUSE
        await listener.aclose()
        # A bound socket that does not listen answers a connect with a reset.
        with socket.socket() as bound:
            bound.bind(("127.0.0.1", 0))
            with pytest.raises(OSError) as info:
                await network.open_stream(bound.getsockname())
        assert isinstance(info.value, ConnectionRefusedError)
        assert info.value.errno == errno.ECONNREFUSED


async def test_a_datagram_endpoint_is_a_udp_transport():
    network = SocketNetwork()
    with trio.fail_after(10):
        left = await network.bind_datagram("127.0.0.1", 0)
        right = await network.bind_datagram("127.0.0.1", 0)
        assert isinstance(left, UdpTransport)
        await left.send(b"ping", right.local_address)
        assert await right.receive() == (b"ping", left.local_address)
        await left.aclose()
        await right.aclose()


def test_interface_hosts_are_own_bindable_addresses_without_loopback_or_link_local():
    hosts = SocketNetwork().interface_hosts()
    assert hosts == interface_addresses()
    for host in hosts:
        ip = ipaddress.ip_address(host)
        assert not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))  # only an address of this machine binds
