"""``cosmicac jobs list`` as a person and a script see it: a real process on a
terminal (a pseudo-terminal sized 60 and 200 columns, as a narrow and a wide tmux
window) and, for a script, on an output that is no terminal (in this process: the
command asks its stdout ``isatty()``, which a pipe and the runner's buffer both
answer no), against an in-process app-node and wrk-ork."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import termios

import pytest
import trio

from ..p2p.helpers import wait_until
from .support import COSMICAC, ServedOrk

pytestmark = pytest.mark.slow

IMAGE = "docker://registry.local/jobs/app:1"
LONG_NAME = "nightly-evaluation-of-the-very-large-model-on-every-benchmark"
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


def _terminal(columns: int, rows: int = 50) -> tuple[int, int]:
    """A pseudo-terminal ``columns`` wide, as tmux sizes one: (leader, follower)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    return leader, follower


def _terminal_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` as a terminal user's: ``COLUMNS`` unset (the window says), colour allowed."""
    return {**{k: v for k, v in env.items() if k not in ("COLUMNS", "NO_COLOR")},
            "TERM": "xterm"}


def _on_a_terminal(args: list[str], env: dict[str, str], columns: int) -> str:
    """What ``args`` prints on a terminal ``columns`` wide."""
    import subprocess

    leader, follower = _terminal(columns)
    try:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=follower,
                                   stderr=subprocess.PIPE, env=_terminal_env(env))
        os.close(follower)
        chunks: list[bytes] = []
        _read_all(leader, chunks)
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        os.close(leader)
    return b"".join(chunks).decode().replace("\r\n", "\n")


async def test_jobs_list_fits_a_terminal_and_pipes_plain(served_ork: ServedOrk) -> None:
    served = served_ork
    with trio.fail_after(120):
        await served.login()
        jobs = []
        for name in (LONG_NAME, "box"):
            created = await served.cli("jobs", "create", "--image", IMAGE, "--type",
                                       "container", "--name", name)
            assert created.returncode == 0, created.stderr
            jobs.append(created.stdout.decode().strip())
        args = [*COSMICAC, "jobs", "list"]
        for columns in (60, 200):
            text = await trio.to_thread.run_sync(_on_a_terminal, args, served.env, columns)
            lines = [_ESCAPES.sub("", line) for line in text.splitlines()]
            assert len(lines) == 3, text
            assert all(len(line) <= columns for line in lines), (columns, lines)
            for job in jobs:
                assert sum(job in line for line in lines) == 1, (job, lines)
            assert text.startswith("\x1b[1mID"), "the header is bold on a terminal"
            if columns == 60:
                assert LONG_NAME not in text and "nightly-evaluat" in text and "…" in text
            else:
                assert LONG_NAME in text
        piped = await served.cli("jobs", "list")  # (its process runs on the terminals)
        text = piped.stdout.decode()
        assert not re.search("[\u2500-\u257f]", text) and "\x1b" not in text
        lines = text.splitlines()
        assert lines[0].split()[:4] == ["ID", "NAME", "TYPE", "STATUS"]
        assert {line.split()[0] for line in lines[1:]} == set(jobs)
        assert any(LONG_NAME in line for line in lines), "a pipe gets whole cells"
        names = await served.cli("jobs", "list", "-o", "name", "--no-headers")
        assert set(names.stdout.decode().split()) == set(jobs)


async def test_jobs_list_watch_redraws_in_place_on_a_terminal(served_ork: ServedOrk) -> None:
    """The table is drawn, then drawn again over itself (the cursor back to its first
    line, the rest cleared) when a job comes: no row printed twice below the other."""
    import signal
    import subprocess
    import threading

    served = served_ork
    with trio.fail_after(120):
        await served.login()
        first = await _create(served, "first")
        hub = served.node.services.events
        assert hub is not None
        leader, follower = _terminal(100, rows=30)
        process = await trio.lowlevel.open_process(
            [*COSMICAC, "jobs", "list", "--watch"], stdin=subprocess.DEVNULL,
            stdout=follower, stderr=subprocess.DEVNULL, env=_terminal_env(served.env))
        os.close(follower)
        screen: list[bytes] = []
        reader = threading.Thread(target=_read_all, args=(leader, screen), daemon=True)
        reader.start()
        try:
            await wait_until(lambda: hub.subscribers == 1, limit_s=60)
            # The first table is listed once the stream is ready: a job created before
            # it is listed would be in that first drawing, and nothing drawn again.
            await wait_until(lambda: first.encode() in b"".join(screen), limit_s=60)
            second = await _create(served, "second")
            await wait_until(lambda: second.encode() in b"".join(screen), limit_s=30)
        finally:
            process.send_signal(signal.SIGINT)
            code = await process.wait()
            reader.join(10)
            os.close(leader)
        assert code == 130
        text = b"".join(screen).decode()
        frames = text.split("\x1b[J")[1:]  # each drawing clears below its first line
        assert len(frames) >= 2 and "\x1b[2F" in text, "drawn again over the first table"
        last = [_ESCAPES.sub("", line) for line in frames[-1].splitlines() if line.strip()]
        assert [line.split()[0] for line in last[1:]] == [second, first], last


def _read_all(fd: int, into: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the process closed its side
            return
        if not chunk:
            return
        into.append(chunk)


async def _create(served: ServedOrk, name: str) -> str:
    created = await served.cli("jobs", "create", "--image", IMAGE, "--type", "container",
                               "--name", name)
    assert created.returncode == 0, created.stderr
    return created.stdout.decode().strip()
