"""Address scopes: what a reader may use, in what order a dialer tries it, what to announce."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2p.addresses import (
    Scope,
    address_scope,
    announceable,
    interface_addresses,
    order_for_dialer,
    parse_fib_trie,
    parse_if_inet6,
    source_group,
    usable_by,
    visible_to,
)


@pytest.mark.parametrize(
    ("host", "scope"),
    [
        ("127.0.0.1", Scope.LOOPBACK),
        ("127.5.6.7", Scope.LOOPBACK),
        ("::1", Scope.LOOPBACK),
        ("::ffff:127.0.0.1", Scope.LOOPBACK),
        ("169.254.1.2", Scope.LINK_LOCAL),
        ("fe80::1", Scope.LINK_LOCAL),
        ("fe80::1%eth0", Scope.LINK_LOCAL),
        ("10.1.2.3", Scope.PRIVATE),
        ("172.16.0.1", Scope.PRIVATE),
        ("192.168.1.1", Scope.PRIVATE),
        ("100.64.0.1", Scope.PRIVATE),
        ("fd00::2", Scope.PRIVATE),
        ("8.8.8.8", Scope.PUBLIC),
        ("2606:4700::1", Scope.PUBLIC),
        ("0.0.0.0", None),
        ("::", None),
        ("224.0.0.1", None),
        ("ff02::1", None),
        ("255.255.255.255", None),
        ("240.0.0.1", None),
        ("example.com", None),
        ("", None),
    ],
)
def test_address_scope(host, scope):
    assert address_scope(host) is scope


def test_a_remote_reader_never_gets_loopback_or_link_local_addresses():
    record = [("127.0.0.1", 5000), ("fe80::1", 5000), ("10.0.0.7", 5000), ("8.8.8.8", 5000),
              ("0.0.0.0", 1)]
    assert usable_by(record, "203.0.113.9") == [("10.0.0.7", 5000), ("8.8.8.8", 5000)]
    assert usable_by(record, "10.0.0.2") == [("10.0.0.7", 5000), ("8.8.8.8", 5000)]
    assert usable_by(record, None) == [("10.0.0.7", 5000), ("8.8.8.8", 5000)]


def test_a_reader_on_the_same_host_or_link_keeps_those():
    record = [("127.0.0.1", 5000), ("fe80::1", 5000), ("8.8.8.8", 5000)]
    assert usable_by(record, "127.0.0.1") == [("127.0.0.1", 5000), ("8.8.8.8", 5000)]
    assert usable_by(record, "::1") == [("127.0.0.1", 5000), ("8.8.8.8", 5000)]
    assert usable_by(record, "fe80::9") == [("fe80::1", 5000), ("8.8.8.8", 5000)]


def test_a_dialer_tries_its_own_host_and_subnet_first_then_public_then_other_private():
    addresses = [("10.9.9.9", 1), ("8.8.8.8", 2), ("192.168.1.20", 3), ("127.0.0.1", 4),
                 ("192.168.1.5", 5)]
    assert order_for_dialer(addresses, ["192.168.1.5"]) == [
        ("127.0.0.1", 4), ("192.168.1.5", 5), ("192.168.1.20", 3), ("8.8.8.8", 2),
        ("10.9.9.9", 1),
    ]


def test_source_groups_are_ipv4_addresses_and_ipv6_slash_64s():
    assert source_group("192.0.2.1") != source_group("192.0.2.2")
    assert source_group("2001:db8:1:2::1") == source_group("2001:db8:1:2:ffff::9")
    assert source_group("2001:db8:1:2::1") != source_group("2001:db8:1:3::1")
    assert source_group("::ffff:192.0.2.1") == source_group("192.0.2.1")


def test_announceable_puts_what_others_see_first_and_loopback_last():
    assert announceable(("127.0.0.1", 7), ["192.168.1.5", "127.0.0.1"], 7) == [
        ("192.168.1.5", 7), ("127.0.0.1", 7)]
    assert announceable(("203.0.113.1", 9999), ["10.0.0.5", "127.0.0.1"], 7) == [
        ("203.0.113.1", 9999), ("10.0.0.5", 7), ("127.0.0.1", 7)]
    assert announceable(None, [], 7) == []
    assert announceable(None, ["0.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4",
                               "10.0.0.5"], 7) == [("10.0.0.1", 7), ("10.0.0.2", 7),
                                                   ("10.0.0.3", 7), ("10.0.0.4", 7)]


FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
           |-- 127.0.0.1
              /32 host LOCAL
     +-- 192.0.2.0/24 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
Local:
           |-- 192.0.2.2
              /32 host LOCAL
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
fe8000000000000000fc00fffe000001 04 40 20 80     eth0
fd000000000000000000000000000002 04 40 00 82     eth0
garbage
"""


def test_the_kernel_tables_parse():
    assert parse_fib_trie(FIB_TRIE) == ["127.0.0.1", "192.0.2.2"]
    assert parse_if_inet6(IF_INET6) == ["::1", "fe80::fc:ff:fe00:1", "fd00::2"]


def test_interface_addresses_are_never_loopback_link_local_or_unspecified():
    for host in interface_addresses():
        assert address_scope(host) in (Scope.PRIVATE, Scope.PUBLIC), host


# --- properties ------------------------------------------------------------------------

ipv4 = st.builds(lambda n: str(ipaddress.IPv4Address(n)), st.integers(0, 2**32 - 1))
ipv6 = st.builds(lambda n: str(ipaddress.IPv6Address(n)), st.integers(0, 2**128 - 1))
# Bias toward the interesting ranges: loopback, link-local, private.
special = st.sampled_from(["127.0.0.1", "127.1.2.3", "::1", "169.254.9.9", "fe80::5",
                           "10.0.0.1", "192.168.0.9", "fd00::1", "0.0.0.0", "224.0.0.5",
                           "8.8.4.4", "2001:db8::1"])
hosts = st.one_of(ipv4, ipv6, special)
addresses = st.lists(st.tuples(hosts, st.integers(1, 65535)), max_size=8)


@given(addresses, st.one_of(st.none(), hosts))
def test_usable_by_never_hands_a_narrow_address_to_a_reader_outside_it(record, viewer):
    usable = usable_by(record, viewer)
    viewer_scope = address_scope(viewer) if viewer is not None else None
    assert all(address in record for address in usable)
    assert len(set(usable)) == len(usable)
    for host, _ in usable:
        scope = address_scope(host)
        assert scope is not None
        if scope is Scope.LOOPBACK:
            assert viewer_scope is Scope.LOOPBACK
        if scope is Scope.LINK_LOCAL:
            assert viewer_scope is Scope.LINK_LOCAL
        assert visible_to(host, viewer)
    # Nothing wide is lost: every private or public address survives.
    for host, port in record:
        if address_scope(host) in (Scope.PRIVATE, Scope.PUBLIC):
            assert (host, port) in usable


@given(addresses, st.lists(hosts, max_size=3))
def test_order_for_dialer_is_a_permutation_with_own_network_first(record, own):
    ordered = order_for_dialer(record, own)
    kept = list(dict.fromkeys(a for a in record if address_scope(a[0]) is not None))
    assert sorted(ordered) == sorted(kept)
    local = [address_scope(h) is Scope.LOOPBACK or h in own for h, _ in ordered]
    assert local == sorted(local, reverse=True)  # all of this host's addresses lead


@given(st.one_of(st.none(), st.tuples(hosts, st.integers(1, 65535))), st.lists(hosts),
       st.integers(1, 65535))
def test_announceable_is_bounded_usable_and_loopback_comes_last(observed, local, port):
    out = announceable(observed, local, port)
    assert len(out) <= 4 and len(set(out)) == len(out)
    scopes = [address_scope(h) for h, _ in out]
    assert None not in scopes
    assert scopes == sorted(scopes, reverse=True)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_every_ipv6_address_of_one_slash_64_counts_as_one_source(prefix, a, b):
    one = str(ipaddress.IPv6Address(prefix << 64 | a))
    two = str(ipaddress.IPv6Address(prefix << 64 | b))
    assert source_group(one) == source_group(two)
