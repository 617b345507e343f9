"""The topology does what tests of NAT-like paths rely on (and fails loudly if not).

Each probe runs as its own process inside a namespace (tests/netns/probe.py), bounded in
time and count; a blocked connect is given 1 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.netns import probe
from tests.netns.capture import Capture
from tests.netns.topology import (
    AGENT,
    AGENT_ADDR,
    HOSTS,
    NETNS_DIR,
    PYTHON,
    RELAY,
    RELAY_ADDR,
    SUBNET,
    WORKER,
    WORKER_ADDR,
    Topology,
    cleanup_lock,
    cleanup_stale,
    read_line,
    topology,
    with_own_run,
)

pytestmark = pytest.mark.netns

PROBE = str(probe.SCRIPT)
TCP_PORT = 7100
UDP_PORT = 7200
STRAY_PORT = 7201
BLOCKED_CONNECT_TIMEOUT = 1.0


def serve(topo: Topology, host: str, *args: str) -> subprocess.Popen[str]:
    """Start a probe server in ``host``; return once its socket is bound."""
    proc = topo.python(host, PROBE, *args, stdout=subprocess.PIPE, text=True)
    read_line(proc, timeout=10, startswith="READY")
    return proc


def finish(proc: subprocess.Popen[str], timeout: float = 10) -> list[dict[str, Any]]:
    """The JSON lines a probe server printed after READY (waits for it to exit)."""
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def client(topo: Topology, host: str, *args: str) -> dict[str, Any]:
    """Run a probe client in ``host``; its (last) JSON line."""
    done = topo.run_python(host, PROBE, *args, timeout=15)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def events(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("event") == kind]


def test_layout(topology: Topology) -> None:
    assert topology.build_seconds is not None
    for host in HOSTS:
        addrs = topology.run(host, ["ip", "-4", "-o", "addr", "show"], check=True).stdout
        assert f"inet {topology.addr(host)}/24" in addrs
        assert "127.0.0.1/8" in addrs
        # Only the subnet route: any other destination is unreachable (nothing is sent).
        routes = topology.run(host, ["ip", "route", "show"], check=True).stdout.strip()
        assert routes.splitlines() == [
            f"{SUBNET} dev eth0 proto kernel scope link src {topology.addr(host)}"
        ]
        outside = topology.run(host, ["ip", "route", "get", "192.0.2.1"])
        assert outside.returncode != 0 and "unreachable" in outside.stderr
        assert topology.run(host, ["ip", "-6", "addr", "show", "dev", "eth0"]).stdout == ""
    counters = topology.firewall_counters()
    assert counters == {"policy": 0, "drop-new-tcp": 0, "drop-udp": 0}
    assert topology.firewall_counters(ipv6=True).keys() == counters.keys()


def test_worker_connects_to_relay(topology: Topology) -> None:
    server = serve(topology, RELAY, "tcp-serve", "--host", RELAY_ADDR, "--port", str(TCP_PORT))
    reply = client(
        topology, WORKER,
        "tcp-connect", "--host", RELAY_ADDR, "--port", str(TCP_PORT), "--send", "hello-relay",
    )
    assert reply["result"] == "ok" and reply["reply"] == "echo:hello-relay"
    (accepted,) = events(finish(server), "accepted")
    assert accepted["peer"][0] == WORKER_ADDR and accepted["data"] == "hello-relay"


def test_worker_cannot_connect_to_agent(topology: Topology) -> None:
    # The agent listens on every address; only the firewall stands in the way.
    server = serve(
        topology, AGENT, "tcp-serve", "--host", "0.0.0.0", "--port", str(TCP_PORT),
        "--accept", "1",
    )
    blocked = client(
        topology, WORKER,
        "tcp-connect", "--host", AGENT_ADDR, "--port", str(TCP_PORT), "--send", "let-me-in",
        "--timeout", str(BLOCKED_CONNECT_TIMEOUT),
    )
    # Dropped, not refused: the SYN is silently eaten, so the connect times out.
    assert blocked["result"] == "timeout", blocked
    assert BLOCKED_CONNECT_TIMEOUT - 0.1 <= blocked["seconds"] < BLOCKED_CONNECT_TIMEOUT + 1
    assert topology.firewall_counters()["drop-new-tcp"] >= 1
    # The server was up all along: the agent reaches it itself (via lo).
    local = client(
        topology, AGENT,
        "tcp-connect", "--host", AGENT_ADDR, "--port", str(TCP_PORT), "--send", "local",
    )
    assert local["result"] == "ok"
    (accepted,) = events(finish(server), "accepted")
    assert accepted["data"] == "local"


async def test_agent_connects_out_to_worker(topology: Topology) -> None:
    # Through the trio helpers, as an async test of the stack would.
    server = await topology.open_process(
        WORKER,
        [PYTHON, PROBE, "tcp-serve", "--host", WORKER_ADDR, "--port", str(TCP_PORT)],
        stdout=subprocess.PIPE,
    )
    assert server.stdout is not None
    seen = b""
    with trio.fail_after(10):
        while b"READY\n" not in seen:
            chunk = await server.stdout.receive_some()
            assert chunk, seen
            seen += chunk
        done = await topology.run_process(
            AGENT,
            [PYTHON, PROBE, "tcp-connect", "--host", WORKER_ADDR, "--port", str(TCP_PORT),
             "--send", "outbound"],
            capture_stdout=True,
        )
        reply = json.loads(done.stdout.decode().splitlines()[-1])
        assert reply["result"] == "ok" and reply["reply"] == "echo:outbound"
        while chunk := await server.stdout.receive_some():
            seen += chunk
        assert await server.wait() == 0
    lines = [json.loads(line) for line in seen.decode().splitlines()[1:]]
    (accepted,) = events(lines, "accepted")
    assert accepted["peer"][0] == AGENT_ADDR
    assert topology.firewall_counters()["drop-new-tcp"] == 0


def test_udp_to_agent_never_arrives(topology: Topology) -> None:
    server = serve(
        topology, AGENT, "udp-serve", "--host", "0.0.0.0", "--port", str(UDP_PORT),
        "--count", "10", "--stop", "STOP",
    )
    sent = client(
        topology, WORKER,
        "udp-send", "--host", AGENT_ADDR, "--port", str(UDP_PORT), "--send", "unsolicited",
        "--count", "3",
    )
    assert sent["sent"] == 3
    # The agent then sends itself the stop datagram, which arrives (lo) after the three.
    client(topology, AGENT, "udp-send", "--host", AGENT_ADDR, "--port", str(UDP_PORT),
           "--send", "STOP")
    datagrams = events(finish(server), "datagram")
    assert [d["data"] for d in datagrams] == ["STOP"]
    assert topology.firewall_counters()["drop-udp"] >= 3


def test_udp_reply_reaches_agent_but_not_a_stray(topology: Topology) -> None:
    server = serve(
        topology, RELAY, "udp-serve", "--host", RELAY_ADDR, "--port", str(UDP_PORT),
        "--echo", "--stray-port", str(STRAY_PORT),
    )
    got = client(
        topology, AGENT,
        "udp-send", "--host", RELAY_ADDR, "--port", str(UDP_PORT), "--send", "from-agent",
        "--wait", "2", "--until", "echo:",
    )
    # The relay sent "stray:" (from another port: not a reply) before "echo:" (a reply).
    assert got["replies"] == [{"peer": [RELAY_ADDR, UDP_PORT], "data": "echo:from-agent"}]
    (datagram,) = events(finish(server), "datagram")
    assert datagram["peer"][0] == AGENT_ADDR and datagram["data"] == "from-agent"
    assert topology.firewall_counters()["drop-udp"] >= 1


def test_capture_on_relay(topology: Topology, tmp_path: Path) -> None:
    port = str(TCP_PORT)
    with Capture(topology, RELAY, tmp_path / "relay.cap") as capture:
        server = serve(topology, RELAY, "tcp-serve", "--host", RELAY_ADDR, "--port", port)
        client(topology, WORKER, "tcp-connect", "--host", RELAY_ADDR, "--port", port,
               "--send", "MARKER-over-the-wire")
        finish(server)
        # On the worker's own loopback: another namespace, so not on the relay's capture.
        server = serve(topology, WORKER, "tcp-serve", "--host", "127.0.0.1", "--port", port)
        client(topology, WORKER, "tcp-connect", "--host", "127.0.0.1", "--port", port,
               "--send", "MARKER-worker-loopback")
        finish(server)
        # On the relay's own loopback: "any" includes lo, which makes the above meaningful.
        server = serve(topology, RELAY, "tcp-serve", "--host", "127.0.0.1", "--port", port)
        client(topology, RELAY, "tcp-connect", "--host", "127.0.0.1", "--port", port,
               "--send", "MARKER-relay-loopback")
        finish(server)
        result = capture.stop()

    wire = [p for p in result.with_payload(b"MARKER-over-the-wire") if not p.outgoing]
    assert wire, result.summary
    assert {(p.ifname, p.src, p.dst, p.dport) for p in wire} == {
        ("eth0", WORKER_ADDR, RELAY_ADDR, TCP_PORT)
    }
    echoes = result.with_payload(b"echo:MARKER-over-the-wire")
    assert echoes and all(p.outgoing and p.dst == WORKER_ADDR for p in echoes)
    assert not result.contains(b"MARKER-worker-loopback")
    assert {p.ifname for p in result.with_payload(b"MARKER-relay-loopback")} == {"lo"}
    assert result.summary["packets"] == len(result.packets)
    assert result.summary["kernel_drops"] == 0 and not result.summary["truncated"]


def test_capture_is_bounded(topology: Topology, tmp_path: Path) -> None:
    out = tmp_path / "small.cap"
    with Capture(topology, RELAY, out, max_bytes=1000) as capture:
        server = serve(topology, RELAY, "tcp-serve", "--host", RELAY_ADDR, "--port",
                       str(TCP_PORT))
        client(topology, WORKER, "tcp-connect", "--host", RELAY_ADDR, "--port",
               str(TCP_PORT), "--send", "x" * 20_000)
        finish(server)
        result = capture.stop()
    assert result.summary["truncated"]
    assert result.summary["written"] <= 1000 and out.stat().st_size <= 1000 + 8
    assert result.summary["bytes"] > 40_000  # data and echo were both counted
    assert len(result.packets) < result.summary["packets"]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_teardown_after_failure(netns_available: None) -> None:
    spawn = (
        "import subprocess; "
        "p = subprocess.Popen(['sleep', '60'], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )
    with pytest.raises(RuntimeError, match="test failed"), topology() as topo:
        names = topo.all_namespaces()
        tracked = topo.popen(AGENT, ["sleep", "60"])
        orphan = int(topo.run_python(WORKER, "-c", spawn, check=True).stdout)  # untracked
        assert orphan in topo.pids(WORKER)
        raise RuntimeError("test failed")
    assert tracked.returncode is not None
    assert _gone(orphan)
    assert not [name for name in names if (NETNS_DIR / name).exists()]


def test_teardown_reaps_trio_processes(netns_available: None) -> None:
    with topology() as topo:
        proc = trio.run(topo.open_process, AGENT, ["sleep", "60"])
        for _ in range(500):  # until `ip netns exec` has entered the namespace (≤ 5 s)
            if proc.pid in topo.pids(AGENT):
                break
            time.sleep(0.01)
        assert proc.pid in topo.pids(AGENT)
    # Closed outside any trio run, as the fixture's teardown is: killed and reaped.
    assert not Path(f"/proc/{proc.pid}").exists()
    assert trio.run(proc.wait) == -signal.SIGTERM  # (and trio closes its pidfd)


def test_stale_namespaces_are_removed(netns_available: None) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, ours = f"cac-{dead.pid}-0-agent", f"cac-{os.getpid()}-999-agent"
    # Held throughout: another suite on this host would otherwise clean up our stale
    # namespace first (or we theirs).
    with cleanup_lock():
        for name in (stale, ours):
            subprocess.run(["ip", "netns", "add", name], check=True)
        inside = subprocess.Popen(
            ["ip", "netns", "exec", stale, "sh", "-c", "echo in; exec sleep 60"],
            stdout=subprocess.PIPE,
        )
        try:
            read_line(inside, timeout=10, startswith="in")  # it is inside the namespace now
            removed = cleanup_stale(locked=True)
            # A crashed run elsewhere on this host may have left namespaces of its own.
            assert stale in removed and ours not in removed
            assert inside.wait(timeout=5) != 0  # killed
            assert not (NETNS_DIR / stale).exists()
            assert (NETNS_DIR / ours).exists()  # its creator (this process) is alive
        finally:
            inside.kill()
            inside.communicate()
            for name in (stale, ours):
                subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def test_python_runs_the_venv(topology: Topology) -> None:
    done = topology.run_python(AGENT, "-c", "import sys, trio; print(sys.executable)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == sys.executable


def test_with_own_run_gives_commands_a_run_folder_of_their_own(topology: Topology,
                                                              tmp_path) -> None:
    own = tmp_path / "run"
    name = f"{topology.prefix}.probe"  # nothing on this machine has that name
    wrote = topology.run(AGENT, with_own_run(own, [
        "sh", "-c", f"mkdir -p /var/run/probe && echo $$ > /var/run/probe/{name}"]))
    assert wrote.returncode == 0, wrote.stderr
    # Another command given the same folder sees it; the host's /run never did.
    seen = topology.run(WORKER, with_own_run(own, ["cat", f"/run/probe/{name}"]))
    assert seen.returncode == 0 and seen.stdout.strip(), seen.stderr
    assert seen.stdout == (own / "probe" / name).read_text()
    assert not Path("/run/probe", name).exists()
    assert not Path("/var/run/probe", name).exists()
    # The command is exec'd, not forked: teardown's signals reach it, not a wrapper.
    proc = topology.popen(AGENT, with_own_run(own, ["sh", "-c", "echo $$; exec sleep 60"]),
                          stdout=subprocess.PIPE, text=True)
    assert int(read_line(proc, timeout=10)) == proc.pid
