"""The overlay tier's WireGuard gateway on namespaces, with the configs we render.

Hosts (tests/netns/README.md), rewired for the gateway:

- ``relay`` (10.77.0.1) is the gateway: the gateway pod's own command
  (:func:`runtime.wireguard.gateway_script`) with
  :func:`runtime.wireguard.gateway_config`, forwarding between its tunnel and
  the job's isolated network;
- ``worker`` is the job's VM: its bridge link is taken down and a veth to the
  gateway (10.88.0.0/24) is all it has; a TCP echo server listens there;
- ``agent`` (10.77.0.3, firewalled: nothing new comes in) is a member's
  workstation: ``wireguard-go`` with :func:`runtime.wireguard.member_config`.

The member's WireGuard key is the X25519 key of their CLI identity, derived on
each side: the gateway from the public key, ``wg`` from the private one.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from p2p.keys import KeyPair
from runtime.wireguard import (
    GatewayPeer,
    assign_addresses,
    gateway_address,
    gateway_config,
    gateway_script,
    member_config,
    wg_key,
    wg_public_key_of,
    without_addresses,
)
from tests.netns.topology import AGENT, RELAY, RELAY_ADDR, WORKER, Topology, which

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SUBNET = "10.250.0.0/24"
ISOLATED = "10.88.0.0/24"
GATEWAY_ISOLATED, VM_ADDR = "10.88.0.1", "10.88.0.2"
PORT = 51820
ECHO_PORT = 7000
#: An echo server: one line back per connection, until killed.
ECHO = ("import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('{VM_ADDR}', {ECHO_PORT})); s.listen(8); print('ready', flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept(); c.sendall(b'echo:' + c.recv(100)); c.close()\n")


@pytest.fixture
def wireguard_tools() -> None:
    missing = [tool for tool in ("wireguard-go", "wg") if which(tool) is None]
    if missing:
        if os.environ.get("CAC_NETNS_REQUIRED") or os.environ.get("CI"):
            pytest.fail(f"{', '.join(missing)} missing (bash .ci/run deps installs them)")
        pytest.skip(f"{', '.join(missing)} missing (bash .ci/run deps installs them)")


def _ok(topology: Topology, host: str, *argv: str, **kwargs) -> str:
    result = topology.run(host, list(argv), **kwargs)
    assert result.returncode == 0, (argv, result.stderr)
    return result.stdout


def _interface(topology: Topology, host: str, name: str, config: str, tmp_path: Path,
               address: str) -> None:
    """A userspace WireGuard interface ``name`` in ``host`` with ``config`` and ``address``.

    The UAPI socket of wireguard-go is a file in /var/run/wireguard shared by every
    namespace: names are unique per test (``name`` carries the topology's prefix)."""
    topology.popen(host, ["wireguard-go", "-f", name], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while topology.run(host, ["wg", "show", name]).returncode != 0:
        assert time.monotonic() < deadline, f"wireguard-go did not make {name}"
        time.sleep(0.05)
    path = tmp_path / f"{name}.conf"
    path.write_text(config)
    path.chmod(0o600)
    _ok(topology, host, "wg", "setconf", name, str(path))
    _ok(topology, host, "ip", "addr", "add", address, "dev", name)
    _ok(topology, host, "ip", "link", "set", name, "up")


def _echo(topology: Topology, message: str, timeout: float) -> str:
    """What the VM's echo server answers the workstation, or the error."""
    script = ("import socket, sys\n"
              "try:\n"
              f"    c = socket.create_connection(('{VM_ADDR}', {ECHO_PORT}), timeout={timeout})\n"
              f"    c.sendall(b'{message}'); print(c.recv(100).decode())\n"
              "except OSError as exc:\n"
              "    print('error:', exc)\n")
    return topology.run_python(AGENT, "-c", script, timeout=timeout + 20).stdout.strip()


def test_a_member_reaches_the_isolated_network_through_the_gateway_and_a_stranger_does_not(
        topology: Topology, tmp_path, wireguard_tools):
    # The job's VM: only the isolated link to the gateway.
    # Interface names: at most 15 characters, unique per topology (pid and counter).
    suffix = "".join(ch for ch in topology.prefix if ch.isdigit())[-10:]
    gw_link, vm_link = f"gi{suffix}", f"vi{suffix}"
    _ok(topology, WORKER, "ip", "link", "set", "eth0", "down")
    _ok(topology, RELAY, "ip", "link", "add", gw_link, "type", "veth", "peer", "name", vm_link,
        "netns", topology.ns(WORKER))
    _ok(topology, RELAY, "ip", "link", "set", gw_link, "up")  # its address: the script's
    _ok(topology, WORKER, "ip", "addr", "add", f"{VM_ADDR}/24", "dev", vm_link)
    _ok(topology, WORKER, "ip", "link", "set", vm_link, "up")
    _ok(topology, WORKER, "ip", "route", "add", SUBNET, "via", GATEWAY_ISOLATED)
    echo = topology.python(WORKER, "-c", ECHO, stdout=subprocess.PIPE, text=True)
    assert echo.stdout.readline().strip() == "ready"
    assert _echo(topology, "before", 2).startswith("error:")  # no way in yet

    # The gateway: the team's members as peers, each at its assigned address.
    member, stranger, other = KeyPair.generate(), KeyPair.generate(), KeyPair.generate()
    addresses = assign_addresses(SUBNET, [member.public_key, other.public_key])
    gateway = KeyPair.generate()
    peers = [GatewayPeer(wg_public_key_of(key), address) for key, address in addresses.items()]
    conf = tmp_path / "gateway.conf"
    conf.write_text(gateway_config(gateway.x25519_private, PORT, peers))
    # The very command the gateway pod runs (runtime.wireguard.gateway_script).
    started = topology.popen(RELAY, gateway_script(f"wg{suffix}", str(conf),
                                                   f"{gateway_address(SUBNET)}/24",
                                                   also=[(gw_link, f"{GATEWAY_ISOLATED}/24")]),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert started.stdout.readline().strip() == f"wireguard gateway wg{suffix} up", \
        started.stderr.read() if started.poll() is not None else "no line"

    # The member's workstation, with the config their CLI writes.
    config = member_config(member.x25519_private, addresses[member.public_key],
                           wg_public_key_of(gateway.public_key), f"{RELAY_ADDR}:{PORT}",
                           [ISOLATED])
    setconf, taken = without_addresses(config)
    name = f"wm{suffix}"
    _interface(topology, AGENT, name, setconf, tmp_path, taken["Address"])
    _ok(topology, AGENT, "ip", "route", "add", ISOLATED, "dev", name)
    # wg derives the same public key from the private one as the gateway did from
    # the CLI key: the handshake below depends on it.
    shown = _ok(topology, AGENT, "wg", "show", name, "public-key").strip()
    assert shown == wg_public_key_of(member.public_key)
    assert _echo(topology, "hello", 20) == "echo:hello"
    handshakes = _ok(topology, RELAY, "wg", "show", f"wg{suffix}", "latest-handshakes")
    assert any(line.split()[0] == wg_public_key_of(member.public_key) and line.split()[1] != "0"
               for line in handshakes.splitlines())

    # A stranger (not among the gateway's peers) with the same gateway details: no way in.
    stranger_config, _ = without_addresses(member_config(
        stranger.x25519_private, addresses[member.public_key],
        wg_public_key_of(gateway.public_key), f"{RELAY_ADDR}:{PORT}", [ISOLATED]))
    path = tmp_path / "stranger.conf"
    path.write_text(stranger_config)
    _ok(topology, AGENT, "wg", "setconf", name, str(path))
    assert _echo(topology, "again", 3).startswith("error:")
    assert wg_key(stranger.x25519_public) not in _ok(topology, RELAY, "wg", "show", f"wg{suffix}")

    # The team changes (the stranger joins at that address): the gateway reads its file
    # again by itself, as a pod's Secret volume changes under it.
    joined = [GatewayPeer(wg_public_key_of(stranger.public_key), addresses[member.public_key])]
    conf.write_text(gateway_config(gateway.x25519_private, PORT, joined))
    assert started.stdout.readline().strip() == f"wireguard gateway wg{suffix}: peers reloaded"
    assert _echo(topology, "joined", 20) == "echo:joined"

    echo.kill()
    echo.wait(timeout=10)
