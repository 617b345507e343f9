"""A NAT lab in network namespaces: an "internet" router with DHT nodes, and hosts behind
each kind of Linux NAT (shared/reference/nat-traversal.md §4.3)::

        open 100.64.0.2 ──┐
                          │            inet (forwarding; DHT nodes on lo:
     a 10.1.0.2 ── nat1 ──┼── 198.51.100.0/24   203.0.113.10, .11, .12)
       (MASQUERADE: endpoint-independent, port-preserving)
     b 10.2.0.2 ── nat2 ──┴── 192.0.2.0/24
       (MASQUERADE --random-fully: endpoint-dependent)

Both NAT routers drop unsolicited packets on their WAN (a home router's
firewall: ``-m conntrack --ctstate NEW,INVALID -j DROP``). Namespaces are named
``cac-<pid>-<n>-<host>`` like tests/netns/topology.py's, so its stale-namespace
cleanup removes a crashed run's; :meth:`NatLab.close` kills what runs in them and
deletes them.
"""

from __future__ import annotations

import os
import subprocess
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

__all__ = ["DHT_NODES", "NatLab"]

#: The DHT nodes' addresses on the "internet" (bound on its loopback).
DHT_NODES = ("203.0.113.10", "203.0.113.11", "203.0.113.12")
HOSTS = ("inet", "nat1", "nat2", "a", "b", "open")
ADDRESSES = {"a": "10.1.0.2", "b": "10.2.0.2", "open": "100.64.0.2"}


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
        for left, lif, right, rif in (("inet", "x1", "nat1", "wan"), ("inet", "x2", "nat2", "wan"),
                                      ("inet", "x3", "open", "eth0"), ("nat1", "lan", "a", "eth0"),
                                      ("nat2", "lan", "b", "eth0")):
            root.append(f"link add {lif} netns {ns[left]} type veth peer name {rif} "
                        f"netns {ns[right]}")
            inside[left].append(f"link set {lif} up")
            inside[right].append(f"link set {rif} up")
        inside["inet"] += [f"addr add {host}/32 dev lo" for host in DHT_NODES]
        inside["inet"] += ["addr add 198.51.100.254/24 dev x1", "addr add 192.0.2.254/24 dev x2",
                           "addr add 100.64.0.254/24 dev x3"]
        inside["nat1"] += ["addr add 198.51.100.1/24 dev wan", "addr add 10.1.0.1/24 dev lan",
                           "route add default via 198.51.100.254"]
        inside["nat2"] += ["addr add 192.0.2.1/24 dev wan", "addr add 10.2.0.1/24 dev lan",
                           "route add default via 192.0.2.254"]
        inside["a"] += ["addr add 10.1.0.2/24 dev eth0", "route add default via 10.1.0.1"]
        inside["b"] += ["addr add 10.2.0.2/24 dev eth0", "route add default via 10.2.0.1"]
        inside["open"] += ["addr add 100.64.0.2/24 dev eth0",
                           "route add default via 100.64.0.254"]
        _run([ip, "-batch", "-"], stdin="\n".join(root) + "\n")
        for host, lines in inside.items():
            _run([ip, "-n", ns[host], "-batch", "-"], stdin="\n".join(lines) + "\n")
        for router in ("inet", "nat1", "nat2"):
            self.run_in(router, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        iptables = which("iptables") or "iptables"
        for router, extra in (("nat1", []), ("nat2", ["--random-fully"])):
            self.run_in(router, [iptables, "-t", "nat", "-A", "POSTROUTING", "-o", "wan",
                                 "-j", "MASQUERADE", *extra])
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
