"""The relay's namespace scenario: a worker reaches a firewalled agent by key.

Three hosts (see README.md): a DHT bootstrap and the blind relay on the relay
host, a `cosmicac beam` listener on the agent host (whose firewall drops every
inbound connection and unsolicited datagram), a `cosmicac beam` dialer on the
worker host. Every process is the real console script.

(a) without a relay the dial fails in bounded time, naming the address tried;
(b) with the agent's relay key, 16 MiB go each way, SHA-256 intact;
(c) a packet capture on the relay host never sees the plaintext marker;
(d) the relay restarted with the same --storage has the same key, the agent
    reserves again and a new beam gets through.

The hosts, the DHT bootstrap and one relay are built once for the module
(:func:`scenario`); each test starts its own agent and dialer (fresh keys), and
(d) a relay of its own that it may stop.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodes.kit.ready import ReadyLine, find_ready
from tests.netns.capture import Capture
from tests.netns.topology import (
    AGENT,
    AGENT_ADDR,
    RELAY,
    RELAY_ADDR,
    WORKER,
    Topology,
    console_script,
)

pytestmark = [pytest.mark.netns, pytest.mark.slow]

COSMICAC = console_script("cosmicac")
BLIND_RELAY = console_script("blind-relay")
DHT_PORT = 49739
#: The relay that (d) restarts: its own port, beside the module's relay (blind-relay's
#: default port).
RESTARTED_RELAY_PORT = 49741
BOOTSTRAP = f"{RELAY_ADDR}:{DHT_PORT}"
RELAY_KEY_LINE = re.compile(r"Server listening on ([0-9a-f]{64})")
LISTENING = re.compile(r"listening on \S+ key ([0-9a-f]{64})")
MARKER = b"PLAINTEXT-MARKER-7f3a9c"


def wait_for_line(path: Path, pattern: re.Pattern[str], *, after: int = 0,
                  timeout: float = 30.0) -> re.Match[str]:
    """Poll a log file until a line past offset ``after`` matches; bounded in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        for line in text[after:].splitlines():
            match = pattern.search(line)
            if match:
                return match
        time.sleep(0.05)
    tail = path.read_text(errors="replace")[-2000:] if path.exists() else "(no file)"
    raise TimeoutError(f"no line /{pattern.pattern}/ in {path.name} in {timeout} s:\n{tail}")


def wait_for_ready(path: Path, daemon: str, *, timeout: float = 30.0) -> ReadyLine:
    """Poll a daemon's stdout file until its ready line is there; bounded in time."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        # Whole lines only: the last one may still be half written.
        ready = find_ready(text.splitlines()[:text.count("\n")], daemon)
        if ready is not None:
            return ready
        time.sleep(0.05)
    raise TimeoutError(f"no ready line of {daemon} in {path.name} in {timeout} s")


def start_bootstrap(topology: Topology, tmp_path: Path) -> None:
    out = tmp_path / "bootstrap.out"
    topology.popen(RELAY, [COSMICAC, "dht", "bootstrap", "--host", RELAY_ADDR,
                           "--port", str(DHT_PORT)],
                   stdout=out.open("wb"), stderr=(tmp_path / "bootstrap.err").open("wb"))
    wait_for_ready(out, "dht-bootstrap")


def start_relay(topology: Topology, tmp_path: Path, name: str, *,
                port: int | None = None) -> tuple[subprocess.Popen, str]:
    out = tmp_path / f"{name}.out"
    process = topology.popen(
        RELAY, [BLIND_RELAY, "--storage", tmp_path / "relay-storage", "--host", RELAY_ADDR,
                "--bootstrap", BOOTSTRAP, *(["--port", str(port)] if port else [])],
        stdout=out.open("wb"), stderr=(tmp_path / f"{name}.err").open("wb"),
    )
    key = wait_for_line(out, RELAY_KEY_LINE)[1]
    assert out.read_text().splitlines()[0] == f"Using storage at {tmp_path / 'relay-storage'}"
    return process, key


def start_agent(topology: Topology, tmp_path: Path, data: Path | None, relay_key: str | None,
                name: str = "agent", *, punch: bool = False) -> tuple[subprocess.Popen, str, Path]:
    """A beam listener on the firewalled agent host; without ``punch`` its
    connections stay on the relay (these tests are about the relay's path).
    With ``data`` None its stdin is a pipe for the test to feed."""
    err = tmp_path / f"{name}.err"
    argv = [COSMICAC, "beam", "--listen", "--bootstrap", BOOTSTRAP, "--host", AGENT_ADDR,
            "--punch" if punch else "--no-punch"]
    if relay_key:
        argv += ["--relay", relay_key]
    process = topology.popen(AGENT, argv,
                             stdin=subprocess.PIPE if data is None else data.open("rb"),
                             stdout=(tmp_path / f"{name}.out").open("wb"), stderr=err.open("wb"))
    key = wait_for_line(err, LISTENING)[1]
    return process, key, err


def dial(topology: Topology, key: str, data: Path, out: Path, *, timeout: float = 120,
         punch: bool = False):
    with data.open("rb") as stdin, out.open("wb") as stdout:
        return topology.run(WORKER, [COSMICAC, "beam", key, "--bootstrap", BOOTSTRAP,
                                     "--punch" if punch else "--no-punch"],
                            stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True,
                            timeout=timeout)


def payload(path: Path, size: int) -> str:
    """Random bytes with the marker sprinkled through them; returns the SHA-256."""
    chunk = 64 * 1024
    with path.open("wb") as file:
        for _ in range(size // chunk):
            file.write(MARKER + os.urandom(chunk - len(MARKER)))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Scenario:
    """The module's hosts with a DHT bootstrap and a blind relay running on ``relay``."""

    topology: Topology
    relay_key: str


@pytest.fixture(scope="module")
def scenario(module_topology: Topology, tmp_path_factory) -> Scenario:
    """Built once for the module: each test brings its own agent and dialer (new keys),
    so none sees another's; the processes a test leaves go at the module's teardown."""
    folder = tmp_path_factory.mktemp("relay-scenario")
    start_bootstrap(module_topology, folder)
    _, relay_key = start_relay(module_topology, folder, "relay")
    return Scenario(module_topology, relay_key)


@pytest.fixture
def topology(scenario: Scenario) -> Topology:
    return scenario.topology


def test_without_a_relay_the_worker_cannot_reach_the_agent(topology: Topology, tmp_path):
    dropped_before = topology.firewall_counters()["drop-new-tcp"]
    (tmp_path / "empty").write_bytes(b"")
    agent, key, _ = start_agent(topology, tmp_path, tmp_path / "empty", relay_key=None)
    started = time.monotonic()
    result = dial(topology, key, tmp_path / "empty", tmp_path / "worker.out", timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert "cannot reach" in result.stderr
    assert re.search(rf"{re.escape(AGENT_ADDR)}:\d+: timed out after", result.stderr)
    assert "Traceback" not in result.stderr
    assert elapsed < 20  # a bounded failure, not a hang
    # The firewall ate the SYN.
    assert topology.firewall_counters()["drop-new-tcp"] > dropped_before
    assert agent.poll() is None  # the listener still waits
    agent.terminate()
    agent.wait(timeout=15)


def test_through_the_relay_16_mib_each_way_and_the_relay_sees_no_plaintext(
    scenario: Scenario, topology: Topology, tmp_path
):
    relay_key = scenario.relay_key
    to_worker, to_agent = tmp_path / "to-worker", tmp_path / "to-agent"
    to_worker_sum, to_agent_sum = payload(to_worker, 16 << 20), payload(to_agent, 16 << 20)
    agent, key, agent_err = start_agent(topology, tmp_path, to_worker, relay_key)
    wait_for_line(agent_err, re.compile(rf"reserved on relay {relay_key}"))

    with Capture(topology, RELAY, tmp_path / "relay.cap", max_bytes=160 << 20) as capture:
        result = dial(topology, key, to_agent, tmp_path / "worker.out")
        assert result.returncode == 0, result.stderr
        assert agent.wait(timeout=60) == 0
        seen = capture.stop()
    assert sha256(tmp_path / "worker.out") == to_worker_sum
    assert sha256(tmp_path / "agent.out") == to_agent_sum
    # The relay host carried both directions (in and out of the relay: 4 x 16 MiB)...
    assert seen.summary["bytes"] > 60 << 20 and not seen.summary.get("truncated"), \
        seen.summary  # kernel_drops > 0: the capture fell behind
    # ...and never a byte of plaintext.
    assert not seen.contains(MARKER)


class GatedFeed:
    """Feeds a file to a process's stdin: the first ``head`` bytes at once, the
    rest once the test opens the gate (or never, past ``timeout``), then EOF.

    Without the gate, how much of a beam crosses the relay before the hole punch
    lands depends on the machine's load; with it, only the head can."""

    def __init__(self, data: Path, stdin, *, head: int = 1 << 20, timeout: float = 60.0):
        self.gate = threading.Event()
        self._thread = threading.Thread(target=self._feed, args=(data, stdin, head, timeout),
                                        daemon=True)
        self._thread.start()

    def _feed(self, data: Path, stdin, head: int, timeout: float) -> None:
        try:
            with data.open("rb") as source:
                stdin.write(source.read(head))
                stdin.flush()
                if self.gate.wait(timeout):
                    while chunk := source.read(1 << 20):
                        stdin.write(chunk)
        except (BrokenPipeError, ValueError):
            pass  # the process is gone: its exit code tells the test
        finally:
            try:
                stdin.close()
            except BrokenPipeError:
                pass

    def open(self) -> None:
        self.gate.set()

    def join(self, timeout: float = 30.0) -> None:
        self._thread.join(timeout)


def test_with_punching_the_beam_leaves_the_relay_though_the_agent_refuses_connections(
    scenario: Scenario, topology: Topology, tmp_path
):
    """The agent's firewall drops every inbound connection but lets replies in: a
    simultaneous open is a reply to the agent's own SYN, so the session moves to
    the direct path and the relay stops carrying it (hyperdht's users met this
    case as same-LAN peers behind host firewalls)."""
    relay_key = scenario.relay_key
    to_worker, to_agent = tmp_path / "to-worker", tmp_path / "to-agent"
    to_worker_sum, to_agent_sum = payload(to_worker, 16 << 20), payload(to_agent, 16 << 20)
    agent, key, agent_err = start_agent(topology, tmp_path, None, relay_key, punch=True)
    wait_for_line(agent_err, re.compile(rf"reserved on relay {relay_key}"))
    worker_err = tmp_path / "worker.err"
    with Capture(topology, RELAY, tmp_path / "relay.cap", max_bytes=160 << 20) as capture, \
            (tmp_path / "worker.out").open("wb") as worker_out:
        worker = topology.popen(WORKER, [COSMICAC, "beam", key, "--bootstrap", BOOTSTRAP,
                                         "--punch"], stdin=subprocess.PIPE,
                                stdout=worker_out, stderr=worker_err.open("wb"))
        feeds = [GatedFeed(to_agent, worker.stdin), GatedFeed(to_worker, agent.stdin)]
        # Each side sends its first MiB through the relay; the rest only once both
        # sides say the session moved, so the relay's share does not hang on load.
        for err in (worker_err, agent_err):
            wait_for_line(err, re.compile(r"beam: (moved to a direct path|staying on)"),
                          timeout=60)
        for feed in feeds:
            feed.open()
        assert worker.wait(timeout=60) == 0, worker_err.read_text()
        assert agent.wait(timeout=60) == 0, agent_err.read_text()
        for feed in feeds:
            feed.join()
        seen = capture.stop()
    stderr = worker_err.read_text()
    assert "beam: connected through relay" in stderr
    assert "beam: moved to a direct path" in stderr, stderr
    assert "beam: moved to a direct path" in agent_err.read_text(), agent_err.read_text()
    assert sha256(tmp_path / "worker.out") == to_worker_sum
    assert sha256(tmp_path / "agent.out") == to_agent_sum
    # The relay carried the first MiB each way (in and out of it: ~4 MiB); the other
    # 60 MiB it would have carried went direct.
    assert seen.summary["bytes"] < 16 << 20, seen.summary
    assert not seen.contains(MARKER)


def test_a_restarted_relay_keeps_its_key_and_the_agent_reserves_again(
    topology: Topology, tmp_path
):
    # A relay of this test's own (the module's keeps running beside it).
    first, relay_key = start_relay(topology, tmp_path, "relay", port=RESTARTED_RELAY_PORT)
    data = tmp_path / "data"
    data_sum = payload(data, 1 << 20)
    agent, key, agent_err = start_agent(topology, tmp_path, data, relay_key)
    wait_for_line(agent_err, re.compile(rf"reserved on relay {relay_key}"))

    first.terminate()
    assert first.wait(timeout=15) == 0
    lost = wait_for_line(agent_err, re.compile("lost the reservation"))
    restarted, again = start_relay(topology, tmp_path, "relay-again",
                                   port=RESTARTED_RELAY_PORT)
    assert again == relay_key
    offset = len(agent_err.read_text()[: lost.end()])
    wait_for_line(agent_err, re.compile(rf"reserved on relay {relay_key}"), after=offset,
                  timeout=60)

    (tmp_path / "empty").write_bytes(b"")
    result = dial(topology, key, tmp_path / "empty", tmp_path / "worker.out")
    assert result.returncode == 0, result.stderr
    assert sha256(tmp_path / "worker.out") == data_sum
    assert agent.wait(timeout=30) == 0
    restarted.terminate()
    assert restarted.wait(timeout=15) == 0
