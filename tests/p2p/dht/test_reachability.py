"""A node that wants to be persistent stays ephemeral until a probe it did not
ask for (PING_BACK -> PROBE from another socket) has reached it."""

import random

import trio

from p2p.dht import DhtNode, LinkProfile, MemoryNetwork
from p2p.dht._messages import Command, Request, decode, encode
from p2p.dht._node import NodeCore

NOW = 1_800_000_000.0


def core(n, *, reachable=False, persistent=True):
    return NodeCore(now=NOW, persistent=persistent, reachable=reachable,
                    address=(f"10.0.0.{n}", 9000), rng=random.Random(n),
                    token_seed=bytes([n]) * 32)


def ask_for_probe(asker, checker, now=NOW):
    """asker -> checker PING_BACK; return the checker's (reply, probe) datagrams."""
    _, request = asker.make_reach_check(checker.address, now)
    out, _ = checker.receive_datagram(request.data, asker.address, now)
    return out


def test_an_unproven_node_sends_no_id_and_a_proven_one_does():
    node, checker = core(1), core(2, reachable=True)
    assert node.advertised_id is None
    _, ping = node.make_request(Command.PING, checker.address, NOW)
    assert decode(ping.data).sender_id is None

    reply, probe = ask_for_probe(node, checker)
    assert not reply.from_probe_socket and reply.address == node.address
    assert probe.from_probe_socket and probe.address == node.address
    message = decode(probe.data)
    assert isinstance(message, Request) and message.command is Command.PROBE
    node.receive_datagram(reply.data, checker.address, NOW)
    assert not node.reachable  # an answer is no proof: any firewall lets replies in

    out, event = node.receive_datagram(probe.data, ("10.0.0.2", 45000), NOW)
    assert out == [] and event is None  # probes are never answered
    assert node.reachable and node.advertised_id == node.node_id
    _, ping = node.make_request(Command.PING, checker.address, NOW)
    assert decode(ping.data).sender_id == node.node_id


def test_a_probe_from_the_node_we_asked_proves_nothing():
    node, checker = core(1), core(2, reachable=True)
    _, probe = ask_for_probe(node, checker)
    node.receive_datagram(probe.data, checker.address, NOW)
    assert not node.reachable


def test_a_probe_with_a_nonce_we_never_sent_proves_nothing():
    node = core(1)
    forged = Request(7, Command.PROBE, b"n" * 20)
    node.receive_datagram(encode(forged), ("10.0.0.5", 1234), NOW)
    assert not node.reachable
    assert node.statistics().ignored_responses == 1


def test_a_late_probe_proves_nothing():
    node, checker = core(1), core(2, reachable=True)
    _, probe = ask_for_probe(node, checker)
    node.expire(NOW + 60)  # the check's deadline passed
    node.receive_datagram(probe.data, ("10.0.0.2", 45000), NOW + 60)
    assert not node.reachable


def test_an_ephemeral_node_never_advertises_an_id_even_when_probed():
    client, checker = core(1, persistent=False), core(2, reachable=True)
    _, probe = ask_for_probe(client, checker)
    client.receive_datagram(probe.data, ("10.0.0.2", 45000), NOW)
    assert client.reachable and client.advertised_id is None


def test_a_new_address_must_prove_itself_again():
    node = core(1, reachable=True)
    voters = [core(n, reachable=True) for n in (2, 3)]
    for voter in voters:
        _, request = node.make_request(Command.PING, voter.address, NOW)
        # The voters see us behind a NAT at another address.
        (reply,), _ = voter.receive_datagram(request.data, ("192.0.2.9", 4000), NOW)
        node.receive_datagram(reply.data, voter.address, NOW)
    assert node.address == ("192.0.2.9", 4000)
    assert not node.reachable and node.advertised_id is None


def test_probes_for_others_are_rate_limited():
    checker = core(2, reachable=True)
    askers = [core(n) for n in range(10, 110)]
    probes = sum(len(ask_for_probe(asker, checker)) - 1 for asker in askers)
    stats = checker.statistics()
    assert probes == stats.probes_sent < len(askers)
    assert stats.probes_refused == len(askers) - probes
    # The bucket refills with time.
    assert len(ask_for_probe(core(200), checker, now=NOW + 10)) == 2


def conntrack_firewall(protected: set):
    """Drop datagrams to a protected address unless it sent to that source first
    (a stateful firewall or NAT: only replies come in)."""
    contacted: set = set()

    def allow(source, destination):
        if source in protected:
            contacted.add((source, destination))
        if destination in protected:
            return (destination, source) in contacted
        return True

    return allow


async def test_a_firewalled_node_stays_ephemeral_and_an_open_one_is_stored(autojump_clock):
    network = MemoryNetwork(LinkProfile())
    with trio.fail_after(7200):
        async with trio.open_nursery() as nursery:
            await nursery.start(network.run)
            boot = DhtNode(network.transport(), persistent=True, reachable=True,
                           rng=random.Random(1))
            await nursery.start(boot.run)
            others = []
            for seed in range(2, 8):
                node = DhtNode(network.transport(), bootstrap=[boot.address], persistent=True,
                               rng=random.Random(seed))
                await nursery.start(node.run)
                others.append(node)
            walled_transport = network.transport()
            network.allow = conntrack_firewall({walled_transport.local_address})
            walled = DhtNode(walled_transport, bootstrap=[boot.address], persistent=True,
                             rng=random.Random(99))
            await nursery.start(walled.run)
            open_node = DhtNode(network.transport(), bootstrap=[boot.address],
                                persistent=True, rng=random.Random(100))
            await nursery.start(open_node.run)

            everyone = [boot, *others]
            assert all(node.persistent for node in [*others, open_node])
            assert not walled.persistent and walled.address is not None
            stored = {c.address for node in everyone for c in node.core.routing.contacts()}
            assert open_node.address in stored
            assert walled.address not in stored
            # It still queries like any client.
            assert len(await walled.find_node(boot.core.node_id)) >= 5

            # It keeps trying, and is never stored, however long it runs.
            await trio.sleep(3600)
            assert not walled.persistent
            stored = {c.address for node in everyone for c in node.core.routing.contacts()}
            assert walled.address not in stored
            nursery.cancel_scope.cancel()


async def test_a_node_that_opens_up_later_becomes_persistent_and_is_stored(autojump_clock):
    network = MemoryNetwork(LinkProfile())
    with trio.fail_after(3600):
        async with trio.open_nursery() as nursery:
            await nursery.start(network.run)
            boot = DhtNode(network.transport(), persistent=True, reachable=True,
                           rng=random.Random(1))
            await nursery.start(boot.run)
            late_transport = network.transport()
            network.allow = conntrack_firewall({late_transport.local_address})
            late = DhtNode(late_transport, bootstrap=[boot.address], persistent=True,
                           rng=random.Random(2))
            await nursery.start(late.run)
            assert not late.persistent
            network.allow = None  # the operator opens the port
            await trio.sleep(15 * 60)  # re-checks back off from 30 s
            assert late.persistent
            assert late.address in {c.address for c in boot.core.routing.contacts()}
            nursery.cancel_scope.cancel()


async def test_nodes_of_a_udp_testnet_prove_themselves_over_real_sockets():
    from p2p.dht.testnet import udp_testnet

    with trio.fail_after(30):
        async with udp_testnet(6) as net:
            assert all(node.persistent for node in net.nodes)
            # The probes came from a second socket on each checker.
            assert sum(n.core.statistics().probes_sent for n in net.nodes) >= 5
