"""``python -m agents.inference.server`` as a real process, for the tests that
call it over HTTP."""

from __future__ import annotations

import contextlib
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVER = [sys.executable, "-m", "agents.inference.server"]


def read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """One stdout line of ``proc``, waiting at most ``timeout_s``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no output within {timeout_s}s"
    return proc.stdout.readline()


@contextlib.contextmanager
def running_server(
    model: str, served_name: str, *options: str, load_timeout_s: float = 30.0
) -> Iterator[str]:
    """``python -m agents.inference.server`` serving ``model``; yields its base URL."""
    proc = subprocess.Popen(
        [*SERVER, "--model", model, "--port", "0", "--served-name", served_name, *options],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(proc, load_timeout_s)
        assert line.startswith("listening http://127.0.0.1:"), line
        yield line.split()[1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            proc.stderr.close()
