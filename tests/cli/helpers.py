"""Helpers for tests that run `cosmicac` as real processes."""

from __future__ import annotations

import re
import subprocess
import sys
from contextlib import asynccontextmanager

import trio

COSMICAC = [sys.executable, "-m", "cli.main"]


async def read_until(stream: trio.abc.ReceiveStream, pattern: re.Pattern[str]) -> re.Match[str]:
    """Read ``stream`` (a process's stderr) until ``pattern`` matches; return the match."""
    seen = b""
    while not (match := pattern.search(seen.decode(errors="replace"))):
        chunk = await stream.receive_some()
        assert chunk, f"the process exited before printing {pattern.pattern!r}: {seen!r}"
        seen += chunk
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
