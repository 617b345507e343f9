"""`cosmicac shell` against OpenSSH, side by side, through one harness.

Both run as their real client processes against a server on 127.0.0.1: an
``sshd`` this script starts (its own host key, authorized key and config in a
temp dir: no PAM, ``StrictModes no``) and our agent-side shell service on a
swarm in a spawned process. Figures (JSON lines, one per implementation, then
the ratio ours/ssh):

* ``keystroke_rtt_p50`` / ``_p99`` (ms): the harness holds a PTY whose slave is
  the client's terminal (the client puts it in raw mode), the remote runs
  ``stty raw -echo; exec cat`` on a PTY of its own (``ssh -tt`` /
  ``cosmicac shell -t``); one byte typed, timed until its echo comes back.
* ``bulk_output`` (MB/s): ``head -c <mib> MiB /dev/zero`` on the remote, stdout
  a pipe the harness drains; timed from the first byte to the end (the wall
  time from spawn is reported too).
* ``run_true`` (ms): spawn to exit of ``<client> true`` (start-up, connect,
  handshake, one command).

usage: python bench/shell.py [--keystrokes 2000] [--mib 1024] [--reps 1] [--runs 5]

Installs Debian's openssh-server/openssh-client with apt-get when sshd is missing.
"""

from __future__ import annotations

import argparse
import getpass
import os
import pty
import select
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ChildServer, emit, machine, percentile, summary

ROOT = Path(__file__).resolve().parent.parent
ECHO = "stty raw -echo; echo READY; exec cat"
TIMEOUT_S = 60.0


# -- the servers --------------------------------------------------------------------


def _serve_agent(port_queue, user_key_hex: str, tune: bool) -> None:
    """Our side: a swarm on 127.0.0.1 serving shells to the bench's user key."""
    import trio

    from agents.instance import ShellService, keep_large_buffers
    from p2p.keys import KeyPair
    from p2p.swarm import Swarm, SwarmConfig

    user = bytes.fromhex(user_key_hex)
    if tune:  # what the agent's boot should do (see agents/instance/_malloc.py)
        keep_large_buffers()

    async def main() -> None:
        swarm = Swarm(KeyPair.generate(),
                      config=SwarmConfig(host="127.0.0.1", announce_key=False),
                      services=[ShellService({user}.__contains__, shell="/bin/sh")])
        async with trio.open_nursery() as nursery:
            _, port = await nursery.start(swarm.run)
            port_queue.put((swarm.public_key.hex(), port))

    trio.run(main)


def _sshd_binary() -> str:
    found = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists()
                                     else None)
    if found is None or shutil.which("ssh") is None:
        subprocess.run(["apt-get", "install", "-y", "openssh-server", "openssh-client"],
                       check=True, stdout=subprocess.DEVNULL)
        found = shutil.which("sshd") or "/usr/sbin/sshd"
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


class Sshd:
    """``sshd -D`` on a free loopback port, configured in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = _free_port()
        for name in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(folder / name)], check=True)
        (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
        (folder / "sshd_config").write_text(
            f"HostKey {folder / 'host_key'}\n"
            f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
            f"PidFile {folder / 'sshd.pid'}\n"
            "UsePAM no\nStrictModes no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\nLogLevel ERROR\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
        self.process = subprocess.Popen(
            [_sshd_binary(), "-D", "-e", "-f", str(folder / "sshd_config"), "-p", str(self.port),
             "-o", "ListenAddress=127.0.0.1"], stderr=subprocess.DEVNULL)
        _wait_port(self.port)

    def client(self, *, tty: bool) -> list[str]:
        return ["ssh", "-F", "/dev/null", "-i", str(self.folder / "user_key"),
                "-p", str(self.port), "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                "-o", "LogLevel=ERROR", *(["-tt"] if tty else ["-T"]),
                f"{getpass.getuser()}@127.0.0.1"]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


# -- the harness --------------------------------------------------------------------


def _read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    seen = b""
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError(f"no {needle!r} in {seen[-200:]!r}")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise EOFError(f"closed before {needle!r}: {seen[-200:]!r}")
        seen += chunk
    return seen


def keystrokes(argv: list[str], count: int, env: dict[str, str],
               server_pid: int) -> tuple[list[float], float, float]:
    """Round trips (ms) of ``count`` single bytes through the client's PTY, and
    the CPU (µs per keystroke, start-up left out) of the client and of the
    server's process tree (sshd's session processes, our agent; and ``cat``)."""
    master, slave = pty.openpty()
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                               start_new_session=True)
    os.close(slave)
    samples = []
    try:
        _read_until(master, b"READY", time.monotonic() + TIMEOUT_S)
        while select.select([master], [], [], 0.2)[0]:  # the rest of the banner
            os.read(master, 65536)
        cpu_before = _tree_cpu_s(process.pid), _tree_cpu_s(server_pid)
        for index in range(count + 50):
            byte = bytes([97 + index % 26])
            start = time.perf_counter()
            os.write(master, byte)
            got = b""
            while byte not in got:
                if not select.select([master], [], [], 10)[0]:
                    raise TimeoutError(f"keystroke {index} never came back")
                got += os.read(master, 64)
            if index >= 50:  # warm-up
                samples.append((time.perf_counter() - start) * 1000)
        client_us = (_tree_cpu_s(process.pid) - cpu_before[0]) * 1e6 / (count + 50)
        server_us = (_tree_cpu_s(server_pid) - cpu_before[1]) * 1e6 / (count + 50)
    finally:
        process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (done := os.wait4(process.pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                process.kill()
            time.sleep(0.01)
        process.returncode = os.waitstatus_to_exitcode(done[1])
        os.close(master)
    return samples, client_us, server_us


def _cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and of the children it has waited for (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float:
    """CPU seconds that ``root`` and its live descendants have used so far."""
    parents, cpu = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return total


def bulk(argv: list[str], total: int, env: dict[str, str], server_pid: int) -> dict[str, float]:
    """Drain ``argv``'s stdout: MB/s from the first byte to the end and from spawn
    to exit, and the CPU seconds the client and the server spent on it.

    The server's CPU is the serving process's own plus what its waited-for
    children used (sshd's listener waits for each connection's processes, our
    agent for the command it ran), so it counts the remote ``head`` on both sides.
    """
    server_before = _cpu_s(server_pid)
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               env=env)
    fd = process.stdout.fileno()
    received = 0
    first = None
    while chunk := os.read(fd, 1 << 20):
        if first is None:
            first = time.perf_counter()
        received += len(chunk)
    end = time.perf_counter()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    process.stdout.close()
    done = time.perf_counter()
    time.sleep(0.5)  # the server reaps its side
    if received != total or process.returncode != 0:
        raise RuntimeError(f"{argv[0]}: got {received} of {total} bytes, "
                           f"exit {process.returncode}")
    assert first is not None
    return {"mb_s": total / 1e6 / (end - first), "wall_mb_s": total / 1e6 / (done - start),
            "client_cpu_s": usage.ru_utime + usage.ru_stime,
            "server_cpu_s": _cpu_s(server_pid) - server_before}


def run_true(argv: list[str], runs: int, env: dict[str, str]) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdin=subprocess.DEVNULL, env=env, check=True)
        samples.append((time.perf_counter() - start) * 1000)
    return samples


# -- main ---------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keystrokes", type=int, default=2000)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=1, help="bulk transfers per client")
    parser.add_argument("--runs", type=int, default=5, help="`true` runs per client")
    parser.add_argument("--agent-malloc-default", action="store_true",
                        help="leave the agent's malloc as the agent's boot leaves it today")
    parser.add_argument("--only", choices=["keystroke", "bulk", "true"], default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from p2p.keys import load_or_create_keypair

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}
    with tempfile.TemporaryDirectory(prefix="bench-shell-") as tmp:
        folder = Path(tmp)
        user = load_or_create_keypair(folder / "user")
        sshd = Sshd(folder)
        try:
            agent = ChildServer(_serve_agent, user.hex, not args.agent_malloc_default)
            with agent as (agent_key, port):
                ours = [sys.executable, "-m", "cli.main", "shell", "--agent", agent_key,
                        "--address", f"127.0.0.1:{port}", "--identity", str(folder / "user")]
                clients = {
                    "cosmicac": (lambda tty, cmd: [*ours, *(["-t"] if tty else []), "--", *cmd]),
                    "openssh": (lambda tty, cmd: [*sshd.client(tty=tty), shlex.join(cmd)]),
                }
                servers = {"cosmicac": agent._process.pid, "openssh": sshd.process.pid}
                _measure(clients, servers, args, env)
        finally:
            sshd.close()


def _measure(clients, servers, args, env) -> None:
    figures: dict[str, dict[str, float]] = {name: {} for name in clients}
    how_keys = (f"{args.keystrokes} single bytes through a PTY to a remote "
                "`stty raw -echo; exec cat` on a PTY, 50 warm-up")
    how_bulk = (f"head -c {args.mib} MiB /dev/zero, stdout a pipe, first byte to EOF; "
                f"{args.reps} rep(s)")
    for name, client in clients.items():
        if args.only in (None, "true"):
            samples = run_true(client(False, ["true"]), args.runs, env)
            figures[name]["run_true"] = percentile(samples, 0.5)
            emit("shell", "run_true", percentile(samples, 0.5), "ms", impl=name,
                 **summary(samples))
        if args.only in (None, "keystroke"):
            samples, client_us, server_us = keystrokes(
                client(True, ["sh", "-c", ECHO]), args.keystrokes, env, servers[name])
            for fraction, metric in ((0.5, "keystroke_rtt_p50"), (0.99, "keystroke_rtt_p99")):
                figures[name][metric] = percentile(samples, fraction)
                emit("shell", metric, percentile(samples, fraction), "ms", impl=name,
                     n=len(samples), how=how_keys, load=os.getloadavg()[0])
            figures[name]["keystroke_cpu_us"] = client_us + server_us
            emit("shell", "keystroke_cpu_us", client_us + server_us, "us", impl=name,
                 client=round(client_us, 1), server=round(server_us, 1),
                 how="user+system CPU per keystroke of the client and of the server's "
                     "process tree (remote cat included), while typing")
        if args.only in (None, "bulk"):
            total = args.mib * 1024 * 1024
            runs = [bulk(client(False, ["head", "-c", str(total), "/dev/zero"]), total, env,
                         servers[name]) for _ in range(args.reps)]
            steady = [r["mb_s"] for r in runs]
            figures[name]["bulk_output"] = summary(steady)["median"]
            cpu = {side: round(statistics.median(r[f"{side}_cpu_s"] for r in runs) * 1e9 / total, 3)
                   for side in ("client", "server")}
            figures[name]["bulk_cpu_ns_per_byte"] = cpu["client"] + cpu["server"]
            emit("shell", "bulk_output", summary(steady)["median"], "MB/s", impl=name,
                 **summary(steady), wall_mb_s=round(min(r["wall_mb_s"] for r in runs), 2),
                 how=how_bulk, machine=machine(), load=os.getloadavg()[0])
            emit("shell", "bulk_cpu_ns_per_byte", cpu["client"] + cpu["server"], "ns/B",
                 impl=name, client=cpu["client"], server=cpu["server"],
                 how="user+system CPU of the client process and of the server with the "
                     "remote head, per byte delivered")
    ours, ssh = figures["cosmicac"], figures["openssh"]
    for metric in ours:
        if ssh.get(metric):
            emit("shell", f"{metric}_ratio_to_ssh", ours[metric] / ssh[metric], "x",
                 better="higher" if metric == "bulk_output" else "lower")


if __name__ == "__main__":
    main()
