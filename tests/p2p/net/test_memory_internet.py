"""Hosts of a MemoryInternet: connects, refusals, firewalls, latency and ports on trio's clock."""

import errno

import pytest
import trio

from p2p.net import MemoryInternet, Network, StreamListener

A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"


@pytest.fixture
async def internet(nursery):
    internet = MemoryInternet(latency_s=0.01)
    await nursery.start(internet.run)
    return internet


async def connect_and_accept(dialer: Network, listener: StreamListener, address):
    async with trio.open_nursery() as nursery:
        accepted = []

        async def accept():
            accepted.append(await listener.accept())

        nursery.start_soon(accept)
        stream = await dialer.open_stream(address)
    return stream, *accepted[0]


async def test_the_listener_sees_the_dialers_host_and_an_ephemeral_port(internet, autojump_clock):
    listener = await internet.host(B).listen_stream(B, 4000)
    assert isinstance(listener, StreamListener)
    assert listener.local_address == (B, 4000)
    with trio.fail_after(5):
        start = trio.current_time()
        dialed, served, remote = await connect_and_accept(internet.host(A), listener, (B, 4000))
        # A connect takes one round trip: 10 ms each way.
        assert trio.current_time() - start == pytest.approx(0.02)
        assert remote[0] == A and 32768 <= remote[1] < 61000
        assert served.remote_address == remote and dialed.local_address == remote
        await dialed.send_all(b"hello")
        assert await served.receive_some() == b"hello"
        await served.send_eof()
        assert await dialed.receive_some() == b""
        # Half-closed: the other direction still flows.
        await dialed.send_all(b"more")
        assert await served.receive_some() == b"more"


async def test_latency_can_differ_per_direction(internet, autojump_clock):
    internet.set_latency(A, B, 0.1)
    internet.set_latency(B, A, 0.3)
    listener = await internet.host(B).listen_stream("0.0.0.0", 80)
    with trio.fail_after(5):
        start = trio.current_time()
        dialed, served, _ = await connect_and_accept(internet.host(A), listener, (B, 80))
        assert trio.current_time() - start == pytest.approx(0.4)
        start = trio.current_time()
        await served.send_all(b"x")
        await dialed.receive_some()
        assert trio.current_time() - start == pytest.approx(0.3)
        start = trio.current_time()
        await dialed.send_all(b"y")
        await served.receive_some()
        assert trio.current_time() - start == pytest.approx(0.1)


async def test_a_connect_to_a_port_nobody_listens_on_is_refused_after_a_round_trip(
    internet, autojump_clock
):
    internet.host(B)
    with trio.fail_after(5):
        start = trio.current_time()
        with pytest.raises(ConnectionRefusedError) as info:
            await internet.host(A).open_stream((B, 4000))
        assert info.value.errno == errno.ECONNREFUSED
        assert trio.current_time() - start == pytest.approx(0.02)
    stats = internet.statistics()
    assert (stats.connects, stats.refused_connects, stats.dropped_connects) == (0, 1, 0)


async def test_a_blocked_path_hangs_until_the_callers_deadline_like_dropped_syns(
    internet, autojump_clock
):
    await internet.host(B).listen_stream(B, 4000)
    internet.block(A, B)
    with pytest.raises(trio.TooSlowError):
        with trio.fail_after(30):
            await internet.host(A).open_stream((B, 4000))
    assert internet.statistics().dropped_connects == 1
    # Without a deadline it gives up as Linux does, with ETIMEDOUT.
    with pytest.raises(TimeoutError) as info:
        await internet.host(A).open_stream((B, 4000))
    assert isinstance(info.value, OSError) and info.value.errno == errno.ETIMEDOUT
    # Only that direction is blocked, and unblocking opens it.
    listener = await internet.host(A).listen_stream(A, 5000)
    with trio.fail_after(5):
        await connect_and_accept(internet.host(B), listener, (A, 5000))
        internet.unblock(A, B)
        await internet.host(A).open_stream((B, 4000))


async def test_an_address_no_host_holds_drops_the_connect(internet, autojump_clock):
    with pytest.raises(trio.TooSlowError), trio.fail_after(60):
        await internet.host(A).open_stream(("127.9.9.9", 80))


async def test_a_firewalled_cluster_takes_no_connections_from_outside_but_dials_out(
    internet, autojump_clock
):
    inside, outside = [A, B], C
    for member in inside:
        internet.block_inbound(member, allow_from=inside)
    for host in (A, B, C):
        await internet.host(host).listen_stream(host, 7000)
    with trio.fail_after(5):
        await internet.host(A).open_stream((B, 7000))  # inside to inside
        await internet.host(A).open_stream((C, 7000))  # inside out
    with pytest.raises(trio.TooSlowError), trio.fail_after(60):
        await internet.host(outside).open_stream((A, 7000))
    internet.unblock_inbound(A)
    with trio.fail_after(5):
        await internet.host(outside).open_stream((A, 7000))


async def test_an_established_connection_survives_a_later_block(internet, autojump_clock):
    listener = await internet.host(B).listen_stream(B, 4000)
    with trio.fail_after(5):
        dialed, served, _ = await connect_and_accept(internet.host(A), listener, (B, 4000))
        internet.block(A, B)
        internet.block(B, A)
        await dialed.send_all(b"still here")
        assert await served.receive_some() == b"still here"


async def test_a_taken_port_is_eaddrinuse_and_a_wildcard_conflicts_with_any_address(internet):
    host = internet.host(A, interfaces=["127.1.0.2"])
    await host.listen_stream(A, 4000)
    for bind in (A, "0.0.0.0", ""):
        with pytest.raises(OSError) as info:
            await host.listen_stream(bind, 4000)
        assert info.value.errno == errno.EADDRINUSE
    await host.listen_stream("127.1.0.2", 4000)  # another address of the host is free
    with pytest.raises(OSError) as info:
        await host.listen_stream(B, 4001)
    assert info.value.errno == errno.EADDRNOTAVAIL


async def test_port_zero_picks_distinct_free_ports_and_tcp_and_udp_ports_are_separate(internet):
    host = internet.host(A)
    first = await host.listen_stream(A, 0)
    second = await host.listen_stream(A, 0)
    assert first.local_address[1] != second.local_address[1]
    assert 32768 <= first.local_address[1] < 61000
    # The swarm binds UDP on the port TCP got.
    transport = await host.bind_datagram("0.0.0.0", first.local_address[1])
    assert transport.local_address == (A, first.local_address[1])
    with pytest.raises(OSError) as info:
        await host.bind_datagram(A, first.local_address[1])
    assert info.value.errno == errno.EADDRINUSE
    free = await host.bind_datagram(A, 0)
    assert free.local_address[1] != first.local_address[1]


async def test_closing_a_listener_refuses_later_connects_and_resets_unaccepted_ones(
    internet, autojump_clock
):
    listener = await internet.host(B).listen_stream(B, 4000)
    dialer = internet.host(A)
    with trio.fail_after(5):
        queued = await dialer.open_stream((B, 4000))  # connected, never accepted
        await listener.aclose()
        with pytest.raises(trio.BrokenResourceError):
            await queued.receive_some()
        with pytest.raises(ConnectionRefusedError):
            await dialer.open_stream((B, 4000))
        with pytest.raises(trio.ClosedResourceError):
            await listener.accept()
        # The port is free again.
        await internet.host(B).listen_stream(B, 4000)


async def test_closing_a_host_closes_its_listeners_and_resets_its_connections(
    internet, autojump_clock
):
    server = internet.host(B)
    listener = await server.listen_stream(B, 4000)
    transport = await server.bind_datagram(B, 4000)
    with trio.fail_after(5):
        dialed, _, _ = await connect_and_accept(internet.host(A), listener, (B, 4000))
        await server.aclose()
        with pytest.raises(trio.BrokenResourceError):
            await dialed.receive_some()
        with pytest.raises(ConnectionRefusedError):
            await internet.host(A).open_stream((B, 4000))
        with pytest.raises(trio.ClosedResourceError):
            await listener.accept()
        assert transport.closed
        with pytest.raises(OSError) as info:
            await server.listen_stream(B, 0)
        assert info.value.errno == errno.ENETDOWN
        # The address can host a new machine.
        again = internet.host(B)
        assert again is not server
        await again.listen_stream(B, 4000)


async def test_datagrams_follow_the_block_but_replies_pass_like_a_stateful_firewall(
    internet, autojump_clock
):
    outside = await internet.host(A).bind_datagram(A, 9000)
    inside = await internet.host(B).bind_datagram(B, 9000)
    internet.block_inbound(B)
    with trio.fail_after(60):
        await outside.send(b"unsolicited", (B, 9000))
        with trio.move_on_after(1):
            await inside.receive()
            pytest.fail("an unsolicited datagram passed the firewall")
        await inside.send(b"query", (A, 9000))
        assert await outside.receive() == (b"query", (B, 9000))
        await outside.send(b"reply", (B, 9000))
        assert await inside.receive() == (b"reply", (A, 9000))
        # Another port of the outside host is not part of the flow.
        other = await internet.host(A).bind_datagram(A, 9001)
        await other.send(b"probe", (B, 9000))
        with trio.move_on_after(1):
            await inside.receive()
            pytest.fail("a datagram from outside the flow passed the firewall")
        # The flow expires after 30 s without traffic.
        await trio.sleep(31)
        await outside.send(b"late reply", (B, 9000))
        with trio.move_on_after(1):
            await inside.receive()
            pytest.fail("a reply after the flow expired passed the firewall")


async def test_hosts_report_their_configured_interfaces_and_addresses_are_unique(internet):
    assert internet.host(A).interface_hosts() == [A]
    host = internet.host(B, interfaces=["127.5.0.1", B])
    assert host.interface_hosts() == [B, "127.5.0.1"]
    assert internet.host(B) is host
    with pytest.raises(ValueError):
        internet.host(C, interfaces=["127.5.0.1"])
    with pytest.raises(ValueError):
        internet.host("not-an-address")


async def test_a_stream_to_another_address_of_the_same_host_reaches_a_wildcard_listener(
    internet, autojump_clock
):
    host = internet.host(A, interfaces=["127.5.0.9"])
    listener = await host.listen_stream("::", 4000)
    assert listener.local_address == ("::", 4000)
    with trio.fail_after(5):
        _, _, remote = await connect_and_accept(internet.host(C), listener, ("127.5.0.9", 4000))
        assert remote[0] == C


async def test_outgoing_connections_hold_distinct_ports_until_closed(internet, autojump_clock):
    listener = await internet.host(B).listen_stream(B, 4000)
    dialer = internet.host(A)
    with trio.fail_after(5):
        first, _, first_remote = await connect_and_accept(dialer, listener, (B, 4000))
        _second, _, second_remote = await connect_and_accept(dialer, listener, (B, 4000))
        assert first_remote != second_remote
        # A listener on port 0 takes none of the ports in use.
        chosen = (await dialer.listen_stream(A, 0)).local_address[1]
        assert chosen not in (first_remote[1], second_remote[1])
        await first.aclose()
        assert first_remote[1] not in dialer._out_ports
        assert second_remote[1] in dialer._out_ports
