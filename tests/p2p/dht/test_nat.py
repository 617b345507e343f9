"""NAT classification from where DHT nodes saw one socket (hyperdht's OPEN /
CONSISTENT / RANDOM), without I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from p2p.dht import NatType, classify_nat

NODES = [("203.0.113.10", 49738), ("203.0.113.11", 49738), ("198.51.100.9", 49738)]


def test_our_own_address_everywhere_is_open():
    seen = dict.fromkeys(NODES, ("10.0.0.2", 40000))
    assert classify_nat(seen, local_port=40000, local_hosts=["10.0.0.2", "127.0.0.1"]) \
        is NatType.OPEN


def test_one_public_address_and_port_for_every_node_is_consistent():
    seen = dict.fromkeys(NODES, ("198.51.100.1", 40000))  # a port-preserving NAT too
    assert classify_nat(seen, local_port=40000, local_hosts=["10.1.0.2"]) is NatType.CONSISTENT
    moved = dict.fromkeys(NODES, ("198.51.100.1", 61234))
    assert classify_nat(moved, local_port=40000, local_hosts=["10.1.0.2"]) is NatType.CONSISTENT


def test_a_port_per_node_is_random():
    seen = {node: ("198.51.100.1", 20000 + i) for i, node in enumerate(NODES)}
    assert classify_nat(seen, local_port=40000, local_hosts=["10.1.0.2"]) is NatType.RANDOM


def test_fewer_than_two_nodes_elsewhere_than_loopback_is_unknown():
    assert classify_nat({}, local_port=1, local_hosts=[]) is NatType.UNKNOWN
    one = {NODES[0]: ("198.51.100.1", 40000), ("127.0.0.1", 5): ("127.0.0.1", 40000)}
    assert classify_nat(one, local_port=40000, local_hosts=[]) is NatType.UNKNOWN
    # Two nodes on one address count once: a NAT's mapping is per destination address.
    same_host = {("203.0.113.10", 1): ("198.51.100.1", 40000),
                 ("203.0.113.10", 2): ("198.51.100.1", 40000)}
    assert classify_nat(same_host, local_port=40000, local_hosts=[]) is NatType.UNKNOWN


@given(st.dictionaries(st.tuples(st.ip_addresses().map(str), st.integers(1, 65535)),
                       st.tuples(st.ip_addresses().map(str), st.integers(1, 65535)),
                       max_size=12),
       st.integers(1, 65535))
def test_any_observations_give_a_type_never_an_error(observations, port):
    assert classify_nat(observations, local_port=port, local_hosts=["10.0.0.1"]) in NatType
