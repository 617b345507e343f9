"""Three hosts in Linux network namespaces: a relay, a worker and a firewalled agent.

::

                    switch namespace  (<prefix>-sw): bridge br0
          ┌──────────────────┬──────────────────┬──────────────────┐
       port "relay"      port "worker"       port "agent"
          │ veth             │ veth             │ veth
    <prefix>-relay      <prefix>-worker     <prefix>-agent
    eth0 10.77.0.1/24   eth0 10.77.0.2/24   eth0 10.77.0.3/24 + firewall

Each host namespace has ``lo`` up and one ``eth0`` on the bridge; nothing else — no
default route, so an address outside 10.77.0.0/24 and 127.0.0.0/8 is unreachable
(``ENETUNREACH``) from inside, and nothing is created in the caller's namespace.

The agent's firewall (iptables, ``filter`` table, IPv4 and IPv6 alike): INPUT policy
DROP; accept ``lo``; accept conntrack ESTABLISHED,RELATED (replies to what the agent
sent); count-and-drop new TCP and other UDP (rules commented ``drop-new-tcp`` and
``drop-udp``). The agent can connect out, but nobody can connect in, and a datagram
reaches it only as a reply to one it sent (same address and port pair, while the
conntrack entry lives).

Namespaces are named ``cac-<pid>-<n>-<host>`` (pid of the creating process, a counter);
:func:`cleanup_stale` removes those whose pid is dead (a crashed run), and every build
calls it first. :meth:`Topology.close` kills what the topology started and every process
still inside its namespaces, then deletes the namespaces (and with them veths and bridge).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import trio

RELAY = "relay"
WORKER = "worker"
AGENT = "agent"
HOSTS = (RELAY, WORKER, AGENT)

SUBNET = "10.77.0.0/24"
PREFIX_LEN = 24
ADDRESSES = {RELAY: "10.77.0.1", WORKER: "10.77.0.2", AGENT: "10.77.0.3"}
RELAY_ADDR = ADDRESSES[RELAY]
WORKER_ADDR = ADDRESSES[WORKER]
AGENT_ADDR = ADDRESSES[AGENT]

IFACE = "eth0"  # each host's interface on the bridge
BRIDGE = "br0"  # in the switch namespace; its ports are named after the hosts
SWITCH = "sw"

NS_PREFIX = "cac-"
NETNS_DIR = Path("/run/netns")
#: This scheme's namespaces (nat_lab.py's and deploy_lab.py's hosts too).
_NS_NAME = re.compile(r"^cac-(\d+)-(\d+)-(sw|relay|worker|agent|inet|nat\d|[a-d]|open"
                      r"|control|gpu|desk|agents)$")
_counter = itertools.count()

VENV_BIN = Path(sys.executable).parent
PYTHON = sys.executable

_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


# iptables-restore input, loaded for IPv4 and IPv6 alike. The two DROP rules repeat the
# policy on purpose: their counters tell a test that the firewall (not bad luck) ate its
# packet. See Topology.firewall_counters().
AGENT_FIREWALL = (
    "*filter\n"
    ":INPUT DROP [0:0]\n"
    ":FORWARD DROP [0:0]\n"
    ":OUTPUT ACCEPT [0:0]\n"
    "-A INPUT -i lo -j ACCEPT\n"
    "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT\n"
    '-A INPUT -p tcp -m comment --comment "drop-new-tcp" -j DROP\n'
    '-A INPUT -p udp -m comment --comment "drop-udp" -j DROP\n'
    "COMMIT\n"
)


class NetnsUnavailable(RuntimeError):
    """This machine cannot build the topology (not root, no namespaces, no netfilter)."""


def console_script(name: str) -> str:
    """Path of one of the venv's console scripts, e.g. ``console_script("cosmicac")``."""
    return str(VENV_BIN / name)


def which(tool: str) -> str | None:
    """``shutil.which`` that also looks in /usr/sbin and /sbin (ip, iptables live there)."""
    return shutil.which(tool, path=_SBIN_PATH)


#: Where the command of :func:`with_own_run` sees its private run folder: /run, and
#: /var/run where that is a folder of its own rather than a link to /run (as it is here).
_RUN_FOLDERS = tuple(sorted({os.path.realpath("/run"), os.path.realpath("/var/run")}))
#: $1 the private folder, then the command: bind it over each run folder, then exec.
_OWN_RUN_SCRIPT = (
    'own=$1; shift; for run in ' + shlex.join(_RUN_FOLDERS) + '; do '
    'mount --bind "$own" "$run" || exit 125; done; exec "$@"'
)


def with_own_run(run_dir: Path, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
    """``argv`` in a mount namespace of its own whose /run (so /var/run too) is ``run_dir``.

    For tools that meet at fixed paths under /run — wireguard-go listens on
    /var/run/wireguard/<interface>.sock and ``wg`` looks only there — which every network
    namespace shares with the host, and with a second copy of the suite running on it
    (whose cleanup, or a wireguard-go exiting, could empty or remove the folder under
    ours). Commands given the same ``run_dir`` meet there and nowhere else; the host's
    /run is never touched (the rest of it is hidden from the command). Wrap it in
    :meth:`Topology.cmd` (``topology.popen(host, with_own_run(...))``): the mount
    namespace is made by ``unshare`` and the command is exec'd (same pid), so teardown's
    signals reach it. Needs root, as the topology does.
    """
    run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    return ["unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", _OWN_RUN_SCRIPT, "own-run", os.fspath(run_dir),
            *map(os.fspath, argv)]


def netns_required() -> bool:
    """True where the netns tests must run rather than skip (CI sets this)."""
    return (
        os.environ.get("CAC_NETNS_REQUIRED") == "1"
        or os.environ.get("CI", "").lower() == "true"
    )


def unavailable_reason() -> str | None:
    """Why the topology cannot be built here, or None when it (probably) can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (uid 0)"
    for tool, package in (
        ("ip", "iproute2"),
        ("iptables-restore", "iptables"),
        ("ip6tables-restore", "iptables"),
    ):
        if which(tool) is None:
            return f"`{tool}` not found (apt-get install {package}; .ci/run installs it)"
    return None


def _ip() -> str:
    path = which("ip")
    if path is None:
        raise NetnsUnavailable("`ip` (iproute2) not found")
    return path


def _run(argv: Sequence[str], *, stdin: str | None = None, timeout: float = 20.0) -> str:
    """Run a setup command; raise CalledProcessError (with stderr) when it fails."""
    done = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


def _pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (a killed run whose parent has not reaped it
    yet counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not _exited(pid)


def _pids_in(names: Sequence[str]) -> dict[str, set[int]]:
    """Processes whose network namespace is one of the named ones (like `ip netns pids`)."""
    inodes: dict[tuple[int, int], str] = {}
    for name in names:
        with contextlib.suppress(OSError):
            st = os.stat(NETNS_DIR / name)
            inodes[(st.st_dev, st.st_ino)] = name
    found: dict[str, set[int]] = {name: set() for name in names}
    if not inodes:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:  # gone, a zombie, or a kernel thread we may not look at
            continue
        name = inodes.get((st.st_dev, st.st_ino))
        if name is not None:
            found[name].add(int(entry))
    return found


def _exited(pid: int) -> bool:
    """The process is gone or a zombie (it has stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _kill_and_delete(names: Sequence[str]) -> None:
    """SIGKILL every process inside the namespaces, then delete them. Bounded, best effort."""
    for _ in range(20):
        pids = set().union(*_pids_in(names).values()) - {os.getpid()}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    present = [name for name in names if (NETNS_DIR / name).exists()]
    if present:
        batch = "".join(f"netns del {name}\n" for name in present)
        subprocess.run(
            [_ip(), "-force", "-batch", "-"],
            input=batch,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )


def stale_namespaces() -> list[str]:
    """Namespaces of this scheme whose creating process is dead."""
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return []
    stale = []
    for name in sorted(names):
        match = _NS_NAME.match(name)
        if match is None:
            continue
        pid = int(match[1])
        if pid != os.getpid() and not _pid_alive(pid):
            stale.append(name)
    return stale


# Suites run side by side on one host (CI beside a developer's run) share /run/netns:
# one run's cleanup must not race another's test of that cleanup.
CLEANUP_LOCK = Path("/run/lock/cosmicac-netns-cleanup.lock")


@contextlib.contextmanager
def cleanup_lock() -> Iterator[None]:
    """Hold the host-wide lock under which stale namespaces are found and removed."""
    CLEANUP_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(CLEANUP_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cleanup_stale(*, locked: bool = False) -> list[str]:
    """Remove namespaces left by dead test runs (and kill what still runs in them).

    ``locked`` says the caller already holds :func:`cleanup_lock`.
    """
    with contextlib.nullcontext() if locked else cleanup_lock():
        stale = stale_namespaces()
        if stale:
            _kill_and_delete(stale)
    return stale


def read_line(
    proc: subprocess.Popen[Any],
    *,
    timeout: float,
    startswith: str = "",
    pattern: re.Pattern[str] | None = None,
    stream: str = "stdout",
) -> str:
    """Return the first line ``proc`` prints that starts with ``startswith`` (and, given a
    ``pattern``, in which ``pattern.search`` finds a match).

    ``stream`` is "stdout" or "stderr" and must be a ``subprocess.PIPE``. The pipe is read a
    byte at a time, so nothing past that line is consumed (``communicate()`` still gets the
    rest); earlier lines are dropped. Raises TimeoutError after ``timeout`` seconds and
    EOFError if the pipe closes first.
    """
    pipe = getattr(proc, stream)
    assert pipe is not None, f"read_line needs {stream}=subprocess.PIPE"
    fd = pipe.fileno()
    wanted = repr(pattern.pattern if pattern is not None else startswith)
    deadline = time.monotonic() + timeout
    line = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no line {wanted} on {stream} in {timeout}s (partial: {line!r})")
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        byte = os.read(fd, 1)
        if not byte:
            raise EOFError(f"{stream} closed (exit {proc.poll()}) before a line {wanted}")
        if byte != b"\n":
            line += byte
            continue
        text = line.decode(errors="replace")
        line.clear()
        if text.startswith(startswith) and (pattern is None or pattern.search(text)):
            return text


class Topology:
    """A built topology; make one with :func:`topology` or ``with Topology.create() as t``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.namespaces: dict[str, str] = {host: f"{prefix}-{host}" for host in HOSTS}
        self.switch_ns = f"{prefix}-{SWITCH}"
        self.addresses: dict[str, str] = dict(ADDRESSES)
        self.build_seconds: float | None = None
        self._procs: list[subprocess.Popen[Any]] = []
        self._trio_procs: list[trio.Process] = []
        self._closed = False

    # -- building and tearing down -------------------------------------------------------

    @classmethod
    def create(cls) -> Topology:
        """Build a fresh topology (after removing stale ones); tear it down if that fails."""
        cleanup_stale()
        topo = cls(f"{NS_PREFIX}{os.getpid()}-{next(_counter)}")
        started = time.monotonic()
        try:
            topo._build()
        except BaseException:
            topo.close()
            raise
        topo.build_seconds = time.monotonic() - started
        return topo

    def all_namespaces(self) -> list[str]:
        return [self.switch_ns, *self.namespaces.values()]

    def _build(self) -> None:
        ip = _ip()
        batch = "".join(f"netns add {name}\n" for name in self.all_namespaces())
        try:
            _run([ip, "-batch", "-"], stdin=batch)
        except subprocess.CalledProcessError as exc:
            raise NetnsUnavailable(f"`ip netns add` failed: {exc.stderr.strip()}") from exc

        # The bridge and the switch ends of the veths live in the switch namespace; the
        # other ends are created directly inside the hosts, so the caller's namespace never
        # sees a device. addrgenmode none: no IPv6 link-local addresses (and no ND/MLD
        # chatter in captures); the topology is IPv4 only.
        switch = [
            "link set lo up",
            f"link add {BRIDGE} type bridge",
            f"link set {BRIDGE} addrgenmode none",
            f"link set {BRIDGE} up",
        ]
        for host, ns in self.namespaces.items():
            switch += [
                f"link add {host} type veth peer name {IFACE} netns {ns}",
                f"link set {host} addrgenmode none",
                f"link set {host} master {BRIDGE} up",
            ]
        _run([ip, "-n", self.switch_ns, "-batch", "-"], stdin="\n".join(switch) + "\n")
        for host, ns in self.namespaces.items():
            config = [
                "link set lo up",
                f"link set {IFACE} addrgenmode none",
                f"addr add {self.addresses[host]}/{PREFIX_LEN} dev {IFACE}",
                f"link set {IFACE} up",
            ]
            _run([ip, "-n", ns, "-batch", "-"], stdin="\n".join(config) + "\n")

        for tool in ("iptables-restore", "ip6tables-restore"):
            try:
                _run([ip, "netns", "exec", self.namespaces[AGENT], tool], stdin=AGENT_FIREWALL)
            except (subprocess.CalledProcessError, FileNotFoundError) as exc:
                detail = getattr(exc, "stderr", None) or str(exc)
                raise NetnsUnavailable(
                    f"`{tool}` in a namespace failed: {detail.strip()}"
                ) from exc

    def close(self) -> None:
        """Stop every process the topology started or that runs inside it; delete it all.

        First SIGTERM to what it started, up to 2 s to exit, then SIGKILL to every process
        still inside its namespaces, then ``ip netns del``. Safe to call more than once.
        """
        if self._closed:
            return
        self._closed = True
        # trio.Process.returncode needs a running trio loop (it may notify trio that its
        # pidfd closes) and the loop is usually gone by teardown: touch only terminate()
        # and kill(), which go straight to the underlying Popen (and reap a dead child).
        for proc in [*self._procs, *self._trio_procs]:
            with contextlib.suppress(OSError):
                proc.terminate()
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for tproc in self._trio_procs:
            while not _exited(tproc.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        # Everything left inside (grandchildren, daemons, the stubborn) gets SIGKILL.
        _kill_and_delete(self.all_namespaces())
        for proc in self._procs:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2.0)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        for tproc in self._trio_procs:  # kill() polls first, which reaps a dead child
            until = time.monotonic() + 2.0
            while time.monotonic() < until:
                with contextlib.suppress(OSError):
                    tproc.kill()
                if not os.path.exists(f"/proc/{tproc.pid}"):
                    break
                time.sleep(0.01)

    def __enter__(self) -> Topology:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- running things inside -----------------------------------------------------------

    def ns(self, host: str) -> str:
        """The namespace name of ``host`` (one of HOSTS, or "sw" for the switch)."""
        if host == SWITCH:
            return self.switch_ns
        try:
            return self.namespaces[host]
        except KeyError:
            raise KeyError(f"no host {host!r}; hosts are {HOSTS}") from None

    def addr(self, host: str) -> str:
        return self.addresses[host]

    def cmd(self, host: str, argv: Sequence[str | os.PathLike[str]]) -> list[str]:
        """``argv`` wrapped in ``ip netns exec <ns>`` (which execs it: same pid)."""
        return [_ip(), "netns", "exec", self.ns(host), *map(os.fspath, argv)]

    def run(
        self,
        host: str,
        argv: Sequence[str | os.PathLike[str]],
        *,
        timeout: float = 30.0,
        check: bool = False,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[Any]:
        """``subprocess.run`` inside ``host``; by default captures text output, 30 s limit."""
        if "stdout" not in kwargs and "stderr" not in kwargs:
            kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL if "input" not in kwargs else None)
        return subprocess.run(self.cmd(host, argv), timeout=timeout, check=check, **kwargs)

    def popen(
        self, host: str, argv: Sequence[str | os.PathLike[str]], **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """``subprocess.Popen`` inside ``host``; stopped (TERM, then KILL) at teardown."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(self.cmd(host, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def python(
        self, host: str, *args: str | os.PathLike[str], **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """The venv's Python (``sys.executable``) started inside ``host``."""
        return self.popen(host, [PYTHON, *args], **kwargs)

    def run_python(
        self, host: str, *args: str | os.PathLike[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """The venv's Python run to completion inside ``host`` (same defaults as run)."""
        return self.run(host, [PYTHON, *args], **kwargs)

    async def open_process(
        self, host: str, argv: Sequence[str | os.PathLike[str]], **kwargs: Any
    ) -> trio.Process:
        """``trio.lowlevel.open_process`` inside ``host``; killed at teardown if still up."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = await trio.lowlevel.open_process(self.cmd(host, argv), **kwargs)
        self._trio_procs.append(proc)
        return proc

    async def run_process(
        self, host: str, argv: Sequence[str | os.PathLike[str]], **kwargs: Any
    ) -> subprocess.CompletedProcess[bytes]:
        """``trio.run_process`` inside ``host`` (killed if the caller is cancelled)."""
        kwargs.setdefault("stdin", b"")
        return await trio.run_process(self.cmd(host, argv), **kwargs)

    # -- looking at it -------------------------------------------------------------------

    def pids(self, host: str) -> set[int]:
        """Processes currently inside ``host``'s namespace."""
        ns = self.ns(host)
        return _pids_in([ns])[ns]

    def firewall_counters(self, *, ipv6: bool = False) -> dict[str, int]:
        """Packets matched by the agent's INPUT rules: {"drop-new-tcp": n, "drop-udp": n,
        "policy": n}."""
        tool = "ip6tables" if ipv6 else "iptables"
        listing = self.run(AGENT, [tool, "-L", "INPUT", "-n", "-v", "-x"], check=True).stdout
        counters: dict[str, int] = {}
        for line in listing.splitlines():
            if policy := re.search(r"policy \w+ (\d+) packets", line):
                counters["policy"] = int(policy[1])
            elif comment := re.search(r"/\* (\S+) \*/", line):
                counters[comment[1]] = int(line.split()[0])
        return counters


@contextlib.contextmanager
def topology() -> Iterator[Topology]:
    """Build the three-host topology; everything is removed on exit, failing test or not."""
    topo = Topology.create()
    try:
        yield topo
    finally:
        topo.close()
