"""Helpers for tests that run `cosmicac` as real processes."""

from __future__ import annotations

import re
import subprocess
import sys
import weakref
from contextlib import asynccontextmanager

import trio

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


@asynccontextmanager
async def process(*args, stdout=subprocess.DEVNULL, env=None):
    """Run ``cosmicac *args`` (stderr piped); killed on the way out if still running."""
    proc = await trio.lowlevel.open_process(
        [*COSMICAC, *args], stdout=stdout, stderr=subprocess.PIPE, env=env
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
