"""The ``topology`` fixture: a fresh worker/agent/relay topology for each test (and
``module_topology``, one for a whole module)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NoReturn

import pytest

from tests.netns.nat_lab import NatLab, RunningLab, start_services
from tests.netns.topology import (
    NetnsUnavailable,
    Topology,
    netns_required,
    unavailable_reason,
)


def _unavailable(reason: str) -> NoReturn:
    if netns_required():  # CI: a skip here would hide that these tests never ran
        pytest.fail(f"netns tests are required here (CI) but: {reason}", pytrace=False)
    pytest.skip(f"netns: {reason}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the topology is a ``netns`` test, marked or not."""
    for item in items:
        if {"topology", "netns_available"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.netns)


@pytest.fixture(scope="session")
def netns_available() -> None:
    """Skip (or, in CI, fail) unless this machine can build topologies."""
    if (reason := unavailable_reason()) is not None:
        _unavailable(reason)


@pytest.fixture
def topology(netns_available: None) -> Iterator[Topology]:
    """Namespaces relay 10.77.0.1, worker 10.77.0.2, agent 10.77.0.3 (firewalled).

    Built in ~0.1 s and removed after the test, failed or not, with every process that
    it started or that still runs inside. Skips where the machine cannot (not root, no
    iptables); fails instead where CAC_NETNS_REQUIRED=1 or CI=true.
    """
    yield from _topology()


@pytest.fixture(scope="module")
def module_topology(netns_available: None) -> Iterator[Topology]:
    """The same hosts, built once for a module whose tests each start processes of
    their own (new keys, their own ports) and change nothing else in it."""
    yield from _topology()


def _topology() -> Iterator[Topology]:
    try:
        topo = Topology.create()
    except NetnsUnavailable as exc:
        _unavailable(str(exc))
    try:
        yield topo
    finally:
        topo.close()


@pytest.fixture(scope="session")
def nat_lab(tmp_path_factory) -> Iterator[RunningLab]:
    """The NAT lab (nat_lab.py) with three DHT nodes and a blind relay on its
    "internet"; built once per run (a few seconds) and shared by its tests."""
    from tests.netns.test_relay_scenario import BLIND_RELAY, COSMICAC, wait_for_ready

    if (reason := unavailable_reason()) is not None:
        _unavailable(reason)
    folder = tmp_path_factory.mktemp("nat-lab")
    with NatLab.create() as built:
        yield start_services(built, folder, COSMICAC, BLIND_RELAY, wait_for_ready)
