"""Child processes: start one in a session of its own, stop it, say how it ended.

Three supervisors keep processes: ``cosmicac up`` its daemons, the local
worker backend its agents, the inference agent its model server's steps. They
share the rules written here:

- :func:`spawn` starts a child in a new session (so a process group) of its own
  by default: a terminal's Ctrl-C reaches only the supervisor, which stops the
  child in order, and stopping the group takes whatever the child started with it;
- :func:`stop` / :func:`stop_all` send SIGTERM, wait ``grace_s``, then SIGKILL
  what is left and reap it; ``group=False`` signals only the process itself (the
  inference agent's steps share the agent's group on purpose);
- :func:`describe_exit` turns a return code into words for a status line or a
  failure message: ``exited with status 3``, ``killed by SIGKILL``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path

import trio

__all__ = ["cmdline", "describe_exit", "is_alive", "last_line", "proc_stat",
           "signal_group", "spawn", "stop", "stop_all", "wait_gone"]


async def spawn(argv: Sequence[str], *, new_session: bool = True, **options) -> trio.Process:
    """Start ``argv`` (``options`` as :func:`trio.lowlevel.open_process` takes them),
    in a session of its own unless ``new_session`` is False.

    Raises:
        OSError: the program cannot be started (its ``strerror`` says why).
    """
    return await trio.lowlevel.open_process(list(argv), start_new_session=new_session,
                                            **options)


def signal_group(pid: int, signum: int) -> None:
    """Send ``signum`` to the process group ``pid`` leads; nothing if it is gone or
    not ours to signal."""
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(process: trio.Process, signum: int, group: bool) -> None:
    if process.returncode is not None:
        return
    if group:
        signal_group(process.pid, signum)
        return
    try:
        process.send_signal(signum)
    except ProcessLookupError:
        pass


async def stop_all(processes: Sequence[trio.Process], grace_s: float, *,
                   group: bool = True) -> None:
    """SIGTERM each of ``processes`` in the order given, wait up to ``grace_s`` for
    them all, SIGKILL what is left; returns once every one has exited (and is reaped).

    ``group``: signal each one's process group (it leads one: :func:`spawn`) rather
    than the process alone.
    """
    for process in processes:
        _signal(process, signal.SIGTERM, group)
    with trio.move_on_after(grace_s):
        for process in processes:
            await process.wait()
    for process in processes:
        if process.returncode is None:
            _signal(process, signal.SIGKILL, group)
            await process.wait()


async def stop(process: trio.Process, grace_s: float, *, group: bool = True) -> None:
    """:func:`stop_all` for one process."""
    await stop_all([process], grace_s, group=group)


def describe_exit(returncode: int | None) -> str:
    """How a process ended, in words: ``exited with status 3``, ``killed by SIGKILL``."""
    if returncode is None:
        return "exited with an unknown status"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


# -- processes that are not our children (found again after a restart) ----------


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of ``pid``, or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ..." - comm may hold spaces and parentheses.
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def is_alive(pid: int, start_ticks: int | None) -> bool:
    """Is ``pid`` the process we started (same start time), and not a zombie?"""
    stat = proc_stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start_ticks is None or stat[1] == start_ticks


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def last_line(path: Path, max_bytes: int = 2048) -> str:
    """The log's last non-empty line (what an agent says as it fails), bounded."""
    try:
        with path.open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - max_bytes))
            tail = file.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


async def wait_gone(pid: int, start_ticks: int | None, poll_interval_s: float) -> None:
    """Return once ``pid`` (not our child) has ended: a pidfd becomes readable then
    (Linux 5.3+); without one, poll ``/proc`` every ``poll_interval_s``."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            if is_alive(pid, start_ticks):  # checked after opening: not a reused pid
                await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        return
    while is_alive(pid, start_ticks):  # noqa: ASYNC110 - nothing to wait on but /proc
        await trio.sleep(poll_interval_s)
