"""Shared plumbing of the benchmarks: JSON-line output and child-process servers."""

from __future__ import annotations

import json
import multiprocessing
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Benchmarks run as scripts (`python bench/x.py`); make the project importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def emit(bench: str, metric: str, value: float, unit: str, **extra: Any) -> None:
    """Print one figure as a JSON line on stdout."""
    record = {"bench": bench, "metric": metric, "value": round(value, 4), "unit": unit}
    record.update(extra)
    print(json.dumps(record), flush=True)


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
        "n": len(ordered),
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


async def send_and_time(stream: Any, total: int, chunk: bytes, ack: bytes) -> float:
    """Send ``total`` bytes in ``chunk`` writes, wait for the peer's ``ack``,
    close; return MB/s from the first write to the ack."""
    import time

    start = time.perf_counter()
    sent = 0
    while sent < total:
        await stream.send_all(chunk)
        sent += len(chunk)
    assert await stream.receive_some(len(ack)) == ack
    elapsed = time.perf_counter() - start
    await stream.aclose()
    return total / 1e6 / elapsed


async def receive_and_ack(stream: Any, total: int, ack: bytes) -> bool:
    """Read ``total`` bytes (256 KiB at a time), then send ``ack``; False if the
    stream ended first."""
    received = 0
    while received < total:
        data = await stream.receive_some(256 * 1024)
        if not data:
            return False
        received += len(data)
    await stream.send_all(ack)
    return True


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version()}


class ChildServer:
    """Run ``target(port_queue, *args)`` in a spawned process; it must put its port."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._queue = context.Queue()
        self._process = context.Process(target=target, args=(self._queue, *args), daemon=True)

    def __enter__(self) -> int:
        self._process.start()
        return self._queue.get(timeout=60)

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        self._process.join(timeout=10)
