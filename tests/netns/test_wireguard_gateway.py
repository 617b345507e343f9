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

wireguard-go and ``wg`` meet at /var/run/wireguard/<interface>.sock, a folder every
namespace shares with the host and with a second copy of this suite running beside it
(whose cleanup, or a wireguard-go exiting, may remove it as ours starts: "Failed to
listen on uapi socket"). So each host's WireGuard commands run with a /run of their
own (:func:`tests.netns.topology.with_own_run`), one folder per host in the test's
tmp_path, and the interface names need not be unique: each host has its own links
and its own sockets.
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
from tests.netns.topology import (
    AGENT,
    RELAY,
    RELAY_ADDR,
    WORKER,
    Topology,
    which,
    with_own_run,
)

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SUBNET = "10.250.0.0/24"
ISOLATED = "10.88.0.0/24"
GATEWAY_ISOLATED, VM_ADDR = "10.88.0.1", "10.88.0.2"
PORT = 51820
ECHO_PORT = 7000
#: The gateway's tunnel, the member's, and the veth pair from the gateway to the VM.
GATEWAY_IF, MEMBER_IF, GATEWAY_LINK, VM_LINK = "wg0", "wg0", "iso0", "iso0"
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


def _own_run(tmp_path: Path, host: str, argv: list[str]) -> list[str]:
    """``argv`` with ``host``'s own /run, where its wireguard-go and ``wg`` meet."""
    return with_own_run(tmp_path / f"run-{host}", argv)


def _wg(topology: Topology, tmp_path: Path, host: str, *args: str) -> str:
    """``wg`` in ``host`` (with its own /run); its output."""
    return _ok(topology, host, *_own_run(tmp_path, host, ["wg", *args]))


def _interface(topology: Topology, host: str, name: str, config: str, tmp_path: Path,
               address: str) -> None:
    """A userspace WireGuard interface ``name`` in ``host`` with ``config`` and ``address``."""
    log = tmp_path / f"wireguard-go-{host}.err"
    with log.open("wb") as stderr:
        wireguard_go = topology.popen(
            host, _own_run(tmp_path, host, ["wireguard-go", "-f", name]),
            stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 10
    while topology.run(host, _own_run(tmp_path, host, ["wg", "show", name])).returncode != 0:
        assert wireguard_go.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"wireguard-go did not make {name}"
        time.sleep(0.05)
    # Its socket is in the host's own folder, not in the /var/run/wireguard of this machine.
    assert (tmp_path / f"run-{host}" / "wireguard" / f"{name}.sock").is_socket()
    path = tmp_path / f"{name}.conf"
    path.write_text(config)
    path.chmod(0o600)
    _wg(topology, tmp_path, host, "setconf", name, str(path))
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
    _ok(topology, WORKER, "ip", "link", "set", "eth0", "down")
    _ok(topology, RELAY, "ip", "link", "add", GATEWAY_LINK, "type", "veth", "peer", "name", VM_LINK,
        "netns", topology.ns(WORKER))
    _ok(topology, RELAY, "ip", "link", "set", GATEWAY_LINK, "up")  # its address: the script's
    _ok(topology, WORKER, "ip", "addr", "add", f"{VM_ADDR}/24", "dev", VM_LINK)
    _ok(topology, WORKER, "ip", "link", "set", VM_LINK, "up")
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
    started = topology.popen(RELAY, _own_run(tmp_path, RELAY, gateway_script(
        GATEWAY_IF, str(conf), f"{gateway_address(SUBNET)}/24",
        also=[(GATEWAY_LINK, f"{GATEWAY_ISOLATED}/24")])),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert started.stdout.readline().strip() == f"wireguard gateway {GATEWAY_IF} up", \
        started.stderr.read() if started.poll() is not None else "no line"

    # The member's workstation, with the config their CLI writes.
    config = member_config(member.x25519_private, addresses[member.public_key],
                           wg_public_key_of(gateway.public_key), f"{RELAY_ADDR}:{PORT}",
                           [ISOLATED])
    setconf, taken = without_addresses(config)
    name = MEMBER_IF
    _interface(topology, AGENT, name, setconf, tmp_path, taken["Address"])
    _ok(topology, AGENT, "ip", "route", "add", ISOLATED, "dev", name)
    # wg derives the same public key from the private one as the gateway did from
    # the CLI key: the handshake below depends on it.
    shown = _wg(topology, tmp_path, AGENT, "show", name, "public-key").strip()
    assert shown == wg_public_key_of(member.public_key)
    assert _echo(topology, "hello", 20) == "echo:hello"
    handshakes = _wg(topology, tmp_path, RELAY, "show", GATEWAY_IF, "latest-handshakes")
    assert any(line.split()[0] == wg_public_key_of(member.public_key) and line.split()[1] != "0"
               for line in handshakes.splitlines())

    # A stranger (not among the gateway's peers) with the same gateway details: no way in.
    stranger_config, _ = without_addresses(member_config(
        stranger.x25519_private, addresses[member.public_key],
        wg_public_key_of(gateway.public_key), f"{RELAY_ADDR}:{PORT}", [ISOLATED]))
    path = tmp_path / "stranger.conf"
    path.write_text(stranger_config)
    _wg(topology, tmp_path, AGENT, "setconf", name, str(path))
    assert _echo(topology, "again", 3).startswith("error:")
    assert wg_key(stranger.x25519_public) not in _wg(topology, tmp_path, RELAY, "show", GATEWAY_IF)

    # The team changes (the stranger joins at that address): the gateway reads its file
    # again by itself, as a pod's Secret volume changes under it.
    joined = [GatewayPeer(wg_public_key_of(stranger.public_key), addresses[member.public_key])]
    conf.write_text(gateway_config(gateway.x25519_private, PORT, joined))
    assert started.stdout.readline().strip() == f"wireguard gateway {GATEWAY_IF}: peers reloaded"
    assert _echo(topology, "joined", 20) == "echo:joined"

    echo.kill()
    echo.wait(timeout=10)
