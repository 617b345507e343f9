"""The NAT lab (tests/netns/nat_lab.py): `cosmicac dht nat` tells, from where three DHT
nodes on the "internet" saw it, a host with no NAT (open), one behind MASQUERADE
(consistent: one public address and port for every node) and one behind MASQUERADE
--random-fully (random: a port per node)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.netns.nat_lab import BOOTSTRAP, NatLab, RunningLab
from tests.netns.test_relay_scenario import COSMICAC

pytestmark = [pytest.mark.netns, pytest.mark.slow]


@pytest.fixture
def lab(nat_lab: RunningLab) -> NatLab:
    return nat_lab.lab


@pytest.mark.parametrize(("host", "expected", "public"), [
    ("open", "open", "100.64.0.2"),
    ("a", "consistent", "198.51.100.1"),
    ("b", "random", "192.0.2.1"),
    ("c", "consistent", "198.18.0.1"),
    ("d", "random", "198.19.0.1"),
])
def test_dht_nat_tells_each_kind_of_nat_apart(lab: NatLab, host, expected, public):
    result = lab.run(host, [COSMICAC, "dht", "nat", "--bootstrap", BOOTSTRAP, "--json"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["nat"] == expected, found
    assert found["nodes"] >= 3  # the three DHT nodes, and the relay's once it joined
    assert {seen.rsplit(":", 1)[0] for seen in found["seen"]} == {public}
    assert len(found["seen"]) == (found["nodes"] if expected == "random" else 1)
