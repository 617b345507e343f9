"""WireGuard for a job's isolated network: keys, tunnel addresses and config files.

The overlay tier's gateway (seeds/architecture.txt) lets the members of a
job's team reach the job's isolated network through one WireGuard peer, the
gateway, and nothing else. The gateway's config is rendered by the worker
(``wg setconf`` format: keys, port, peers); each member's config is written by
their own ``cosmicac jobs wireguard JOB`` (``wg-quick`` format, with the
tunnel address and the routes).

Keys. A member's WireGuard key is the X25519 key of their CLI identity: the
birational map of the Ed25519 key the platform already knows (the team's shell
keys), as the swarm's Noise handshake derives its static keys
(:func:`p2p.keys.public_key_to_x25519`). No key is exchanged or stored for
WireGuard: the worker derives each member's public key, the CLI its own
private one, and a member removed from the team drops out of the gateway's
peers with the team's next shell-key set.

Addresses. Each member gets a stable /32 in the job's tunnel subnet: a slot
chosen by a hash of their key, the next free one on a collision, the keys
taken in the order of their hashes. A new member whose slot is free moves no
one; a collision (rare: a /24 has 253 slots) may move the members probed past
it, whose configs then need writing again.

Pure: nothing here does I/O.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from p2p.keys import public_key_to_x25519

__all__ = [
    "DEFAULT_PORT",
    "GatewayPeer",
    "WireGuardError",
    "assign_addresses",
    "gateway_address",
    "gateway_config",
    "gateway_script",
    "member_config",
    "parse_config",
    "wg_key",
    "wg_public_key_of",
    "without_addresses",
]

#: WireGuard's customary port.
DEFAULT_PORT = 51820
#: Keep-alive from a member behind NAT: its mapping stays open while idle.
_KEEPALIVE_S = 25
_KEY_TEXT = re.compile(r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$")


class WireGuardError(ValueError):
    """A key, subnet or config that cannot be used, with what is wrong."""


def wg_key(raw: bytes) -> str:
    """A 32-byte X25519 key as WireGuard writes it (base64)."""
    if len(raw) != 32:
        raise WireGuardError(f"a WireGuard key is 32 bytes, not {len(raw)}")
    return base64.b64encode(raw).decode("ascii")


def wg_public_key_of(cli_key: bytes) -> str:
    """The WireGuard public key of the member whose CLI (Ed25519) key is ``cli_key``."""
    return wg_key(public_key_to_x25519(cli_key))


def _subnet(text: str) -> ipaddress.IPv4Network:
    try:
        subnet = ipaddress.IPv4Network(text)
    except ValueError as exc:
        raise WireGuardError(f"tunnel subnet {text!r}: {exc}") from None
    if subnet.prefixlen > 28:
        raise WireGuardError(f"tunnel subnet {text} is too small (at most /28)")
    return subnet


def gateway_address(subnet: str) -> ipaddress.IPv4Address:
    """The gateway's own tunnel address: the subnet's first host."""
    return _subnet(subnet).network_address + 1


def assign_addresses(subnet: str, cli_keys: Iterable[bytes]
                     ) -> dict[bytes, ipaddress.IPv4Address]:
    """A stable tunnel address per member (see the module doc).

    Raises:
        WireGuardError: a bad subnet, or more members than it has addresses.
    """
    network = _subnet(subnet)
    slots = network.num_addresses - 3  # network, gateway, broadcast
    keys = sorted(set(cli_keys), key=lambda key: (_slot_hash(key), key))
    if len(keys) > slots:
        raise WireGuardError(f"tunnel subnet {subnet} has {slots} member addresses, "
                             f"{len(keys)} members")
    taken: set[int] = set()
    addresses = {}
    for key in keys:
        slot = _slot_hash(key) % slots
        while slot in taken:
            slot = (slot + 1) % slots
        taken.add(slot)
        addresses[key] = network.network_address + 2 + slot
    return addresses


def _slot_hash(key: bytes) -> int:
    digest = hashlib.blake2b(key, digest_size=8, person=b"cac-wg-slot").digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True)
class GatewayPeer:
    """One member as the gateway knows it: their key and tunnel address."""

    public_key: str
    address: ipaddress.IPv4Address


def gateway_config(private_key: bytes, port: int, peers: Sequence[GatewayPeer]) -> str:
    """The gateway interface's ``wg setconf`` file: its key and port, and each
    member allowed in from their own tunnel address only."""
    if not 0 < port < 65536:
        raise WireGuardError(f"port {port} is not a UDP port")
    lines = ["[Interface]", f"PrivateKey = {wg_key(private_key)}", f"ListenPort = {port}"]
    for peer in sorted(peers, key=lambda p: int(p.address)):
        _check_key(peer.public_key)
        lines += ["", "[Peer]", f"PublicKey = {peer.public_key}",
                  f"AllowedIPs = {peer.address}/32"]
    return "\n".join(lines) + "\n"


#: The gateway's start, as a shell script: $1 interface, $2 its ``wg setconf``
#: file, $3 its tunnel address/prefix, then pairs of (interface, address/prefix)
#: the gateway also takes (its address on the isolated network). The kernel's
#: WireGuard when it has one, else the userspace implementation (wireguard-go);
#: forwarding on, so members reach the isolated network behind it; the file
#: read again when it changes (a Secret's volume follows the team's keys); in
#: the foreground (a pod's command, a test's process) until stopped.
_GATEWAY_SCRIPT = """set -eu
daemon=
stop() {
    if [ -n "$daemon" ]; then kill "$daemon"; wait "$daemon"; else ip link del "$1"; fi
    exit 0
}
trap stop TERM INT
if ! ip link add "$1" type wireguard 2>/dev/null; then
    wireguard-go -f "$1" & daemon=$!
    for _ in $(seq 200); do wg show "$1" >/dev/null 2>&1 && break; sleep 0.05; done
fi
wg setconf "$1" "$2"
ip address add "$3" dev "$1"
ip link set "$1" up
interface=$1 config=$2
shift 3
while [ $# -ge 2 ]; do ip address replace "$2" dev "$1"; shift 2; done
sysctl -q -w net.ipv4.ip_forward=1
echo "wireguard gateway $interface up"
loaded=$(cksum < "$config")
while :; do
    sleep 5 & wait $!
    if [ -n "$daemon" ] && ! kill -0 "$daemon" 2>/dev/null; then exit 1; fi
    if [ -z "$daemon" ] && ! ip link show "$interface" >/dev/null 2>&1; then exit 1; fi
    now=$(cksum < "$config") || continue
    if [ "$now" != "$loaded" ] && wg syncconf "$interface" "$config"; then
        loaded=$now
        echo "wireguard gateway $interface: peers reloaded"
    fi
done
"""


def gateway_script(interface: str, config_path: str, address: str,
                   also: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The gateway's command line (``sh -c``): make ``interface``, load
    ``config_path``, give it ``address`` (with its prefix), give each ``also``
    interface its address, forward, and reload the file when it changes.
    Everything variable is an argument, never spliced into the script."""
    for name in (interface, *(name for name, _ in also)):
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,15}", name):
            raise WireGuardError(f"{name!r} is not an interface name (at most 15 characters)")
    for value in (address, *(value for _, value in also)):
        try:
            ipaddress.IPv4Interface(value)
        except ValueError as exc:
            raise WireGuardError(f"{value!r} is not an address with its prefix: {exc}") from None
    return ["sh", "-c", _GATEWAY_SCRIPT, "cosmicac-wireguard", interface, config_path, address,
            *(part for pair in also for part in pair)]


def member_config(private_key: bytes, address: ipaddress.IPv4Address | str,
                  gateway_public_key: str, endpoint: str,
                  networks: Sequence[str]) -> str:
    """A member's ``wg-quick`` file: their tunnel address, the gateway as the one
    peer, and the job's networks routed to it.

    Raises:
        WireGuardError: a bad key, endpoint or network.
    """
    _check_key(gateway_public_key)
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise WireGuardError(f"endpoint {endpoint!r} is not host:port")
    routes = []
    for network in networks:
        try:
            routes.append(str(ipaddress.ip_network(network)))
        except ValueError as exc:
            raise WireGuardError(f"network {network!r}: {exc}") from None
    if not routes:
        raise WireGuardError("no network to route through the gateway")
    return "\n".join([
        "[Interface]",
        f"PrivateKey = {wg_key(private_key)}",
        f"Address = {ipaddress.IPv4Address(address)}/32",
        "",
        "[Peer]",
        f"PublicKey = {gateway_public_key}",
        f"Endpoint = {endpoint}",
        f"AllowedIPs = {', '.join(routes)}",
        f"PersistentKeepalive = {_KEEPALIVE_S}",
    ]) + "\n"


def parse_config(text: str) -> list[tuple[str, dict[str, str]]]:
    """The sections of a WireGuard config, in order: ``[(name, {key: value})]``.

    Raises:
        WireGuardError: a line that is neither a section, a ``Key = value`` nor blank.
    """
    sections: list[tuple[str, dict[str, str]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append((line[1:-1], {}))
            continue
        key, equals, value = line.partition("=")
        if not equals or not sections:
            raise WireGuardError(f"line {number}: {line!r} is not 'Key = value' in a section")
        sections[-1][1][key.strip()] = value.strip()
    return sections


def without_addresses(text: str) -> tuple[str, Mapping[str, str]]:
    """A ``wg-quick`` file as ``wg setconf`` takes it (no ``Address``), and what was
    taken out (``Address``), for a caller that sets the address itself."""
    kept, taken = [], {}
    for line in text.splitlines():
        key = line.partition("=")[0].strip()
        if key in ("Address", "DNS", "MTU"):
            taken[key] = line.partition("=")[2].strip()
        else:
            kept.append(line)
    return "\n".join(kept) + "\n", taken


def _check_key(text: str) -> None:
    if not _KEY_TEXT.match(text):
        raise WireGuardError(f"{text!r} is not a WireGuard public key (base64 of 32 bytes)")
