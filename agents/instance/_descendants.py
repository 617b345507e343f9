"""Who started which process: a shell session's background processes stay its key's.

A session's process may leave its process group and session (``setsid``, a
double fork, ``nohup … &``) and outlive the session. When its key then loses
access, hanging up the session's group does not reach it. So the agent keeps
every descendant under itself and remembers whose key started it:

* the agent is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), and so is each
  session's first process: an orphan is re-parented to its nearest subreaper
  ancestor, never to init, so nothing a session starts leaves the agent's tree;
* :meth:`Descendants.scan` (every half second, and before a revocation) walks
  the tree from every process it knows and gives each new one its parent's key;
  an orphan the agent adopted before a walk saw it is its session's key's when
  it never left its session (its session id is a first process's pid), else the
  key one of whose processes ended since the last scan, when exactly one
  key's did;
* :meth:`Descendants.signal` reaches a key's processes through pidfds checked
  against each process's start time, so a reused pid is never signalled.

Limits, said plainly (and in SECURITY.md): a process that left its session and
was orphaned between two scans in which two keys' processes ended is left
unattributed (counted and logged, and killed by nobody's revocation); and a
member who is root in the VM can leave the tree or plant something that starts
later (cron, a unit). Restarting the job is the remedy against someone not
trusted.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Descendants", "become_subreaper"]

logger = logging.getLogger("agents.instance.shell")

PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


def become_subreaper() -> bool:
    """Make this process adopt its descendants' orphans. False where Linux refuses."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def session_preexec() -> None:  # pragma: no cover - runs in the child
    """In a session's first process: adopt its own orphans (kept across exec)."""
    become_subreaper()


@dataclass(frozen=True, slots=True)
class _Stat:
    state: str
    ppid: int
    session: int
    start: int  # clock ticks after boot: with the pid, names one process


def _stat(pid: int) -> _Stat | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm, in parentheses, may hold spaces and parentheses: split after the last one.
    fields = text[text.rindex(")") + 2:].split()
    return _Stat(state=fields[0], ppid=int(fields[1]), session=int(fields[3]),
                 start=int(fields[19]))


def _children(pid: int) -> list[int]:
    """The live children of ``pid`` (every thread's), from /proc."""
    found: list[int] = []
    try:
        tasks = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return found
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError):
            found.extend(int(p) for p in (PROC / str(pid) / "task" / tid / "children")
                         .read_text().split())
    return found


@dataclass(slots=True)
class _Owned:
    key: bytes
    start: int
    #: Sent SIGKILL by a revocation: it lands a moment later (later still on a busy
    #: machine), and the next revocation pass must neither resend nor recount it.
    killed: bool = False


class Descendants:
    """The processes each key's sessions started, found under this process.

    Args:
        log: where adoptions nobody could be named for, and kills, are logged.
    """

    def __init__(self, *, log: logging.Logger = logger) -> None:
        self._log = log
        self._self = os.getpid()
        self._owned: dict[int, _Owned] = {}
        #: Session first processes: trio waits for (and reaps) them, never us.
        self._roots: set[int] = set()
        #: Every first process's key while any process of its session lives: a
        #: process that never left its session (session id = that pid) is its key's.
        self._sessions: dict[int, bytes] = {}
        #: First processes whose end was seen (by a scan, or told).
        self._roots_ended: set[int] = set()
        #: Keys one of whose processes ended since the last scan.
        self._ended: set[bytes] = set()
        self._unattributed: set[int] = set()
        #: Sessions being spawned (between the fork, done in a thread, and
        #: :meth:`started`): their first process is already our child, and a scan
        #: in between names it as an adopted orphan would be named.
        self._spawning = 0
        #: Processes named while a spawn ran: maybe that spawn's (not yet started())
        #: under another key's name. Never signalled until the spawns are done (seen:
        #: a new session's command named the key a revocation had just ended, and
        #: killed with it).
        self._uncertain: set[int] = set()
        #: Orphans adopted that no key could be named for (a figure).
        self.unattributed_total = 0
        #: Processes signalled because their key lost access (a figure).
        self.killed_total = 0

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """Around a session's spawn and its :meth:`started`: what a scan names in
        between is not signalled until no spawn runs."""
        self._spawning += 1
        try:
            yield
        finally:
            self._spawning -= 1
            if not self._spawning:
                self._uncertain.clear()

    def started(self, pid: int, key: bytes) -> None:
        """A session's first process runs: it and what it starts are ``key``'s
        (also what a scan named otherwise while it was being spawned)."""
        stat = _stat(pid)
        if stat is not None:
            self._owned[pid] = _Owned(key, stat.start)
            self._roots.add(pid)
            self._sessions[pid] = key
            self._roots_ended.discard(pid)
            for other, owned in self._owned.items():
                if owned.key != key and self._session_of(other) == pid:
                    owned.key = key  # named by a scan while this was being spawned

    def ended(self, pid: int) -> None:
        """A session's first process was reaped (by whoever spawned it)."""
        self._roots.discard(pid)
        owned = self._owned.pop(pid, None)
        if owned is not None and pid not in self._roots_ended:
            self._ended.add(owned.key)
        self._roots_ended.discard(pid)

    def owners(self) -> set[bytes]:
        """Keys that own a live process."""
        return {owned.key for owned in self._owned.values()}

    def pids(self, key: bytes) -> list[int]:
        return sorted(pid for pid, owned in self._owned.items() if owned.key == key)

    def scan(self) -> None:
        """Forget ended processes, name the new ones, reap adopted ones that ended."""
        for pid, owned in list(self._owned.items()):
            stat = _stat(pid)
            ended = stat is None or stat.start != owned.start or stat.state in "ZX"
            if not ended:
                continue
            if pid in self._roots:
                # Its spawner reaps it and calls ended(), maybe a while after its
                # orphans came to us: the window opens now.
                if pid not in self._roots_ended:
                    self._roots_ended.add(pid)
                    self._ended.add(owned.key)
                continue
            self._reap(pid, stat)
            del self._owned[pid]
            self._ended.add(owned.key)
        # Walk down from every process we know; a new one is its parent's key's.
        self._name_below(list(self._owned))
        # Orphans re-parented to us since the last scan, before a walk saw them.
        # Each came to us when its parent ended, and a scan sees an owned
        # process's end no later than it sees the orphans that end made: so the
        # keys whose processes ended since the last scan hold its owner.
        for child in _children(self._self):
            if child in self._owned:
                continue
            stat = _stat(child)
            if stat is None:
                continue
            if stat.state in "ZX":
                if child in self._unattributed:
                    self._reap(child, stat)
                    self._unattributed.discard(child)
                continue
            if child in self._unattributed:
                continue
            key = self._sessions.get(stat.session)  # it never left its session
            if key is None and len(self._ended) == 1:
                key = next(iter(self._ended))
            if key is not None:
                self._owned[child] = _Owned(key, stat.start)
                self._name_below([child])
                if self._spawning:
                    self._uncertain.add(child)
                    self._uncertain.update(p for p in self._owned if self._owned[p].key == key
                                           and self._session_of(p) == stat.session)
            else:
                self._unattributed.add(child)
                self.unattributed_total += 1
                self._log.warning("shell.orphan_unattributed pid=%d", child)
        self._ended.clear()
        self._forget_sessions()

    def _forget_sessions(self) -> None:
        """Drop ended sessions none of whose processes is left in them."""
        alive = {self._session_of(pid) for pid in self._owned}
        for root in list(self._sessions):
            if root not in self._roots and root not in alive:
                del self._sessions[root]

    @staticmethod
    def _session_of(pid: int) -> int | None:
        stat = _stat(pid)
        return None if stat is None else stat.session

    def _name_below(self, parents: list[int]) -> None:
        """Give every unnamed descendant of ``parents`` its parent's key."""
        todo = list(parents)
        while todo:
            parent = todo.pop()
            key = self._owned[parent].key
            for child in _children(parent):
                if child in self._owned or child == self._self:
                    continue
                stat = _stat(child)
                if stat is not None and stat.state not in "ZX":
                    self._owned[child] = _Owned(key, stat.start)
                    if parent in self._uncertain:
                        self._uncertain.add(child)
                    todo.append(child)

    def _reap(self, pid: int, stat: _Stat | None) -> None:
        """Collect an adopted process that ended (it is our child, nobody else waits)."""
        if stat is not None and stat.ppid == self._self and pid not in self._roots:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

    def signal(self, key: bytes, signum: int = signal.SIGKILL,
               *, skip: frozenset[int] | set[int] = frozenset()) -> set[int]:
        """Send ``signum`` to every live process of ``key`` but its sessions' first
        (their sessions hang those up) and those in ``skip``. Returns their pids."""
        sent: set[int] = set()
        for pid, owned in list(self._owned.items()):
            if owned.key != key or pid in self._roots or pid in skip or pid in self._uncertain:
                continue
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue  # gone
            try:
                stat = _stat(pid)
                if stat is None or stat.start != owned.start:
                    continue  # the pid now names another process
                if stat.state in "ZX":
                    continue  # ended, not yet collected
                signal.pidfd_send_signal(pidfd, signum)
                sent.add(pid)
            except OSError as exc:
                if exc.errno != errno.ESRCH:
                    raise
            finally:
                os.close(pidfd)
        return sent

    def end_key(self, key: bytes, *, rounds: int = 5) -> int:
        """Kill ``key``'s processes, scanning again for what they forked meanwhile.

        Bounded: ``rounds`` scans at most (a process SIGKILLed forks no more, so
        each round can only find what was forked before the last one landed).
        """
        killed: set[int] = set()
        for _ in range(rounds):
            self.scan()
            already = {pid for pid, owned in self._owned.items() if owned.killed}
            sent = self.signal(key, skip=already)
            if not sent:
                break
            for pid in sent:
                self._owned[pid].killed = True
            killed |= sent
            self._ended.add(key)  # what they leave orphaned is theirs
        self.killed_total += len(killed)
        if killed:
            self._log.warning("shell.background_killed key=%s processes=%d",
                              key.hex()[:12], len(killed))
        return len(killed)
