"""A DHT node under floods and with loopback peers: the store's bounds on the wire,
refusals counted by code, and no loopback address handed to a remote asker.

Cores exchange datagrams directly (time is a number);
network tests run on the in-memory network under the autojump clock.
"""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from p2p.addresses import Scope, address_scope, visible_to
from p2p.dht import DhtNode, MemoryNetwork, NodeConfig, dht_registry
from p2p.dht._contact import Contact
from p2p.dht._messages import Command
from p2p.dht._node import NodeCore, ResponseReceived
from p2p.dht._records import PeerRecord, record_topic_for_key, sign_record
from p2p.dht._transport import LinkProfile
from p2p.dht.testnet import memory_testnet
from p2p.keys import KeyPair, derive_topic
from tests.examples import examples

NOW = 1_800_000_000.0
SERVICE = [("10.1.2.3", 7000)]


def core_at(host, port=9000, *, config=None, seed=1):
    return NodeCore(now=NOW, persistent=True, reachable=True, address=(host, port),
                    config=config, rng=random.Random(seed), token_seed=bytes([seed]) * 32)


def exchange(client, server, command, **fields):
    tid, out = client.make_request(command, server.address, NOW, **fields)
    replies, _ = server.receive_datagram(out.data, client.address, NOW)
    _, event = client.receive_datagram(replies[0].data, server.address, NOW)
    assert isinstance(event, ResponseReceived) and event.tid == tid
    return event.response


def announce(client, server, keypair, topic, *, seq=1, addresses=SERVICE):
    record = sign_record(keypair, topic, addresses=addresses, seq=seq, expires=int(NOW) + 600)
    token = exchange(client, server, Command.PING).token
    return exchange(client, server, Command.ANNOUNCE, target=topic, token=token,
                    value=record.to_wire())


# --- one address fills the store -------------------------------------------------------


def test_a_flood_from_one_address_is_refused_by_code_and_an_honest_announce_still_lands():
    config = NodeConfig(max_topics=40, max_records_per_source=16, max_records_per_key=8)
    server = core_at("10.0.0.1", config=config)
    flooder, honest = core_at("10.66.0.1", seed=2), core_at("10.0.0.2", seed=3)
    one_key = KeyPair.from_seed(b"\x01" * 32)
    errors = [announce(flooder, server, one_key, derive_topic("flood", str(n))).error
              for n in range(30)]
    assert errors.count(None) == 8 and errors.count("KEY_FULL") == 22
    keys = [KeyPair.from_seed(bytes([n + 2]) * 32) for n in range(30)]
    errors = [announce(flooder, server, key, derive_topic("flood2", str(n))).error
              for n, key in enumerate(keys)]
    assert errors.count(None) == 8 and errors.count("SOURCE_FULL") == 22
    assert announce(honest, server, KeyPair.generate(), derive_topic("honest", "x")).error is None
    stats = server.statistics()
    assert dict(stats.refused_by_code) == {"KEY_FULL": 22, "SOURCE_FULL": 22}
    # ... and the metrics endpoint names the codes.
    text = generate_latest(dht_registry(SimpleNamespace(core=server, persistent=True,
                                                        transport=None))).decode()
    assert re.search(r'^dht_announces_refused_total\{code="SOURCE_FULL"\} 22\.0$', text,
                     re.MULTILINE)


async def test_after_a_flood_honest_announces_land_and_are_found(autojump_clock):
    """Regression: a flood from one address filled every node's store, and for
    20 minutes honest announces got "announced on 0 nodes"."""
    config = NodeConfig(max_topics=64, max_records_per_source=16)
    with trio.fail_after(600):
        async with memory_testnet(12, config=config, seed=3) as net:
            flooder = DhtNode(net.network.transport(("10.66.0.1", 9000)),
                              bootstrap=net.bootstrap, rng=random.Random(66))
            async with trio.open_nursery() as nursery:
                await nursery.start(flooder.run)
                records = [sign_record(KeyPair.from_seed(bytes([n % 200 + 1]) * 32),
                                       derive_topic("flood", str(n)), addresses=SERVICE,
                                       seq=1, expires=int(flooder.now()) + 1200)
                           for n in range(100)]
                for node in net.nodes:
                    token = (await flooder.request(Command.PING, node.address))[1].token
                    for record in records:
                        await flooder.request(Command.ANNOUNCE, node.address,
                                              target=derive_topic("flood", str(
                                                  records.index(record))),
                                              token=token, value=record.to_wire())
                assert all(node.core.store.held_by_source("10.66.0.1") == 16
                           for node in net.nodes)
                keypair = KeyPair.generate()
                topic = derive_topic("honest", "after the flood")
                stored = await net.nodes[3].announce_once(topic, keypair, addresses=SERVICE,
                                                          seq=1)
                assert stored >= 10
                found = [r async for r in net.nodes[8].lookup(topic)]
                assert [r.public_key for r in found] == [keypair.public_key]
                nursery.cancel_scope.cancel()


# --- throwaway keys evict a peer from its key topic --------------------------------------


@pytest.mark.parametrize("owner_first", [True, False])
async def test_64_throwaway_keys_do_not_hide_a_peer_from_find_peer(autojump_clock, owner_first):
    victim = KeyPair.generate()
    own_topic = record_topic_for_key(victim.public_key)
    with trio.fail_after(900):
        async with memory_testnet(12, seed=5) as net, trio.open_nursery() as nursery:
            victim_node, looker = net.nodes[5], net.nodes[9]
            # From outside the network, so every node is asked to store its records.
            attacker = DhtNode(net.network.transport(("10.66.0.1", 9000)),
                               bootstrap=net.bootstrap, rng=random.Random(66))
            await nursery.start(attacker.run)

            async def victim_announces(seq):
                return await victim_node.announce_once(own_topic, victim, addresses=SERVICE,
                                                       seq=seq)

            if owner_first:
                assert await victim_announces(1) >= 10
            await trio.sleep(60)  # the throwaway records expire later than the victim's
            for n in range(64):
                await attacker.announce_once(own_topic, KeyPair.generate(),
                                             addresses=[("10.6.6.6", 1 + n)], seq=1)
            if not owner_first:
                assert await victim_announces(1) >= 10
            record = await looker.find_peer(victim.public_key)
            assert record is not None and record.addresses == tuple(SERVICE)
            for node in net.nodes:
                held = node.core.store.get(own_topic, node.now(), 100)
                assert [r.public_key for r in held] in ([], [victim.public_key])
            nursery.cancel_scope.cancel()


# --- loopback addresses for remote askers -----------------------------------------------


def test_a_loopback_contact_is_never_handed_to_a_remote_asker():
    server = core_at("10.0.0.1")
    local, remote = core_at("127.0.0.1", 9100, seed=2), core_at("10.0.0.2", seed=3)
    exchange(local, server, Command.PING)  # the server stores 127.0.0.1:9100
    assert ("127.0.0.1", 9100) in [c.address for c in server.routing.contacts()]
    target = Contact.at("127.0.0.1", 9100).id
    from_remote = exchange(remote, server, Command.FIND_NODE, target=target)
    assert [c.address for c in from_remote.closer] == []
    asker = core_at("127.0.0.1", 9200, seed=4)
    from_local = exchange(asker, server, Command.FIND_NODE, target=target)
    assert ("127.0.0.1", 9100) in [c.address for c in from_local.closer]


def test_a_record_a_remote_asker_cannot_dial_is_left_out_of_its_lookup_reply():
    server = core_at("10.0.0.1")
    local, remote = core_at("127.0.0.1", 9100, seed=2), core_at("10.0.0.2", seed=3)
    topic = derive_topic("test", "loopback")
    only_loopback, both = KeyPair.generate(), KeyPair.generate()
    assert announce(local, server, only_loopback, topic, addresses=[("127.0.0.1", 9100)]) \
        .error is None
    assert announce(local, server, both, topic,
                    addresses=[("127.0.0.1", 9101), ("10.0.0.9", 9101)]).error is None
    from_remote = exchange(remote, server, Command.LOOKUP, target=topic)
    assert [r[0] for r in from_remote.value] == [both.public_key]
    from_local = exchange(core_at("127.0.0.1", 9300, seed=5), server, Command.LOOKUP,
                          target=topic)
    assert sorted(r[0] for r in from_local.value) == sorted([only_loopback.public_key,
                                                             both.public_key])


def test_one_observation_from_outside_beats_loopback_ones():
    node = NodeCore(now=NOW, persistent=True, rng=random.Random(1), token_seed=b"s" * 32)
    for n in range(3):
        node._learn_address(("127.0.0.1", 7000 + n), ("127.0.0.1", 9100), NOW)
    assert node.address == ("127.0.0.1", 9100)
    node.reachable = True
    node._learn_address(("10.0.0.1", 9000), ("10.0.0.50", 9100), NOW)
    assert node.address == ("10.0.0.50", 9100)
    assert not node.reachable  # the new address must prove itself again
    # More loopback votes do not take it back.
    for n in range(5):
        node._learn_address(("127.0.0.1", 8000 + n), ("127.0.0.1", 9100), NOW)
    assert node.address == ("10.0.0.50", 9100)


def test_one_liar_cannot_move_a_node_seen_at_a_wide_address():
    node = NodeCore(now=NOW, persistent=True, rng=random.Random(1), token_seed=b"s" * 32)
    for n in range(3):
        node._learn_address((f"10.0.0.{n + 1}", 9000), ("10.0.0.50", 9100), NOW)
    node._learn_address(("10.66.0.1", 9000), ("8.8.8.8", 1), NOW)
    assert node.address == ("10.0.0.50", 9100)


hosts = st.sampled_from(["127.0.0.1", "127.0.0.2", "::1", "169.254.0.7", "fe80::7",
                         "10.0.0.3", "10.0.0.4", "192.168.5.5", "8.8.8.8", "2001:db8::5"])


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(hosts, st.integers(1000, 1010)), min_size=1, max_size=15,
                unique=True),
       st.tuples(hosts, st.integers(2000, 2010)))
def test_no_reply_hands_an_asker_an_address_outside_its_reach(contacts, asker_address):
    server = core_at("10.0.0.1")
    for host, port in contacts:
        server.routing.add(Contact.at(host, port), NOW)
    asker = core_at(*asker_address, seed=9)
    topic = derive_topic("test", "scopes")
    record = sign_record(KeyPair.from_seed(b"\x05" * 32), topic,
                         addresses=[contacts[0]], seq=1, expires=int(NOW) + 600)
    server.store.put(topic, record, NOW)
    for command, target in ((Command.FIND_NODE, Contact.at(*contacts[0]).id),
                            (Command.LOOKUP, topic)):
        reply = exchange(asker, server, command, target=target)
        for contact in reply.closer:
            assert visible_to(contact.host, asker_address[0]), (contact, asker_address)
        for wire in reply.value or ():
            got = PeerRecord.from_wire(wire)
            assert any(visible_to(host, asker_address[0]) for host, _ in got.addresses)
        if address_scope(asker_address[0]) not in (Scope.LOOPBACK, Scope.LINK_LOCAL):
            assert all(address_scope(c.host) not in (Scope.LOOPBACK, Scope.LINK_LOCAL)
                       for c in reply.closer)


async def test_a_node_seen_only_over_loopback_is_not_handed_to_remote_nodes(autojump_clock):
    """A node on the bootstrap's host (seen there at 127.0.0.1) joins; nodes on
    other hosts never learn 127.0.0.1 from anyone."""
    network = MemoryNetwork(LinkProfile(), seed=1)
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            await nursery.start(network.run)
            boot = DhtNode(network.transport(("10.0.0.1", 9000)), persistent=True,
                           reachable=True, rng=random.Random(1))
            await nursery.start(boot.run)
            local = DhtNode(network.transport(("127.0.0.1", 9100)), bootstrap=[boot.address],
                            persistent=True, rng=random.Random(2))
            await nursery.start(local.run)
            remotes = []
            for n in range(6):
                node = DhtNode(network.transport((f"10.0.1.{n + 1}", 9000)),
                               bootstrap=[boot.address], persistent=True,
                               rng=random.Random(10 + n))
                await nursery.start(node.run)
                remotes.append(node)
            assert ("127.0.0.1", 9100) in [c.address for c in boot.core.routing.contacts()]
            for node in remotes:
                await node.find_node(local.core.node_id)
                assert all(address_scope(c.host) is not Scope.LOOPBACK
                           for c in node.core.routing.contacts()), node.address
            nursery.cancel_scope.cancel()


def test_a_wildcard_node_announces_its_interfaces_and_loopback_after_what_others_see():
    transport = SimpleNamespace(local_address=("0.0.0.0", 4444))
    node = DhtNode.__new__(DhtNode)  # no trio needed for these pure helpers
    node.transport = transport
    node._interfaces = lambda: ["192.168.1.5", "fd00::5", "127.0.0.1"]
    node.core = SimpleNamespace(address=None)
    assert node.local_hosts() == ["192.168.1.5", "127.0.0.1"]
    assert node.announce_addresses() == [("192.168.1.5", 4444), ("127.0.0.1", 4444)]
    node.core = SimpleNamespace(address=("127.0.0.1", 4444))  # seen over loopback only
    assert node.announce_addresses() == [("192.168.1.5", 4444), ("127.0.0.1", 4444)]
    node.core = SimpleNamespace(address=("203.0.113.4", 61000))
    assert node.announce_addresses()[0] == ("203.0.113.4", 61000)
    node.transport = SimpleNamespace(local_address=("::", 4444))
    assert node.local_hosts() == ["192.168.1.5", "fd00::5", "127.0.0.1", "::1"]


def test_a_dialer_keeps_what_its_host_can_use_and_tries_its_own_network_first():
    node = DhtNode.__new__(DhtNode)
    node._interfaces = lambda: ["192.168.1.5"]
    record = [("127.0.0.1", 1), ("8.8.8.8", 2), ("192.168.1.9", 3), ("fe80::1", 4),
              ("10.0.0.1", 5)]
    node.core = SimpleNamespace(address=("203.0.113.7", 5000))  # seen from outside
    assert node.dial_order(record) == [("192.168.1.9", 3), ("8.8.8.8", 2), ("10.0.0.1", 5)]
    node.core = SimpleNamespace(address=("127.0.0.1", 5000))  # our DHT is on this host
    assert node.dial_order(record) == [("127.0.0.1", 1), ("192.168.1.9", 3), ("8.8.8.8", 2),
                                       ("10.0.0.1", 5)]
    node.core = SimpleNamespace(address=None)
    assert ("127.0.0.1", 1) not in node.dial_order(record)
