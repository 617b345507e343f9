"""deploy/README.md's hosts in network namespaces, on one switch (a bridge)::

    control 10.78.0.1   dht, app-node, wrk-ork, proxy-inference, wrk-monitor, ui, entry
    relay   10.78.0.2   the blind relay
    gpu     10.78.0.3   the worker (local backend: its agents run beside it);
                        its firewall drops every inbound connection (seeds/relay.txt)
    desk    10.78.0.4   a user's workstation: it may reach the control host's 5173
                        and the relay box's 49737, nothing else (an egress firewall)
    agents  10.78.0.5   the job VMs' network (the worker's local.agent_netns): like a
                        blocked cluster network, it reaches the relay box's 49737 and
                        nothing else, and nothing reaches it

Named ``cac-<pid>-<n>-<host>`` like tests/netns/topology.py's (its cleanup removes
a crashed run's); :meth:`DeployLab.close` kills what runs inside and deletes them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from .topology import NS_PREFIX, _counter, _ip, _kill_and_delete, _run, cleanup_stale

__all__ = ["ADDRESSES", "DeployLab"]

ADDRESSES = {"control": "10.78.0.1", "relay": "10.78.0.2", "gpu": "10.78.0.3",
             "desk": "10.78.0.4", "agents": "10.78.0.5"}

#: The GPU host: nothing comes in but replies to what it sent.
INBOUND_DROPPED = (
    "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT ACCEPT [0:0]\n"
    "-A INPUT -i lo -j ACCEPT\n"
    "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n"
    "COMMIT\n")

#: The workstation: out only to the entry point and the relay box.
DESK_EGRESS = (
    "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT DROP [0:0]\n"
    "-A OUTPUT -o lo -j ACCEPT\n"
    "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n"
    f"-A OUTPUT -p tcp -d {ADDRESSES['control']} --dport 5173 -j ACCEPT\n"
    f"-A OUTPUT -p tcp -d {ADDRESSES['relay']} --dport 49737 -j ACCEPT\n"
    '-A OUTPUT -m comment --comment "desk-blocked" -j DROP\n'
    "COMMIT\n")


#: The agents' network: out only to the relay box, in only replies.
AGENTS_ONLY_RELAY = (
    "*filter\n:INPUT DROP [0:0]\n:FORWARD DROP [0:0]\n:OUTPUT DROP [0:0]\n"
    "-A INPUT -i lo -j ACCEPT\n-A OUTPUT -o lo -j ACCEPT\n"
    "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n"
    "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n"
    f"-A OUTPUT -p tcp -d {ADDRESSES['relay']} --dport 49737 -j ACCEPT\n"
    '-A OUTPUT -m comment --comment "agents-blocked" -j DROP\n'
    "COMMIT\n")


class DeployLab:
    def __init__(self, prefix: str) -> None:
        self.namespaces = {host: f"{prefix}-{host}" for host in ADDRESSES}
        self.switch = f"{prefix}-sw"
        self._procs: list[subprocess.Popen[Any]] = []

    @classmethod
    def create(cls) -> DeployLab:
        cleanup_stale()
        lab = cls(f"{NS_PREFIX}{os.getpid()}-{next(_counter)}")
        try:
            lab._build()
        except BaseException:
            lab.close()
            raise
        return lab

    def __enter__(self) -> DeployLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        ip = _ip()
        names = [self.switch, *self.namespaces.values()]
        _run([ip, "-batch", "-"], stdin="".join(f"netns add {n}\n" for n in names))
        switch = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        for host, ns in self.namespaces.items():
            switch += [f"link add {host} type veth peer name eth0 netns {ns}",
                       f"link set {host} master br0 up"]
        _run([ip, "-n", self.switch, "-batch", "-"], stdin="\n".join(switch) + "\n")
        for host, ns in self.namespaces.items():
            _run([ip, "-n", ns, "-batch", "-"], stdin=(
                f"link set lo up\naddr add {ADDRESSES[host]}/24 dev eth0\nlink set eth0 up\n"))
        self.run_in("gpu", ["iptables-restore"], stdin=INBOUND_DROPPED)
        self.run_in("desk", ["iptables-restore"], stdin=DESK_EGRESS)
        self.run_in("agents", ["iptables-restore"], stdin=AGENTS_ONLY_RELAY)

    def run_in(self, host: str, argv: list[str], **options: Any) -> str:
        return _run([_ip(), "netns", "exec", self.namespaces[host], *argv], **options)

    def popen(self, host: str, argv: list[str], **options: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen([_ip(), "netns", "exec", self.namespaces[host], *argv],
                                **options)
        self._procs.append(proc)
        return proc

    def python(self, host: str, *args: Any, **options: Any) -> subprocess.Popen[Any]:
        """The venv's Python started inside ``host`` (what tests/netns/capture.py needs)."""
        return self.popen(host, [sys.executable, *map(str, args)], **options)

    def run(self, host: str, argv: list[str], **options: Any
            ) -> subprocess.CompletedProcess[Any]:
        return subprocess.run([_ip(), "netns", "exec", self.namespaces[host], *argv],
                              check=False, **options)

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        _kill_and_delete([self.switch, *self.namespaces.values()])
