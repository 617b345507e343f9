"""Helpers for tests that run `cosmicac` as real processes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import weakref
from collections.abc import Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from nodes.kit.ready import ReadyLine, parse_ready
from tests.ports import free_ports

COSMICAC = [sys.executable, "-m", "cli.main"]


#: What each stream's reader got past its last match: a process often writes
#: two lines in one go (always, on a busy machine), and the second belongs to
#: the next read_until.
_LEFTOVER: weakref.WeakKeyDictionary[trio.abc.ReceiveStream, bytes] = \
    weakref.WeakKeyDictionary()


async def read_until(stream: trio.abc.ReceiveStream, pattern: re.Pattern[str]) -> re.Match[str]:
    """Read ``stream`` (a process's output) until ``pattern`` matches; return the match.

    What was read beyond the match is kept for the next call on the same stream.
    """
    seen = _LEFTOVER.pop(stream, b"")
    while not (match := pattern.search(seen.decode(errors="replace"))):
        chunk = await stream.receive_some()
        assert chunk, f"the process exited before printing {pattern.pattern!r}: {seen!r}"
        seen += chunk
    text = seen.decode(errors="replace")
    _LEFTOVER[stream] = text[match.end():].encode()
    return match


async def read_ready(stream: trio.abc.ReceiveStream, daemon: str) -> ReadyLine:
    """Read a daemon's stdout until its ready line (nodes/kit/ready.py); return it, parsed.

    What was read beyond the line is kept for the next call on the same stream.
    """
    match = await read_until(stream, re.compile(rf"(?m)^{re.escape(daemon)} ready[^\n]*\n"))
    line = parse_ready(match[0])
    assert line is not None, f"not a ready line: {match[0]!r}"
    return line


def describe_stuck(pid: int) -> str:
    """What a process that should have ended is doing: its state and signal masks
    (a signal it ignores, blocks or has pending) and, with py-spy, its Python stack.
    Printed by a test before it kills the process, for the failure's report."""
    lines = [f"process {pid} still running:"]
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError as exc:
        return f"process {pid}: {exc}"
    lines += [line for line in status.splitlines()
              if line.startswith(("State:", "SigPnd:", "ShdPnd:", "SigBlk:", "SigIgn:",
                                  "SigCgt:"))]
    spy = shutil.which("py-spy", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    if spy is not None:
        dumped = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True,
                                text=True, timeout=30, check=False)
        lines.append(dumped.stdout or dumped.stderr)
    return "\n".join(lines)


async def kill_if_running(proc: trio.Process) -> None:
    """Kill ``proc`` if it still runs (a test that failed before it ended), saying
    first what it was doing."""
    if proc.returncode is None:
        print(await trio.to_thread.run_sync(describe_stuck, proc.pid))
        proc.kill()
        await proc.wait()


@asynccontextmanager
async def process(*args, stdout=subprocess.DEVNULL, env=None):
    """Run ``cosmicac *args`` (stderr piped); killed on the way out if still running."""
    proc = await trio.lowlevel.open_process(
        [*COSMICAC, *args], stdout=stdout, stderr=subprocess.PIPE, env=env
    )
    try:
        yield proc
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(60):
            await kill_if_running(proc)


#: What ``cosmicac up`` prints once everything runs.
UP = re.compile(r"cosmicac is up at (\S+)")


def free_base_port() -> int:
    """A base port whose 21 ports are free (TCP and UDP), off the real defaults
    and below the ephemeral range."""
    return free_ports(21, udp=True)


def pids_using(path: Path) -> list[int]:
    """Processes whose command line names ``path`` (the storage): up's children."""
    found = []
    needle = str(path).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


@asynccontextmanager
async def running_up(storage: Path, base: int, env: dict[str, str] | None = None, *,
                     umask: int | None = None, options: Sequence[str] = ()):
    """``cosmicac up`` on ``storage`` (stdout and stderr piped) with ``options``, under
    ``umask`` if given; on the way out it and every process naming ``storage`` are
    killed (a VM's QEMU names its disk there), so a failed test leaves none."""
    proc = await trio.lowlevel.open_process(
        [*COSMICAC, "up", "--storage", str(storage), "--no-table", "--base-port", str(base),
         *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        preexec_fn=None if umask is None else (lambda: os.umask(umask)))
    try:
        yield proc
    finally:
        # up's own children first: the DHT bootstrap's command line names no storage.
        children = _children(proc.pid) if proc.returncode is None else []
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        kill_all({*children, *pids_using(storage)})


def kill_all(pids: set[int]) -> None:
    """SIGKILL each process and, if it leads one, its group (a service and what it
    started): what an ``up`` left behind."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            try:
                os.kill(pid, signal.SIGKILL)  # not a group leader
            except OSError:
                pass


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_line = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        fields = stat_line[stat_line.rfind(")") + 2:].split()
        if len(fields) > 1 and fields[1] == str(parent):
            found.append(int(entry.name))
    return found
