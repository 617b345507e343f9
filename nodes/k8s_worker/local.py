"""The ``local`` backend: a simulated GPU cluster whose VMIs are agent processes.

The embedded default (DESIGN.md §4): the whole platform on one machine, with
no Kubernetes. The cluster is configuration (:class:`LocalClusterSettings`,
two nodes of eight GPUs unless told otherwise); a "VMI" is a real
``cosmicac agent run`` process with a storage folder of its own, so the
worker's queue, placement, status and agent paths run exactly as they do
against KubeVirt, and a VMI's status is a real process's:

==============================  ============================================
what happens                    events (:class:`~.backend.VmiEvent`)
==============================  ============================================
create                          PROVISIONING (folder ready) → BOOTING
                                (starting) → RUNNING (pid)
the process exits 0             SUCCEEDED
the process exits non-zero,     FAILED, with the status or signal and the
or is killed                    log's last line
restart                         GONE ("stopped for restart"), then as create;
                                the folder (the "disk") is kept
delete                          GONE; the folder is removed
==============================  ============================================

Each VMI has two folders: the worker's, ``<state_dir>/<vmi.disk>/``, and the
agent's own, ``<agents_dir>/<vmi.disk>/`` (``agents_dir`` unset: the
``agent/`` folder inside the worker's)::

    <state_dir>/<disk>/    the worker's (0700; 0711 when it holds agent/)
        agent.log          the process's stdout and stderr (JSON log lines), 0600
        process.json       pid, start time (clock ticks since boot), VMI, generation
    <agents_dir>/<disk>/   the agent's own: 0700, owned by the VMI's user
        agent.json         its config (with ``storage`` pointed here), 0600: it
                           holds the VMI's report token
        storage/           its storage: identity, state (kept across restarts)

Isolation. A container job's shell is a child of its agent, so it is
whoever the agent is. When the worker runs as root, each VMI's agent runs as a
user of its own: a uid (and a gid of the same number, with no supplementary
groups) from ``agent_uid_base``..``+agent_uid_count`` that no account uses,
allocated when the VMI is first created and kept with its folder (its owner)
across restarts; or, if ``agent_user`` names an account, as that account (all
VMIs share it then: one job's shell can read another job's agent folder, so the
per-VMI uids are the default). It starts with umask 077, its folder as HOME and
cwd, and an environment of the worker's PATH, locale and PYTHON* variables only.
No daemon's storage is reachable from it: daemon folders are 0700, and the only
way in is its own folder. On stop, besides its process group, every process
left with the VMI's own uid is killed (a shell that started a session of its
own does not outlive its job).

The agents' Python. An agent of its own uid must be able to run the
interpreter and read CosmicAC and its packages. When the worker's interpreter
is one no other user may run (a pyenv or venv under ``/root``, 0700), the
agents run on another of the same major.minor (``local.agent_python``, or the
first of ``/usr/local/bin/pythonX.Y`` and ``/usr/bin/pythonX.Y`` that works),
with CosmicAC's code root and the worker's site-packages on ``PYTHONPATH``: it
is started once at start as an agent's uid, must say it is that version and
import the agent (the compiled extension modules of site-packages too: same
ABI). The agent's model server runs on it as well (``sys.executable``, with the
agent's environment). An INFO line ``local.agent_python`` says which and why.

What it does not isolate: the kernel (one for all; no seccomp, no namespaces),
the GPUs (every agent sees every device the host has; placement only counts
them), the network (an agent reaches every port of the host, 127.0.0.1 too, so
the daemons' own authentication is what guards them), the CPU, memory and disk
(no cgroups, no quotas), and what the host leaves world-readable (``/proc``,
``/tmp``, other users' files with o+r). It is a sandbox for honest mistakes and
casual snooping between teams, not for a hostile tenant: use ``kubevirt``.

``isolation``: ``auto`` (the default) isolates when it can, and when it cannot
(the worker is not root, or the agent's interpreter or folders are not
reachable by another user, e.g. a Python installed under ``/root`` with no
system Python of the same version to run the agents instead) says so in
a WARNING at start and runs the agents as the worker's own user: a shell is then
a shell of the platform's user, for one-person trials only. ``require`` refuses
to start instead (set it on any shared host); ``off`` never isolates.
:attr:`LocalBackend.isolated` and :attr:`LocalBackend.isolation_problem` say
which it is.

Start-up. With the default agent command, agents are forked, not spawned, from
a fork server (``runtime/forkserver/``): a small process :meth:`run` starts
(on the agents' interpreter, with the agents' ``PYTHON*``/locale environment
only) that has imported the agent, and an inference agent's ``local`` model
server, once. An agent then starts in milliseconds instead of a second of
imports, and keeps everything a spawned one has: its user (uid, gid, no groups,
set in the child after the fork and checked before any agent code runs), umask,
folder, environment, a session of its own, its log as stdout and stderr, no
other descriptor, its own command line (``/proc/PID/cmdline`` is rewritten to
``python -m agents.boot --config FILE``, so adoption below still finds it), and
an exit status (the fork server reports it). The fork server never runs trio
and never reads a job's config: no job's secret is in its memory, so none is in
another job's agent. If it cannot start or dies, agents are spawned as before
and a WARNING (``local.fork_server_unusable``) says why; agents it forked are still watched
(by pid, exit status unknown). ``fork_server=false`` turns it off; with
``agent_netns`` or another agent command it is not used.

Worker restarts. Agent processes start in a session of their own, so they
outlive the worker as VMIs outlive a worker pod, and a Ctrl-C in the worker's
terminal does not reach them. After a restart the worker calls :meth:`adopt`
with the replicas it knows: a live process whose pid, start time and command
line match ``process.json`` is watched again (through a pidfd, or by polling
``/proc``: it is no longer our child); a dead one is reported FAILED, not restarted, because
restarting a replica is wrk-ork's decision (its restart policy and counts),
and a backend reports facts, as KubeVirt shows such a VMI ``Failed``. Its exit
status is unknown then (only a parent learns it), which the message says.
:meth:`stop_all` stops every agent (``cosmicac up``'s shutdown, tests).

Falls short: GPUs are not accounted across VMIs (placement does that; a VMI
larger than its node is refused); the overlay network and InfiniBand are
flags in the rack report, nothing more; Linux only (``/proc``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import trio
from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.agent_config import AgentConfigError, load_agent_config
from contracts.model import JobType, NodeInfo, RackReport
from p2p.daemon import write_atomically
from runtime.forkserver import ForkedProcess, ForkServer, ForkServerError
from runtime.process import (
    cmdline,
    describe_exit,
    is_alive,
    last_line,
    proc_stat,
    signal_group,
    spawn,
    wait_gone,
)

from .backend import (
    BackendError,
    ReplicaUnit,
    VmiEvent,
    VmiPhase,
    VmiSpec,
    read_hub_token,
    refuse_isolated_network,
)

__all__ = ["DEFAULT_AGENT_COMMAND", "LocalBackend", "LocalClusterSettings", "LocalNode"]

log = logging.getLogger(__name__)

#: The agent as the worker's own interpreter runs it; ``--config FILE`` is appended.
DEFAULT_AGENT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "cli.main", "agent", "run")
#: Where ``ip netns add`` keeps named network namespaces.
NETNS_DIR = Path("/run/netns")
#: After SIGKILL, how long a process may take to be gone before we call it stuck.
KILL_WAIT_S = 5.0
#: How often a process being stopped is checked (a stop is bounded by the grace period).
STOP_POLL_S = 0.05
#: What the fork server imports before it forks: the agent and what an agent of
#: each job type imports on its way to hello (``agents.boot`` imports
#: the inference and shell sides on first use), and the ``local`` runtime's model
#: server, which an inference agent forks from itself (agents/inference/_launcher.py).
FORK_PRELOAD = ("agents.boot", "agents.inference._workload", "agents.inference.server",
                "agents.instance._server", "agents.instance._access",
                "agents.instance._malloc",
                # Imported on first use on the way to ready (the health probe's
                # HTTP transport, IDNA for names, the model server's demo engine
                # and HTTP server).
                "httpcore", "encodings.idna", "agents.inference.engines._demo",
                "p2p.httpserver")
#: The module (and its arguments, ``--config FILE`` appended) a forked agent runs:
#: the default agent command's agent without the CLI around it (typer's dispatch
#: cost 15 to 50 ms of each start): ``python -m agents.boot --config FILE``.
FORK_MODULE: str = "agents.boot"
FORK_ARGV: tuple[str, ...] = ()
#: Called with the arguments (not the module run again as ``__main__``).
FORK_FUNCTION: str | None = "command_line"
#: How long a start waits for a fork server still importing (it is no slower
#: than a spawn, which imports as much); then it spawns.
FORK_READY_WAIT_S = 10.0
_DISK = re.compile(r"^[a-z0-9][a-z0-9\-]{0,252}$")


class LocalNode(BaseModel):
    """One simulated node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9][a-z0-9.\-]*$")
    gpus: int = Field(ge=0, le=1024)


class LocalClusterSettings(BaseModel):
    """The simulated cluster (the worker's settings nest it, e.g. ``local__nodes``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: tuple[LocalNode, ...] = Field(
        default=(LocalNode(name="local-node-1", gpus=8), LocalNode(name="local-node-2", gpus=8)),
        min_length=1, max_length=256)
    #: Reported as configured, so multi-node replicas can be placed and their
    #: paths exercised: a simulated GPU cluster is a fully equipped one.
    overlay_network: bool = True
    infiniband: bool = True
    #: SIGTERM, then SIGKILL after this long (KubeVirt's default grace is 30 s;
    #: an agent stops in well under a second).
    stop_grace_s: float = Field(default=5.0, gt=0, le=300)
    #: How often an adopted process (not our child) is checked for life, where
    #: the kernel offers no pidfd to wait on.
    poll_interval_s: float = Field(default=0.5, gt=0, le=60)
    #: Run each agent (and so its shells) as a user of its own: ``auto`` when
    #: the worker can (root, and the agent reachable by another user), with a
    #: WARNING when it cannot; ``require``: refuse to start when it cannot;
    #: ``off``: as the worker's user (see the module doc).
    isolation: Literal["auto", "require", "off"] = "auto"
    #: An account every agent runs as, instead of a uid per VMI (weaker: the
    #: VMIs share it). Unset: a uid per VMI from the range below.
    agent_user: str | None = Field(default=None, min_length=1, max_length=32)
    #: The first uid (and gid) given to VMIs; no account may use the range.
    agent_uid_base: int = Field(default=1_900_000_000, ge=1000, le=2**31 - 2**20)
    #: How many uids the range holds (the most VMIs one worker may have).
    agent_uid_count: int = Field(default=65_536, ge=1, le=2**20)
    #: Where each agent's own folder is made (``<agents_dir>/<disk>``); unset:
    #: inside the worker's VMI folder. Every folder above it must be traversable
    #: by others (o+x) for isolation: keep it out of the daemons' storage.
    agents_dir: Path | None = None
    #: The Python the agents run on (with the default agent command): an
    #: interpreter of the worker's major.minor, given CosmicAC's code and the
    #: worker's site-packages on PYTHONPATH. Unset: the worker's own, or, when no
    #: other user can run that one (a Python under ``/root``), the first of
    #: ``/usr/local/bin/pythonX.Y`` and ``/usr/bin/pythonX.Y`` that works.
    agent_python: Path | None = None
    #: Run every agent inside this network namespace (``ip netns add NAME``), as
    #: VMs on a cluster network of their own: they reach the worker, and the
    #: platform reaches them, as the network between allows (through the relays
    #: when it allows nothing else). Needs the worker to run as root
    #: (``nsenter`` enters the namespace, then drops to the agent's user).
    agent_netns: str | None = Field(default=None, min_length=1, max_length=64,
                                    pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    #: Where model masters' hub token Secrets are, as ``<name>/token`` files
    #: (the layout of a mounted Kubernetes Secret). Unset: ``secrets/`` in the
    #: worker's storage. Each agent gets a copy of its token in its own folder.
    secrets_dir: Path | None = None
    #: A folder every inference agent's model server keeps downloaded weights
    #: in (``HF_HOME``), shared by all of them (made 1777, like /tmp: the
    #: agents of different teams run as different users). Unset: each agent's
    #: runtime downloads to its own default place.
    model_cache_dir: Path | None = None
    #: Start agents from a fork server (``runtime/forkserver/``): a process started
    #: with the backend that has imported the agent once, so an agent starts in
    #: milliseconds rather than a second of imports. Only with the default agent
    #: command and no ``agent_netns``; when the fork server cannot start or dies,
    #: agents are spawned as before (a WARNING says so).
    fork_server: bool = True

    @model_validator(mode="after")
    def _unique(self) -> LocalClusterSettings:
        names = [node.name for node in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        return self


@dataclass(frozen=True)
class _Isolation:
    """Who the agents run as: a uid per VMI from a range, or one account."""

    uid_base: int
    uid_count: int
    #: (uid, gid) of ``agent_user``; None: a uid per VMI.
    shared: tuple[int, int] | None = None

    def owns(self, uid: int) -> bool:
        """Is ``uid`` one this backend gives agents?"""
        if self.shared is not None:
            return uid == self.shared[0]
        return self.uid_base <= uid < self.uid_base + self.uid_count


#: The worker's environment variables an isolated agent keeps (no secrets, no
#: daemon settings): the rest of its environment is its own.
_ENV_KEEP = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "SHELL"})
_ENV_KEEP_PREFIXES = ("LC_", "PYTHON")


def _agent_environment(base: Mapping[str, str], home: Path, uid: int) -> dict[str, str]:
    env = {name: value for name, value in base.items()
           if name in _ENV_KEEP or name.startswith(_ENV_KEEP_PREFIXES)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=str(home), USER=f"cac-{uid}", LOGNAME=f"cac-{uid}")
    return env


#: CosmicAC's own packages: where they are goes on an agent interpreter's PYTHONPATH.
_OWN_PACKAGES = ("cli", "agents", "nodes", "contracts", "p2p", "crdt", "relay", "runtime")
#: How long a candidate agent interpreter may take to start and import the agent.
PROBE_TIMEOUT_S = 30.0
#: What a candidate agent interpreter runs: its version, then the agent's imports
#: (compiled extension modules of the worker's site-packages among them).
_PROBE = ("import sys; print('%d.%d' % sys.version_info[:2], flush=True); "
          "import cli.main, agents.boot")
#: The worker's PYTHON* variables an agent on another interpreter does not get:
#: they name the worker's interpreter and its places.
_ENV_DROP_FOR_OTHER_PYTHON = ("PYTHONHOME", "PYTHONPATH", "PYTHONEXECUTABLE",
                              "PYTHONUSERBASE", "PYTHONSTARTUP")


@dataclass(frozen=True)
class _AgentPython:
    """An interpreter other than the worker's that runs the agents, and the
    environment it needs to find what the worker's finds."""

    python: str
    #: CosmicAC's code roots, then the worker's site-packages.
    path: tuple[Path, ...]

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` for this interpreter: its PYTHONPATH, no bytecode written (the
        agent cannot write in the code's folders), the user's site not added."""
        out = {name: value for name, value in env.items()
               if name not in _ENV_DROP_FOR_OTHER_PYTHON}
        out.update(PYTHONPATH=os.pathsep.join(map(str, self.path)),
                   PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1")
        return out


def _import_roots() -> tuple[Path, ...]:
    """Where the worker's interpreter finds CosmicAC's packages (an editable install:
    the checkout) and the installed ones (its site-packages), without duplicates."""
    roots: list[Path] = []
    for name in _OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(Path(location).parent for location in spec.submodule_search_locations)
    paths = sysconfig.get_paths()
    roots += [Path(paths["purelib"]), Path(paths["platlib"])]
    unique: list[Path] = []
    for root in roots:
        real = Path(os.path.realpath(root))
        if real.is_dir() and real not in unique:
            unique.append(real)
    return tuple(unique)


def _python_candidates() -> list[str]:
    """Other interpreters of the worker's major.minor, where systems put them."""
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return [f"/usr/local/bin/{name}", f"/usr/bin/{name}"]


def _probe_python(python: str, roots: tuple[Path, ...],
                  as_user: tuple[int, int] | None) -> tuple[_AgentPython | None, str]:
    """Can ``python`` run the agent as ``as_user`` (None: as ourselves)? The
    interpreter (or None) and why not. Blocking: starts it once, bounded.

    Checks the way there first (others may run it, pass every folder to the code and
    site-packages), then asks it its version and makes it import the agent, as that
    user: its stdlib, the code and the compiled extension modules must all load."""
    found = shutil.which(python) or python
    if as_user is not None:
        why = _unreachable(Path(found), execute=True)
        for root in roots:
            why = why or _unreachable(root)
        if why is not None:
            return None, why
    candidate = _AgentPython(found, roots)
    env = candidate.environment({"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                 "LANG": "C.UTF-8"})
    user = ({"user": as_user[0], "group": as_user[1], "extra_groups": [], "umask": 0o077}
            if as_user is not None else {})
    try:
        done = subprocess.run([found, "-c", _PROBE], stdin=subprocess.DEVNULL,
                              capture_output=True, env=env, cwd="/", timeout=PROBE_TIMEOUT_S,
                              check=False, **user)
    except subprocess.TimeoutExpired:
        return None, f"{found} did not answer within {PROBE_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return None, f"{found}: {exc.strerror or exc}"
    lines = done.stdout.decode(errors="replace").splitlines()
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not lines or lines[0] != want:
        said = lines[0] if lines else _tail(done.stderr)
        return None, f"{found} is not Python {want} ({said})"
    if done.returncode != 0:
        return None, f"{found} cannot import the agent: {_tail(done.stderr)}"
    return candidate, ""


def _tail(stderr: bytes) -> str:
    """The last line of a probe's stderr (its exception), bounded."""
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1][:300] if lines else "no output"


def _unreachable(path: Path, *, execute: bool = False) -> str | None:
    """Why another (unprivileged, group-less) user cannot reach ``path``, or None.

    Every folder on the way must be o+x (ACLs are not read); ``execute``: the file
    itself must be o+x too, through its symlinks."""
    path = Path(os.path.realpath(path))
    for folder in (*reversed(path.parents), path) if not execute else reversed(path.parents):
        try:
            mode = folder.stat().st_mode
        except OSError as exc:
            return f"{folder}: {exc.strerror}"
        if not mode & stat.S_IXOTH:
            return f"{folder} is {stat.filemode(mode)}: others cannot pass it"
    if execute:
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            return f"{path}: {exc.strerror}"
        if not mode & stat.S_IXOTH or not mode & stat.S_IROTH:
            return f"{path} is {stat.filemode(mode)}: others cannot run it"
    return None


def _proc_uid(pid: int) -> int | None:
    """The real uid of ``pid``, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/status", "rb") as file:
            for line in file:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _processes_of(uid: int) -> list[int]:
    """Live processes whose real uid is ``uid`` (one pass over /proc)."""
    try:
        entries = [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return []
    return [pid for pid in entries if _proc_uid(pid) == uid]


@dataclass
class _Vmi:
    """What the backend knows of one VMI it runs (or ran)."""

    spec: VmiSpec
    folder: Path
    pid: int | None = None
    start_ticks: int | None = None
    #: Our child (trio reaps it), or the fork server's (it reports the status).
    #: None when adopted.
    process: trio.Process | ForkedProcess | None = None
    #: Set once the process is seen gone.
    exited: trio.Event = field(default_factory=trio.Event)
    #: Its exit status, when known (a child's).
    returncode: int | None = None
    #: We are stopping it: its exit is not reported as a failure.
    stopping: bool = False
    #: The last phase reported (said again when a create finds it).
    phase: VmiPhase = VmiPhase.RUNNING
    message: str = ""


# -- /proc ---------------------------------------------------------------------------------


def _find_by_cmdline(argument: str, uids: frozenset[int] | None = None) -> int | None:
    """A live process with ``argument`` in its command line (one pass over /proc),
    run by one of ``uids`` (None: anyone)."""
    try:
        entries = [entry.name for entry in os.scandir("/proc") if entry.name.isdigit()]
    except OSError:
        return None
    for name in entries:
        pid = int(name)
        if argument in cmdline(pid) and is_alive(pid, None) and (
                uids is None or _proc_uid(pid) in uids):
            return pid
    return None


def _write_atomically(path: Path, text: str, mode: int = 0o600) -> None:
    write_atomically(path, text.encode(), mode=mode)


#: The agent's copy of its hub token, in its own folder.
_HUB_TOKEN_FILE = "hub-token"


def _remove_at(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _write_private(dir_fd: int, name: str, data: bytes, owner: tuple[int, int] | None) -> None:
    """``name`` in ``dir_fd`` (a folder the agent owns) holding ``data``, 0600 and the
    agent's: created anew (``O_EXCL``, no link followed) and renamed into place."""
    temporary = f".{name}.{secrets.token_hex(8)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                 dir_fd=dir_fd)
    try:
        _own(fd, owner, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


class LocalBackend:
    """Runs VMIs as local agent processes on a simulated cluster (see the module doc).

    Args:
        settings: the simulated nodes and timings.
        state_dir: where the VMIs' folders live (kept across worker restarts).
        agent_command: the agent's command line without ``--config FILE``.
        env: the agents' environment (default: the worker's).
        secrets_dir: where hub token Secrets are when the settings do not say.

    Start :meth:`run` first; create, restart and delete need it running, as
    their processes are watched in its nursery.
    """

    name = "local"

    def __init__(self, settings: LocalClusterSettings, state_dir: Path,
                 agent_command: Sequence[str] = DEFAULT_AGENT_COMMAND, *,
                 env: Mapping[str, str] | None = None,
                 secrets_dir: Path | None = None) -> None:
        self.settings = settings
        self.state_dir = Path(state_dir)
        #: Hub token Secrets (``<name>/token``): the setting, else the worker's
        #: ``secrets/`` (``secrets_dir``), else beside ``state_dir``.
        self.secrets_dir = Path(settings.secrets_dir or secrets_dir
                                or self.state_dir.parent / "secrets")
        self.agent_command = tuple(agent_command)
        self.env = dict(env) if env is not None else None
        self._nodes = {node.name: node for node in self.settings.nodes}
        #: Bounded by the VMIs the worker asked for; a delete removes its entry.
        self._vmis: dict[str, _Vmi] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._to_adopt: list[VmiSpec] = []
        self._events: trio.MemorySendChannel[VmiEvent] | None = None
        self._nursery: trio.Nursery | None = None
        self._isolation: _Isolation | None = None
        #: The agents run as users of their own (decided when :meth:`run` starts).
        self.isolated = False
        #: Why they do not, when they do not (None when isolated or not started).
        self.isolation_problem: str | None = None
        #: Another interpreter the agents run on (``local.agent_python``, or one
        #: found because no other user can run the worker's); None: the command as given.
        self._python: _AgentPython | None = None
        #: Why no other interpreter would do, when one was looked for.
        self._python_tried: list[str] = []
        #: The fork server agents start from (None: spawned, see ``fork_server``).
        self.fork_server: ForkServer | None = None
        self._fork_fallback_said = False

    # -- the Backend interface -----------------------------------------------------------

    async def run(self, events: trio.MemorySendChannel[VmiEvent], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch the agent processes; send a :class:`VmiEvent` per change. Until cancelled.

        Leaving does not stop the processes (see :meth:`stop_all`).
        """
        self._events = events
        await trio.to_thread.run_sync(self._decide_isolation)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._start_fork_server(nursery)
                for record in self._vmis.values():  # run() again on this object
                    if not record.exited.is_set():
                        nursery.start_soon(self._watch_child if record.process is not None
                                           else self._watch_adopted, record)
                await self._adopt_pending()
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._events = None
            self.fork_server = None

    def adopt(self, units: Sequence[ReplicaUnit]) -> None:
        """These replicas exist (or should): watch their live processes again, report
        dead ones FAILED and missing ones GONE (at once if running, else when :meth:`run`
        starts)."""
        self._to_adopt.extend(vmi for unit in units for vmi in unit.vmis)
        if self._nursery is not None:
            self._nursery.start_soon(self._adopt_pending)

    async def capacity(self) -> RackReport:
        return RackReport(
            nodes=tuple(NodeInfo(name=node.name, gpus=node.gpus, gpu_resource=None,
                                 infiniband=self.settings.infiniband)
                        for node in self.settings.nodes),
            overlay_network=self.settings.overlay_network)

    async def create(self, unit: ReplicaUnit) -> None:
        """Start the replica's agent processes; a VMI that exists (running, or ended and
        not deleted, as a Failed VMI object stays) is kept, and its phase said again."""
        self._running()
        refuse_isolated_network(unit, "local")
        for vmi in unit.vmis:
            self._check(vmi)
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                record = self._vmis.get(vmi.name) or self._find_live(vmi)
                if record is None:
                    await self._start(vmi)
                    continue
                await self._send(vmi.name, record.phase, record.message, record)

    async def restart(self, unit: ReplicaUnit) -> None:
        """Stop every VMI of the replica, then start them with ``unit``'s configs; the
        folders (disks, agent identity) are kept."""
        self._running()
        for vmi in unit.vmis:
            self._check(vmi)
        for vmi in unit.vmis:  # all gone first, as KubeVirt's delete-then-create
            async with self._lock(vmi.name):
                record = self._vmis.pop(vmi.name, None) or self._find_live(vmi)
                if record is not None:
                    await self._stop(record)
                    await self._send(vmi.name, VmiPhase.GONE,
                                     "stopped for restart (disk kept)", record)
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                await self._start(vmi)

    async def delete(self, unit: ReplicaUnit) -> None:
        """Stop the replica's processes and remove their folders; gone ones are fine."""
        self._running()
        for vmi in unit.vmis:
            async with self._lock(vmi.name):
                record = self._vmis.pop(vmi.name, None) or self._find_live(vmi)
                if record is not None:
                    await self._stop(record)
                    self._vmis.pop(vmi.name, None)  # _find_live() recorded it
                folder = self._folder(vmi)
                await trio.to_thread.run_sync(shutil.rmtree, self._home(folder), True)
                await trio.to_thread.run_sync(shutil.rmtree, folder, True)
                await self._send(vmi.name, VmiPhase.GONE, "agent stopped, disk removed", record)
            self._locks.pop(vmi.name, None)

    # -- beyond the interface ------------------------------------------------------------

    async def stop_all(self) -> int:
        """Stop every agent process of ``state_dir`` (known or found in the folders);
        folders are kept. For ``cosmicac up``'s shutdown and tests. Returns how many."""
        records = list(self._vmis.values())
        known = {record.folder for record in records}
        if self.state_dir.is_dir():
            for folder in sorted(self.state_dir.iterdir()):
                if folder not in known and (found := self._record_in(folder)) is not None:
                    records.append(found)
        stopped = 0
        for record in records:
            if not record.exited.is_set() and record.pid is not None:
                await self._stop(record)
                stopped += 1
        return stopped

    def pid(self, name: str) -> int | None:
        """The pid of VMI ``name``'s agent while it runs, else None."""
        record = self._vmis.get(name)
        if record is None or record.exited.is_set():
            return None
        return record.pid

    def folder(self, vmi: VmiSpec) -> Path:
        """VMI ``vmi``'s folder, the worker's (its log and process record)."""
        return self._folder(vmi)

    def agent_folder(self, vmi: VmiSpec) -> Path:
        """VMI ``vmi``'s agent's own folder (its "disk": config and storage)."""
        return self._home(self._folder(vmi))

    # -- the fork server ------------------------------------------------------------------

    async def _start_fork_server(self, nursery: trio.Nursery) -> None:
        """Start the fork server when the settings and the agent command allow it
        (see ``fork_server``); agents are spawned until it is ready."""
        if (not self.settings.fork_server or self.agent_command != DEFAULT_AGENT_COMMAND
                or self.settings.agent_netns is not None):
            return
        # What an interpreter reads as it starts (PYTHON*, locale, PATH): the agents'
        # own, none of the worker's secrets. Each agent's full environment comes
        # with its request.
        base = self.env if self.env is not None else os.environ
        env = {name: value for name, value in base.items()
               if name in _ENV_KEEP or name.startswith(_ENV_KEEP_PREFIXES)}
        python = sys.executable
        if self._python is not None:
            python = self._python.python
            env = self._python.environment(env)
        server = ForkServer(python, FORK_PRELOAD, env,
                            poll_interval_s=self.settings.poll_interval_s)
        await nursery.start(self._run_fork_server, server)
        self.fork_server = server

    async def _run_fork_server(self, server: ForkServer, *,
                               task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                               ) -> None:
        await server.run(task_status=task_status)
        # Returned, not cancelled: the zygote ended (or never started). Said now,
        # not at the next start; agents it forked are still watched (by pid).
        if not self._fork_fallback_said:
            self._fork_fallback_said = True
            log.warning("local.fork_server_unusable reason=%r: agents are spawned from now "
                        "on (each imports the agent itself, about a second)", server.problem)

    async def _fork(self, config_path: Path, *, log_fd: int, env: Mapping[str, str] | None,
                    cwd: str | None, owner: tuple[int, int] | None
                    ) -> ForkedProcess | None:
        """The agent forked from the fork server; None when there is none to use (then
        the caller spawns it, and the first time a WARNING says why)."""
        server = self.fork_server
        if server is None:
            return None
        try:
            if not await server.wait_ready(FORK_READY_WAIT_S):
                raise ForkServerError(server.problem or "the fork server is not ready "
                                      f"after {FORK_READY_WAIT_S:g} s")
            return await server.spawn(
                FORK_MODULE, [*FORK_ARGV, "--config", str(config_path)], fds=[log_fd],
                function=FORK_FUNCTION,
                env=dict(os.environ if env is None else env), cwd=cwd, user=owner,
                umask=0o077 if owner is not None else None)
        except ForkServerError as exc:
            if not self._fork_fallback_said:
                self._fork_fallback_said = True
                log.warning("local.fork_server_unusable reason=%r: agents are spawned "
                            "(each imports the agent itself, about a second)", str(exc))
            return None

    # -- isolation -----------------------------------------------------------------------

    def _decide_isolation(self) -> None:
        """Isolate the agents if the settings ask for it and the host allows it; say
        loudly when not (see the module doc). Blocking (a thread)."""
        netns = self.settings.agent_netns
        if netns is not None:
            if os.geteuid() != 0:
                raise BackendError(f"local.agent_netns={netns} needs the worker to run as "
                                   "root (it enters the namespace for each agent)",
                                   retryable=False)
            if not (NETNS_DIR / netns).exists() or shutil.which("nsenter") is None:
                raise BackendError(f"local.agent_netns: no network namespace {netns} "
                                   f"(ip netns add {netns}), or no nsenter (util-linux)",
                                   retryable=False)
        mode = self.settings.isolation
        self._choose_python(isolating=mode != "off" and os.geteuid() == 0)
        problem = ("local.isolation is off" if mode == "off"
                   else self._isolation_problem())
        self.isolated = problem is None
        self.isolation_problem = problem
        if problem is None:
            iso = self._isolation
            assert iso is not None
            who = (f"user {self.settings.agent_user} (uid {iso.shared[0]})" if iso.shared
                   else f"a uid of its own ({iso.uid_base}+)")
            log.info("local.isolated agents run as %s in %s", who, self._agents_root())
            return
        self._isolation = None
        if mode == "require":
            raise BackendError(f"cannot run the agents as users of their own: {problem} "
                               "(local.isolation is require)", retryable=False)
        log.warning("local.not_isolated reason=%r: every agent, and every shell of a "
                    "container job, runs as the worker's own user (uid %d) and can read "
                    "what it can, every daemon's storage included. Fine for one person "
                    "trying CosmicAC; on a shared host run the worker as root with "
                    "CosmicAC installed where other users can read it, and set "
                    "local.isolation=require", problem, os.geteuid())

    def _isolation_problem(self) -> str | None:
        """Why the agents cannot run as users of their own, or None (and then
        ``self._isolation`` is set, the agents' root folder made)."""
        settings = self.settings
        if os.geteuid() != 0:
            return "the worker does not run as root, so it cannot start agents as another user"
        shared = None
        if settings.agent_user is not None:
            try:
                account = pwd.getpwnam(settings.agent_user)
            except KeyError:
                return f"no account {settings.agent_user!r} (local.agent_user)"
            if account.pw_uid == 0 or account.pw_gid == 0:
                return f"local.agent_user {settings.agent_user!r} is root"
            shared = (account.pw_uid, account.pw_gid)
        why = None if self._python is not None else self._program_problem()
        if why is not None:
            tried = (f"; no other Python {sys.version_info.major}.{sys.version_info.minor} "
                     f"can run it either ({'; '.join(self._python_tried)}; or set "
                     "local.agent_python)" if self._python_tried else "")
            return f"the agent's program is not reachable by another user: {why}{tried}"
        root = self._agents_root()
        try:
            root.mkdir(parents=True, exist_ok=True)
            os.chmod(root, 0o711)  # ours: others may pass, not list
        except OSError as exc:
            return f"cannot prepare {root}: {exc.strerror or exc}"
        why = _unreachable(root)
        if why is not None:
            return (f"the agents' folders are not reachable by another user: {why} (set "
                    "local.agents_dir outside the daemons' storage)")
        self._isolation = _Isolation(settings.agent_uid_base, settings.agent_uid_count, shared)
        return None

    def _program_problem(self) -> str | None:
        """Why another user cannot run the agent's command as given, or None."""
        command = shutil.which(self.agent_command[0]) or self.agent_command[0]
        why = _unreachable(Path(command), execute=True)
        if why is None and self.agent_command == DEFAULT_AGENT_COMMAND:
            # This very interpreter: its environment and CosmicAC's code too.
            for path in (Path(sys.prefix), *_import_roots()):
                why = why or _unreachable(path)
        return why

    def _choose_python(self, *, isolating: bool) -> None:
        """With the default agent command: run the agents on ``local.agent_python``,
        or, when isolating and no other user can run the worker's interpreter (a
        Python under ``/root``), on a system one of the same major.minor that can
        (see :func:`_probe_python`). Logs the choice. Blocking.

        Raises:
            BackendError: ``local.agent_python`` cannot run the agent.
        """
        self._python = None
        self._python_tried = []
        if self.agent_command != DEFAULT_AGENT_COMMAND:
            return
        explicit = self.settings.agent_python
        if explicit is None and not isolating:
            return
        why = None if explicit is not None else self._program_problem()
        if explicit is None and why is None:
            return  # the worker's own interpreter will do
        as_user = self._probe_user() if isolating else None
        roots = _import_roots()
        if explicit is not None:
            chosen, problem = _probe_python(str(explicit), roots, as_user)
            if chosen is None:
                raise BackendError(f"local.agent_python cannot run the agent: {problem}",
                                   retryable=False)
            reason = "local.agent_python"
        else:
            problems = []
            for candidate in _python_candidates():
                if not os.path.exists(candidate):
                    continue
                chosen, problem = _probe_python(candidate, roots, as_user)
                if chosen is not None:
                    break
                problems.append(problem)
            else:
                self._python_tried = problems or [
                    f"none of {', '.join(_python_candidates())} exists"]
                return
            reason = f"the worker's own is not reachable by another user: {why}"
        self._python = chosen
        log.info("local.agent_python python=%s pythonpath=%s reason=%r", chosen.python,
                 os.pathsep.join(map(str, chosen.path)), reason)

    def _probe_user(self) -> tuple[int, int]:
        """Who tries a candidate interpreter: ``local.agent_user``, or the last uid of
        the agents' range (no account, no groups: as an agent runs)."""
        if self.settings.agent_user is not None:
            try:
                account = pwd.getpwnam(self.settings.agent_user)
                return account.pw_uid, account.pw_gid
            except KeyError:
                pass  # said by the isolation check
        uid = self.settings.agent_uid_base + self.settings.agent_uid_count - 1
        return uid, uid

    @property
    def agent_python(self) -> str | None:
        """The interpreter the agents run on when it is not the command's own."""
        return self._python.python if self._python is not None else None

    def _agents_root(self) -> Path:
        """The folder the agents' own folders are in (or under)."""
        return self.settings.agents_dir or self.state_dir

    def _home(self, folder: Path) -> Path:
        """The agent's own folder of the VMI whose worker folder is ``folder``."""
        if self.settings.agents_dir is not None:
            return self.settings.agents_dir / folder.name
        return folder / "agent"

    def _owner(self, home: Path) -> tuple[int, int] | None:
        """Who the agent of ``home`` runs as: the folder's owner if it is one of ours
        (the VMI ran before), else a uid no other VMI folder has and no process runs
        as; None when not isolated."""
        iso = self._isolation
        if iso is None:
            return None
        if iso.shared is not None:
            return iso.shared
        try:
            uid = os.stat(home, follow_symlinks=False).st_uid
            if iso.owns(uid):
                return uid, uid
        except FileNotFoundError:
            pass
        used = set()
        if self.state_dir.is_dir():
            for folder in self.state_dir.iterdir():
                try:
                    used.add(os.stat(self._home(folder), follow_symlinks=False).st_uid)
                except OSError:
                    continue
        start = secrets.randbelow(iso.uid_count)
        for step in range(iso.uid_count):
            uid = iso.uid_base + (start + step) % iso.uid_count
            if uid not in used and not _processes_of(uid):
                return uid, uid
        raise BackendError(f"no free agent uid left in {iso.uid_base}+{iso.uid_count}")

    def _prepare(self, vmi: VmiSpec, folder: Path, home: Path) -> tuple[int, int] | None:
        """Make the VMI's folders and write its agent's config; returns the agent's
        (uid, gid), None when not isolated. Blocking.

        The agent owns ``home``, so nothing in it is trusted: its folder and storage
        are opened without following links and changed through their descriptors,
        and the config is created anew (``O_EXCL``) and renamed into place."""
        owner = self._owner(home)
        folder.mkdir(parents=True, exist_ok=True)
        inside = home.parent == folder and owner is not None  # the agent passes through
        os.chmod(self.state_dir, 0o711 if inside else 0o700)
        os.chmod(folder, 0o711 if inside else 0o700)
        if home.parent != folder:
            home.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(home.parent, 0o711 if owner else 0o700)
        legacy = folder / "storage"  # older workers kept the agent's storage here
        if legacy.is_dir() and not legacy.is_symlink() and not home.exists():
            home.mkdir(mode=0o700)
            shutil.move(legacy, home / "storage")
            (folder / "agent.json").unlink(missing_ok=True)  # the old config, its token
        try:
            home.mkdir(mode=0o700)
        except FileExistsError:
            pass
        home_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if owner is not None and os.fstat(home_fd).st_uid != owner[0]:
                # Made by a worker that did not isolate (or as another user): the
                # agent's identity and state become the agent's. Nothing of that
                # owner runs now (stopped, or never started), so nothing moves.
                _chown_tree(home, *owner)
            _own(home_fd, owner, 0o700)
            try:
                os.mkdir("storage", 0o700, dir_fd=home_fd)
            except FileExistsError:
                pass
            storage_fd = os.open("storage", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                 dir_fd=home_fd)
            try:
                _own(storage_fd, owner, 0o700)
            finally:
                os.close(storage_fd)
            update: dict[str, str] = {"storage": str(home / "storage")}
            if vmi.hub_token_secret is not None:
                # The agent's own copy, as a VM gets the Secret's disk: an isolated
                # agent cannot read the worker's folder, and a later change of the
                # Secret reaches the next start, not a running model server.
                update["hub_token_file"] = str(home / _HUB_TOKEN_FILE)
                token = read_hub_token(self.secrets_dir, vmi, log, "local")
                if token is None:
                    _remove_at(home_fd, _HUB_TOKEN_FILE)  # no stale token outlives its Secret
                else:
                    _write_private(home_fd, _HUB_TOKEN_FILE, token, owner)
            cache = self.settings.model_cache_dir
            if cache is not None and vmi.agent.job_type is JobType.INFERENCE:
                cache.mkdir(parents=True, exist_ok=True)
                os.chmod(cache, 0o1777)
                update["model_cache_dir"] = str(cache)
            config = vmi.agent.model_copy(update=update)
            _write_private(home_fd, "agent.json", config.to_json().encode(), owner)
        finally:
            os.close(home_fd)
        return owner

    def _sweep(self, record: _Vmi) -> None:
        """Kill what is left running as the VMI's own uid (a shell in a session of its
        own); nothing when the VMIs share a user or are not isolated."""
        settings = self.settings
        if settings.agent_user is not None:
            return
        try:
            uid = os.stat(self._home(record.folder), follow_symlinks=False).st_uid
        except OSError:
            return
        if not _Isolation(settings.agent_uid_base, settings.agent_uid_count).owns(uid):
            return
        for pid in _processes_of(uid):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
            log.info("local.swept vmi=%s pid=%d uid=%d", record.spec.name, pid, uid)

    # -- starting ------------------------------------------------------------------------

    def _running(self) -> trio.Nursery:
        if self._nursery is None:
            raise BackendError("the local backend is not running (start LocalBackend.run)")
        return self._nursery

    def _lock(self, name: str) -> trio.Lock:
        return self._locks.setdefault(name, trio.Lock())

    def _check(self, vmi: VmiSpec) -> None:
        node = self._nodes.get(vmi.node)
        if node is None:
            raise BackendError(f"{vmi.name}: no node {vmi.node!r} in the local cluster "
                               f"({', '.join(self._nodes)})", retryable=False)
        if vmi.gpus > node.gpus:
            raise BackendError(f"{vmi.name}: {vmi.gpus} GPUs asked, node {node.name} has "
                               f"{node.gpus}", retryable=False)
        if not _DISK.match(vmi.disk):
            raise BackendError(f"{vmi.name}: disk name {vmi.disk!r} is not a folder name",
                               retryable=False)

    def _folder(self, vmi: VmiSpec) -> Path:
        return self.state_dir / vmi.disk

    async def _start(self, vmi: VmiSpec) -> None:
        nursery = self._running()
        folder = self._folder(vmi)
        home = self._home(folder)
        config_path = home / "agent.json"
        try:
            owner = await trio.to_thread.run_sync(self._prepare, vmi, folder, home)
        except OSError as exc:
            raise BackendError(f"{vmi.name}: cannot prepare {folder}: "
                               f"{exc.strerror or exc}") from None
        await self._send(vmi.name, VmiPhase.PROVISIONING, f"storage folder {home} ready")
        await self._send(vmi.name, VmiPhase.BOOTING, f"starting the agent on {vmi.node}")
        try:
            log_fd = os.open(folder / "agent.log",
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise BackendError(f"{vmi.name}: cannot open its log: {exc.strerror}") from None
        env = self.env
        as_user: dict = {}
        if owner is not None:
            uid, gid = owner
            env = ({**env, "HOME": str(home), "USER": f"cac-{uid}", "LOGNAME": f"cac-{uid}"}
                   if env is not None else _agent_environment(os.environ, home, uid))
            as_user = {"user": uid, "group": gid, "extra_groups": [], "umask": 0o077,
                       "cwd": str(home)}
        command = list(self.agent_command)
        if self._python is not None:
            # Its model server, started with sys.executable, runs on it too.
            command[0] = self._python.python
            env = self._python.environment(os.environ if env is None else env)
        netns = self.settings.agent_netns
        if netns is not None:
            # nsenter (as root) enters the namespace, then becomes the agent's
            # user and execs the agent: the pid we watch is the agent's own.
            drop = ["--setuid", str(owner[0]), "--setgid", str(owner[1])] if owner else []
            command = [shutil.which("nsenter") or "nsenter", f"--net={NETNS_DIR / netns}",
                       *drop, "--", *command]
            as_user = {key: value for key, value in as_user.items()
                       if key not in ("user", "group")}
        try:
            process: trio.Process | ForkedProcess | None = None
            if netns is None and self.agent_command == DEFAULT_AGENT_COMMAND:
                process = await self._fork(config_path, log_fd=log_fd, env=env,
                                           cwd=as_user.get("cwd"), owner=owner)
            how = "fork"
            if process is None:
                how = "spawn"
                process = await spawn(
                    [*command, "--config", str(config_path)],
                    stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                    env=env, **as_user)
        except OSError as exc:
            await self._send(vmi.name, VmiPhase.FAILED,
                             f"cannot start the agent: {exc.strerror or exc}")
            raise BackendError(f"{vmi.name}: cannot start {command[0]}: "
                               f"{exc.strerror or exc}", retryable=False) from None
        finally:
            os.close(log_fd)
        stat = proc_stat(process.pid)
        record = _Vmi(vmi, folder, process.pid, stat[1] if stat else None, process)
        self._vmis[vmi.name] = record
        _write_atomically(folder / "process.json", json.dumps({
            "pid": record.pid, "start_ticks": record.start_ticks, "vmi": vmi.name,
            "generation": vmi.agent.generation, "started_at": time.time(),
            "uid": owner[0] if owner else os.geteuid()}) + "\n")
        nursery.start_soon(self._watch_child, record)
        log.info("local.started vmi=%s pid=%d node=%s generation=%d via=%s", vmi.name,
                 record.pid, vmi.node, vmi.agent.generation, how)
        await self._send(vmi.name, VmiPhase.RUNNING,
                         f"agent process {record.pid} running on {vmi.node}", record)

    # -- watching ------------------------------------------------------------------------

    async def _watch_child(self, record: _Vmi) -> None:
        assert record.process is not None
        record.returncode = await record.process.wait()
        record.exited.set()
        if record.stopping:
            return
        await self._report_exit(record, describe_exit(record.returncode),
                                record.returncode == 0)

    async def _watch_adopted(self, record: _Vmi) -> None:
        assert record.pid is not None
        await wait_gone(record.pid, record.start_ticks, self.settings.poll_interval_s)
        record.exited.set()
        if not record.stopping:
            await self._report_exit(record, "ended (not a child of this worker: exit status "
                                    "unknown)", False)

    async def _report_exit(self, record: _Vmi, how: str, success: bool) -> None:
        name = record.spec.name
        last = last_line(record.folder / "agent.log")
        message = f"agent process {record.pid} {how}" + (f"; last output: {last}"
                                                         if last and not success else "")
        (log.info if success else log.warning)("local.exited vmi=%s pid=%s %s", name,
                                                record.pid, how)
        phase = VmiPhase.SUCCEEDED if success else VmiPhase.FAILED
        await self._send(name, phase, message, record)

    # -- stopping ------------------------------------------------------------------------

    async def _stop(self, record: _Vmi) -> None:
        """SIGTERM the agent's session, SIGKILL after the grace period; wait until gone.

        Raises:
            BackendError: still there ``KILL_WAIT_S`` after SIGKILL (retryable).
        """
        record.stopping = True
        if record.pid is None or record.exited.is_set():
            await trio.to_thread.run_sync(self._sweep, record)
            return
        for signum, wait_s in ((signal.SIGTERM, self.settings.stop_grace_s),
                               (signal.SIGKILL, KILL_WAIT_S)):
            if not self._still_running(record):
                break
            # The agent's whole session (it leads its group): what it started (a
            # model server) goes with it.
            signal_group(record.pid, signum)
            with trio.move_on_after(wait_s):
                while self._still_running(record):
                    with trio.move_on_after(STOP_POLL_S):
                        await record.exited.wait()
        if self._still_running(record):
            raise BackendError(f"{record.spec.name}: agent process {record.pid} survives "
                               "SIGKILL")
        if record.process is not None and record.process.returncode is None:
            # Dead but not reaped yet: the watcher (or this wait) reaps it.
            with trio.move_on_after(KILL_WAIT_S):
                await record.process.wait()
        await trio.to_thread.run_sync(self._sweep, record)
        log.info("local.stopped vmi=%s pid=%d", record.spec.name, record.pid)

    @staticmethod
    def _still_running(record: _Vmi) -> bool:
        if record.exited.is_set() or record.pid is None:
            return False
        if record.process is not None:
            return record.process.poll() is None and is_alive(record.pid, None)
        return is_alive(record.pid, record.start_ticks)

    # -- after a worker restart ----------------------------------------------------------

    def _record_in(self, folder: Path, spec: VmiSpec | None = None) -> _Vmi | None:
        """The live agent process recorded in ``folder``, if its pid, start time and
        command line still match (a reused pid is not ours)."""
        config_path = str(self._home(folder) / "agent.json")
        if not Path(config_path).exists() and (folder / "agent.json").exists():
            config_path = str(folder / "agent.json")  # started by an older worker
        try:
            doc = json.loads((folder / "process.json").read_text())
            pid, ticks = int(doc["pid"]), doc.get("start_ticks")
        except (OSError, ValueError, KeyError, TypeError):
            doc, pid, ticks = {}, None, None
        # Only the worker's user or the agent's own started it: anyone can put a
        # path in a command line (a shell of another job, to be "adopted").
        try:
            uids = frozenset({os.geteuid(), os.stat(self._home(folder)).st_uid})
        except OSError:
            uids = frozenset({os.geteuid()})
        if (pid is None or not is_alive(pid, ticks) or config_path not in cmdline(pid)
                or _proc_uid(pid) not in uids):
            # A worker killed between starting a process and recording it leaves
            # an agent no process.json names: find it by its command line, or a
            # second agent would be started on the same storage.
            pid = _find_by_cmdline(config_path, uids) if folder.is_dir() else None
            if pid is None:
                return None
            stat = proc_stat(pid)
            ticks = stat[1] if stat else None
        if spec is None:
            try:
                config = load_agent_config(Path(config_path))
            except AgentConfigError:
                return None
            spec = VmiSpec(name=str(doc.get("vmi", folder.name)), disk=folder.name,
                           node="", gpus=config.gpus, node_rank=config.node_rank, agent=config)
        return _Vmi(spec, folder, pid, ticks)

    def _find_live(self, vmi: VmiSpec) -> _Vmi | None:
        """A live process of ``vmi`` we do not know (started before a worker restart);
        watched from now on."""
        record = self._record_in(self._folder(vmi), vmi)
        if record is not None:
            record.message = f"agent process {record.pid} adopted"
            self._vmis[vmi.name] = record
            self._running().start_soon(self._watch_adopted, record)
        return record

    async def _adopt_pending(self) -> None:
        while self._to_adopt:
            vmi = self._to_adopt.pop(0)
            async with self._lock(vmi.name):
                if vmi.name in self._vmis:
                    continue
                record = self._find_live(vmi)
                folder = self._folder(vmi)
                if record is not None:
                    log.info("local.adopted vmi=%s pid=%d", vmi.name, record.pid)
                    await self._send(vmi.name, VmiPhase.RUNNING,
                                     f"agent process {record.pid} adopted", record)
                elif folder.is_dir():
                    dead = _Vmi(vmi, folder)
                    dead.exited.set()
                    self._vmis[vmi.name] = dead
                    await self._send(vmi.name, VmiPhase.FAILED,
                                     "agent process gone while the worker was away "
                                     "(exit status unknown)", dead)
                else:
                    await self._send(vmi.name, VmiPhase.GONE, "no such VMI (no folder)")

    # -- events --------------------------------------------------------------------------

    async def _send(self, name: str, phase: VmiPhase, message: str,
                    record: _Vmi | None = None) -> None:
        if self._events is None:
            return
        extra = {}
        node = None
        if record is not None:
            record.phase, record.message = phase, message
            node = record.spec.node or None
            extra["folder"] = str(record.folder)
            if record.pid is not None:
                extra["pid"] = str(record.pid)
        await self._events.send(VmiEvent(name, phase, message, node=node, extra=extra))


def _own(fd: int, owner: tuple[int, int] | None, mode: int) -> None:
    """Give the open file or folder ``fd`` to ``owner`` (None: leave it) with ``mode``."""
    if owner is not None:
        os.fchown(fd, *owner)
    os.fchmod(fd, mode)


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    """``top`` and everything in it to ``uid:gid``, links themselves, not their targets."""
    os.lchown(top, uid, gid)
    for folder, folders, files in os.walk(top):
        for name in (*folders, *files):
            os.lchown(os.path.join(folder, name), uid, gid)
