"""The NAT lab (tests/netns/nat_lab.py): `cosmicac dht nat` tells, from where three DHT
nodes on the "internet" saw it, a host with no NAT (open), one behind MASQUERADE
(consistent: one public address and port for every node) and one behind MASQUERADE
--random-fully (random: a port per node)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.netns.nat_lab import DHT_NODES, NatLab
from tests.netns.test_relay_scenario import COSMICAC, wait_for_ready

pytestmark = [pytest.mark.netns, pytest.mark.slow]

DHT_PORT = 49738
BOOTSTRAP = ",".join(f"{host}:{DHT_PORT}" for host in DHT_NODES)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[NatLab]:
    folder = tmp_path_factory.mktemp("nat-lab")
    with NatLab.create() as built:
        for n, host in enumerate(DHT_NODES):
            out = folder / f"dht{n}.out"
            built.popen("inet", [COSMICAC, "dht", "bootstrap", "--host", host, "--port",
                                 str(DHT_PORT)], stdout=out.open("wb"),
                        stderr=(folder / f"dht{n}.err").open("wb"))
            wait_for_ready(out, "dht-bootstrap")
        yield built


@pytest.mark.parametrize(("host", "expected", "public"), [
    ("open", "open", "100.64.0.2"),
    ("a", "consistent", "198.51.100.1"),
    ("b", "random", "192.0.2.1"),
])
def test_dht_nat_tells_each_kind_of_nat_apart(lab: NatLab, host, expected, public):
    result = lab.run(host, [COSMICAC, "dht", "nat", "--bootstrap", BOOTSTRAP, "--json"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["nat"] == expected, found
    assert found["nodes"] == 3
    assert {seen.rsplit(":", 1)[0] for seen in found["seen"]} == {public}
    assert len(found["seen"]) == (3 if expected == "random" else 1)
