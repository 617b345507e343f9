"""Subprocess doubles of the commands a runtime plan runs (``vllm``, ``ray``).

The doubles are scripts named as the real commands; :func:`bin_dir` puts
wrappers for them in a folder for PATH, run with the test's interpreter so
they can import trio and our local model server.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["DOUBLES", "bin_dir"]

DOUBLES = Path(__file__).resolve().parent


def bin_dir(where: Path, names: tuple[str, ...] = ("vllm", "ray")) -> Path:
    """A folder holding executable ``vllm`` and ``ray`` wrappers around the doubles."""
    folder = where / "bin"
    folder.mkdir(exist_ok=True)
    for name in names:
        script = folder / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{DOUBLES / name}" "$@"\n')
        script.chmod(0o755)
    return folder
