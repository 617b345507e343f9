"""The upstream JavaScript stack's benchmarks, run beside ours in the same sitting.

The scripts live in ``../shared/anchors/holepunch`` (``CAC_ANCHORS`` names
another ``anchors`` folder). They are copied once into ``bench/.anchors/`` and
their npm packages installed there (``npm ci``, from the registry; a few
minutes the first time), so the shared folder stays read-only. Each script
prints JSON lines ``{"figure": ..., "median": ..., "unit": ...}``.

Without ``node``, ``npm`` or the anchors, :func:`run_holepunch` returns the
reason as a string: the caller prints it as a skipped reference, and its own
figures stand alone.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_holepunch", "upstream_figure"]

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".anchors" / "holepunch"
_INSTALL_TIMEOUT_S = 900


def _source() -> Path:
    anchors = os.environ.get("CAC_ANCHORS")
    root = Path(anchors) if anchors else HERE.parent.parent / "shared" / "anchors"
    return root / "holepunch"


def ensure_holepunch() -> Path | str:
    """The installed copy of the anchors, or why there is none."""
    source = _source()
    if not (source / "package.json").exists():
        return f"no upstream anchors at {source}"
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node and npm are not installed"
    lock = source / "package-lock.json"
    fresh = (CACHE / "node_modules").is_dir() and lock.exists() and filecmp.cmp(
        lock, CACHE / "package-lock.json", shallow=False)
    if not fresh:
        shutil.rmtree(CACHE, ignore_errors=True)
        shutil.copytree(source, CACHE, ignore=shutil.ignore_patterns("node_modules", "logs"))
        install = ["npm", "ci" if lock.exists() else "install", "--silent", "--no-audit",
                   "--no-fund"]
        try:
            done = subprocess.run(install, cwd=CACHE, capture_output=True, text=True,
                                  timeout=_INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            shutil.rmtree(CACHE, ignore_errors=True)
            return f"npm took over {_INSTALL_TIMEOUT_S} s to install the anchors"
        if done.returncode != 0:
            shutil.rmtree(CACHE, ignore_errors=True)
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return f"npm could not install the anchors: {tail[0][:200]}"
    return CACHE


def run_holepunch(script: str, *args: str, timeout_s: float = 600
                  ) -> tuple[list[dict[str, Any]], float] | str:
    """Run ``node <script> <args>`` of the anchors.

    Returns:
        Its figures and the CPU seconds (user + system) that node and the
        children it waited for used; or why it could not run.
    """
    folder = ensure_holepunch()
    if isinstance(folder, str):
        return folder
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(["node", script, *args], cwd=folder, stdout=out, stderr=err)
        deadline = time.monotonic() + timeout_s
        # os.wait4, not the children's rusage of this process: only node's
        # tree counts, not whatever else this process reaps meanwhile.
        while (done := os.wait4(process.pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                return f"{script} ran over {timeout_s:.0f} s"
            time.sleep(0.05)
        process.returncode = os.waitstatus_to_exitcode(done[1])
        cpu_s = done[2].ru_utime + done[2].ru_stime
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    figures = []
    for line in stdout.splitlines():
        try:
            figure = json.loads(line)
        except ValueError:
            continue
        if isinstance(figure, dict) and "figure" in figure:
            figures.append(figure)
    if not figures:
        tail = stderr.strip().splitlines()[-1:] or [f"exit status {process.returncode}"]
        return f"{script} printed no figures: {tail[0][:200]}"
    return figures, cpu_s


def upstream_figure(figures: list[dict[str, Any]], starts_with: str) -> float | None:
    """The median of the first figure whose name starts with ``starts_with``."""
    for figure in figures:
        if str(figure.get("figure", "")).startswith(starts_with):
            value = figure.get("median")
            return float(value) if isinstance(value, (int, float)) else None
    return None
