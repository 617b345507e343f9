"""py-spy for the benchmarks: sample a daemon while a load runs, then say where
its time went.

``py-spy record --format raw`` writes collapsed stacks (``frame;frame;... count``);
:func:`summarize` turns them into the share of samples each function is on the
stack of (inclusive), keeping the project's own frames and the libraries'
entry points, which is what "what dominates" needs. py-spy is looked up next
to the running interpreter (the project's venv), then on ``PATH``.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["py_spy", "record", "summarize"]


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def record(pid: int, seconds: float, out: Path) -> subprocess.Popen | None:
    """Start sampling ``pid`` for ``seconds`` into ``out`` (None: no py-spy here)."""
    binary = py_spy()
    if binary is None:
        return None
    return subprocess.Popen(
        [binary, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
         "--format", "raw", "--output", str(out), "--nonblocking", "--rate", "200"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _name(frame: str) -> str:
    """``func (path/file.py:12)`` -> ``func (path/file.py)``."""
    func, _, where = frame.partition(" (")
    return f"{func} ({where.split(':')[0]})"


def summarize(path: Path, *, top: int = 25, prefixes: tuple[str, ...] = (
        "nodes/", "p2p/", "crdt/", "contracts/", "agents/", "sqlite3", "pydantic",
        "starlette/", "hypercorn/", "msgpack", "json/")) -> list[tuple[float, str]]:
    """The ``top`` functions by share of samples on their stack, among frames whose
    file starts with one of ``prefixes`` (the project's and the main libraries')."""
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        seen = set()
        for frame in stack.split(";"):
            if ".py:" not in frame:
                continue
            name = _name(frame)
            where = name.rpartition("(")[2]
            if name not in seen and (where.startswith(prefixes) or ("/site-packages/" in where
                                     and where.split("/site-packages/")[1].startswith(prefixes))):
                seen.add(name)
                inclusive[name] += int(count)
    if not total:
        return []
    return [(100.0 * n / total, name) for name, n in inclusive.most_common(top)]
