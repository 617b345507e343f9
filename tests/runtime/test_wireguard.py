"""WireGuard keys, tunnel addresses and config files (runtime/wireguard.py).

The files themselves meet wireguard-go on namespaces in
tests/netns/test_wireguard_gateway.py; here, what must hold for any team.
"""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.keys import KeyPair
from runtime.wireguard import (
    GatewayPeer,
    WireGuardError,
    assign_addresses,
    gateway_address,
    gateway_config,
    member_config,
    parse_config,
    wg_key,
    wg_public_key_of,
    without_addresses,
)

SUBNET = "10.250.0.0/24"
keys = st.lists(st.binary(min_size=32, max_size=32), max_size=60, unique=True)


@given(keys)
def test_every_member_gets_an_address_of_its_own_inside_the_subnet_never_the_gateways(team):
    addresses = assign_addresses(SUBNET, team)
    assert set(addresses) == set(team)
    assert len(set(addresses.values())) == len(team)
    network = ipaddress.IPv4Network(SUBNET)
    for address in addresses.values():
        assert address in network and address != gateway_address(SUBNET)
        assert address not in (network.network_address, network.broadcast_address)


@settings(max_examples=50)
@given(keys, st.binary(min_size=32, max_size=32))
def test_a_new_member_whose_slot_is_free_moves_nobody(team, newcomer):
    before = assign_addresses(SUBNET, team)
    after = assign_addresses(SUBNET, [*team, newcomer])
    assert assign_addresses(SUBNET, list(reversed(team))) == before  # order does not matter
    if newcomer in before or after[newcomer] not in before.values():
        assert {key: after[key] for key in before} == before


def test_a_collision_moves_only_members_probed_past_it():
    """Keys whose slots collide: the later one takes the next free slot."""
    team = [bytes([i]) * 32 for i in range(200)]  # 200 of 253 slots: collisions certain
    before = assign_addresses(SUBNET, team)
    after = assign_addresses(SUBNET, team[:-1])
    moved = [key for key in team[:-1] if before[key] != after[key]]
    assert len(moved) < 20  # a removal reshuffles a short run at most, not the team


def test_a_subnet_too_small_or_bad_is_refused_with_the_reason():
    with pytest.raises(WireGuardError, match="13 member addresses, 14 members"):
        assign_addresses("10.250.0.0/28", [bytes([i]) * 32 for i in range(14)])
    for bad in ("10.250.0.0/30", "10.250.0.1/24", "nonsense"):
        with pytest.raises(WireGuardError):
            assign_addresses(bad, [])


def test_the_gateway_config_names_each_member_by_key_and_address_only():
    members = [KeyPair.generate() for _ in range(3)]
    addresses = assign_addresses(SUBNET, [m.public_key for m in members])
    peers = [GatewayPeer(wg_public_key_of(k), a) for k, a in addresses.items()]
    gateway = KeyPair.generate()
    sections = parse_config(gateway_config(gateway.x25519_private, 51820, peers))
    assert sections[0] == ("Interface", {"PrivateKey": wg_key(gateway.x25519_private),
                                         "ListenPort": "51820"})
    assert {(s["PublicKey"], s["AllowedIPs"]) for _, s in sections[1:]} == {
        (wg_public_key_of(k), f"{a}/32") for k, a in addresses.items()}
    # The member's WireGuard key is the X25519 key of their CLI identity.
    assert wg_public_key_of(members[0].public_key) == wg_key(members[0].x25519_public)


def test_a_members_config_routes_the_jobs_networks_to_the_gateway_and_keeps_alive():
    member, gateway = KeyPair.generate(), KeyPair.generate()
    text = member_config(member.x25519_private, "10.250.0.7",
                         wg_public_key_of(gateway.public_key), "gw.example:51820",
                         ["10.88.0.0/24", "fd00::/64"])
    (interface_name, interface), (peer_name, peer) = parse_config(text)
    assert (interface_name, peer_name) == ("Interface", "Peer")
    assert interface["Address"] == "10.250.0.7/32"
    assert peer == {"PublicKey": wg_public_key_of(gateway.public_key),
                    "Endpoint": "gw.example:51820", "AllowedIPs": "10.88.0.0/24, fd00::/64",
                    "PersistentKeepalive": "25"}
    setconf, taken = without_addresses(text)
    assert taken == {"Address": "10.250.0.7/32"} and "Address" not in setconf


@pytest.mark.parametrize(("change", "words"), [
    ({"gateway_public_key": "not-a-key"}, "not a WireGuard public key"),
    ({"endpoint": "no-port"}, "not host:port"),
    ({"endpoint": "h:70000"}, "not host:port"),
    ({"networks": ["10.88.0.0/33"]}, "network"),
    ({"networks": []}, "no network"),
])
def test_a_bad_member_config_input_is_refused_naming_it(change, words):
    args = {"private_key": b"\x01" * 32, "address": "10.250.0.7",
            "gateway_public_key": wg_key(b"\x02" * 32), "endpoint": "gw:51820",
            "networks": ["10.88.0.0/24"], **change}
    with pytest.raises(WireGuardError, match=words):
        member_config(**args)


@given(st.text(max_size=200))
def test_parsing_any_text_either_reads_sections_or_says_which_line(text):
    try:
        sections = parse_config(text)
    except WireGuardError as exc:
        assert "line" in str(exc)
    else:
        assert all(isinstance(name, str) for name, _ in sections)
