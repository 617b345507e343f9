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

import trio

__all__ = ["describe_exit", "signal_group", "spawn", "stop", "stop_all"]


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
