"""A NAT lab in network namespaces: an "internet" router with DHT nodes and a relay
address, and hosts behind each kind of Linux NAT (shared/reference/nat-traversal.md
§4.3)::

        open 100.64.0.2 ──┐
                          │            inet (forwarding; on lo: DHT nodes
     a 10.1.0.2 ── nat1 ──┤            203.0.113.10, .11, .12, the relay's .20)
       (MASQUERADE: endpoint-independent, port-preserving; drops unsolicited)
     b 10.2.0.2 ── nat2 ──┤
       (MASQUERADE --random-fully: endpoint-dependent; drops unsolicited)
     c 10.3.0.2 ── nat3 ──┤
       (MASQUERADE, and the router's own stack answers unsolicited packets:
        a RST for a SYN, ICMP port unreachable for a datagram)
     d 10.4.0.2 ── nat4 ──┘
       (MASQUERADE --random-fully; drops unsolicited)

The routers that drop do it as a home router's firewall does
(``-m conntrack --ctstate NEW,INVALID -j DROP`` on the WAN). Namespaces are named
``cac-<pid>-<n>-<host>`` like tests/netns/topology.py's, so its stale-namespace
cleanup removes a crashed run's; :meth:`NatLab.close` kills what runs in them and
deletes them.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .topology import (
    NS_PREFIX,
    _counter,
    _ip,
    _kill_and_delete,
    _run,
    cleanup_stale,
    which,
)

__all__ = ["ADDRESSES", "DHT_NODES", "KIND", "RELAY", "NatLab", "RunningLab", "start_services"]

#: The DHT nodes' addresses on the "internet" (bound on its loopback).
DHT_NODES = ("203.0.113.10", "203.0.113.11", "203.0.113.12")
#: The relay's address on the "internet".
RELAY = "203.0.113.20"
HOSTS = ("inet", "nat1", "nat2", "nat3", "nat4", "a", "b", "c", "d", "open")
ADDRESSES = {"a": "10.1.0.2", "b": "10.2.0.2", "c": "10.3.0.2", "d": "10.4.0.2",
             "open": "100.64.0.2"}
#: Each NAT router: its WAN subnet's first three octets, MASQUERADE's extra flags,
#: whether it drops unsolicited packets, and the host behind it.
ROUTERS = {
    "nat1": ("198.51.100", [], True, "a"),
    "nat2": ("192.0.2", ["--random-fully"], True, "b"),
    "nat3": ("198.18.0", [], False, "c"),
    "nat4": ("198.19.0", ["--random-fully"], True, "d"),
}
#: What each host's network is, as the tests and the benchmark name it.
KIND = {"open": "open", "a": "eim", "b": "edm", "c": "eim-answers", "d": "edm"}


class NatLab:
    """The built lab; ``with NatLab.create() as lab``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.namespaces = {host: f"{prefix}-{host}" for host in HOSTS}
        self._procs: list[subprocess.Popen[Any]] = []

    @classmethod
    def create(cls) -> NatLab:
        cleanup_stale()
        lab = cls(f"{NS_PREFIX}{os.getpid()}-{next(_counter)}")
        try:
            lab._build()
        except BaseException:
            lab.close()
            raise
        return lab

    def __enter__(self) -> NatLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        ns = self.namespaces
        ip = _ip()
        root = [f"netns add {name}" for name in ns.values()]
        inside: dict[str, list[str]] = {host: ["link set lo up"] for host in HOSTS}
        # veth pairs straight into their namespaces (names are per namespace).
        links = [("inet", "x0", "open", "eth0")]
        for n, (router, (_, _, _, host)) in enumerate(ROUTERS.items(), start=1):
            links += [("inet", f"x{n}", router, "wan"), (router, "lan", host, "eth0")]
        for left, lif, right, rif in links:
            root.append(f"link add {lif} netns {ns[left]} type veth peer name {rif} "
                        f"netns {ns[right]}")
            inside[left].append(f"link set {lif} up")
            inside[right].append(f"link set {rif} up")
        inside["inet"] += [f"addr add {host}/32 dev lo" for host in (*DHT_NODES, RELAY)]
        inside["inet"].append("addr add 100.64.0.254/24 dev x0")
        inside["open"] += ["addr add 100.64.0.2/24 dev eth0",
                           "route add default via 100.64.0.254"]
        for n, (router, (wan, _, _, host)) in enumerate(ROUTERS.items(), start=1):
            lan = ADDRESSES[host].rsplit(".", 1)[0]
            inside["inet"].append(f"addr add {wan}.254/24 dev x{n}")
            inside[router] += [f"addr add {wan}.1/24 dev wan", f"addr add {lan}.1/24 dev lan",
                               f"route add default via {wan}.254"]
            inside[host] += [f"addr add {lan}.2/24 dev eth0", f"route add default via {lan}.1"]
        _run([ip, "-batch", "-"], stdin="\n".join(root) + "\n")
        for host, lines in inside.items():
            _run([ip, "-n", ns[host], "-batch", "-"], stdin="\n".join(lines) + "\n")
        for router in ("inet", *ROUTERS):
            self.run_in(router, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        iptables = which("iptables") or "iptables"
        for router, (_, extra, drops, _) in ROUTERS.items():
            self.run_in(router, [iptables, "-t", "nat", "-A", "POSTROUTING", "-o", "wan",
                                 "-j", "MASQUERADE", *extra])
            if drops:
                self.run_in(router, [iptables, "-A", "INPUT", "-i", "wan", "-m", "conntrack",
                                     "--ctstate", "NEW,INVALID", "-j", "DROP"])

    def run_in(self, host: str, argv: list[str], **options: Any) -> str:
        """Run a setup command in ``host``'s namespace; its stdout."""
        return _run([_ip(), "netns", "exec", self.namespaces[host], *argv], **options)

    def popen(self, host: str, argv: list[str], **options: Any) -> subprocess.Popen[Any]:
        """A process in ``host``'s namespace, killed by :meth:`close`."""
        proc = subprocess.Popen([_ip(), "netns", "exec", self.namespaces[host], *argv],
                                **options)
        self._procs.append(proc)
        return proc

    def run(self, host: str, argv: list[str], **options: Any
            ) -> subprocess.CompletedProcess[Any]:
        return subprocess.run([_ip(), "netns", "exec", self.namespaces[host], *argv],
                              check=False, **options)

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        _kill_and_delete(list(self.namespaces.values()))


DHT_PORT = 49738
RELAY_PORT = 49737
BOOTSTRAP = ",".join(f"{host}:{DHT_PORT}" for host in DHT_NODES)
_RELAY_KEY = re.compile(r"Server listening on ([0-9a-f]{64})")


@dataclass
class RunningLab:
    """The lab with its DHT nodes and its relay running on the "internet"."""

    lab: NatLab
    relay_key: str
    folder: Path


def start_services(lab: NatLab, folder: Path, cosmicac: str, blind_relay: str,
                   wait_ready: Any) -> RunningLab:
    """Three DHT nodes and a blind relay on ``inet``; ``wait_ready(path, name)`` waits
    for a daemon's ready line."""
    # The DHT nodes know nothing of each other at start: they start together.
    outs = [folder / f"dht{n}.out" for n in range(len(DHT_NODES))]
    for n, (host, out) in enumerate(zip(DHT_NODES, outs, strict=True)):
        lab.popen("inet", [cosmicac, "dht", "bootstrap", "--host", host, "--port",
                           str(DHT_PORT)], stdout=out.open("wb"),
                  stderr=(folder / f"dht{n}.err").open("wb"))
    for out in outs:
        wait_ready(out, "dht-bootstrap")
    out = folder / "relay.out"
    lab.popen("inet", [blind_relay, "--storage", folder / "relay-storage", "--host", RELAY,
                       "--port", str(RELAY_PORT), "--bootstrap", BOOTSTRAP],
              stdout=out.open("wb"), stderr=(folder / "relay.err").open("wb"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = _RELAY_KEY.search(out.read_text(errors="replace")) if out.exists() else None
        if found:
            return RunningLab(lab, found[1], folder)
        time.sleep(0.05)
    raise TimeoutError(f"the relay printed no key in 30 s: {(folder / 'relay.err').read_text()}")
