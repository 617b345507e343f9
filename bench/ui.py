"""The web UI: the jobs page of a team with 1,000 jobs, and one page's stream fanned out
to 100 browsers.

The system under test runs as its own processes, as in a deployment: wrk-ork and
app-node seeded as ``bench/api.py`` seeds them (``--jobs`` jobs, all in one team,
waiting Pending on a rack that never reports), and the UI (``cosmicac run ui``)
in front of app-node's API. The client signs in once through the UI's form (the
seeded admin's password; one scrypt hash) and keeps its session cookie.

Figures (JSON lines ``{"bench": "ui", "metric": ...}``):

* ``jobs_page_p50`` / ``jobs_page_p99`` (ms): ``GET /jobs`` one at a time,
  ``--pages`` times: the UI asks app-node for ``/me`` and the first page of
  jobs (50, newest first, with their live status from wrk-ork) and renders them;
  ``jobs_page_bytes``.
* ``stream_status_p50`` / ``_p99`` / ``_max`` (ms): ``--subscribers`` live streams
  of the jobs list (``/ui/stream?topic=jobs``) open at once (each its own
  app-node stream, as each browser has); a job is deleted through the API and the time from that
  request to each subscriber's first fragment for it (its status, or its row
  removed) is taken; ``--changes`` times.
  ``stream_connect_s``: how long all the streams took to get their snapshot.

usage: python bench/ui.py [--jobs 1000] [--pages 200] [--subscribers 100] [--changes 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import httpx
import trio
from _common import emit, machine, percentile
from api import _wait_ready, free_ports, seed, start_daemons

from runtime.sse import SseReader

BENCH = "ui"
HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
#: The seeded admin (bench/api.py's seed).
ADMIN, PASSWORD = "user0@bench.local", "bench-password-not-used"
#: What a browser sends with a form of the UI's own pages.
SAME_ORIGIN = {"sec-fetch-site": "same-origin"}


def start_ui(workdir: Path, api_url: str) -> tuple[subprocess.Popen, str]:
    (port,) = free_ports(1)
    config = workdir / "ui.json"
    config.write_text(json.dumps({"host": HOST, "port": port, "api_url": api_url}))
    log = workdir / "ui.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COSMICAC_LOG_LEVEL": "warning"}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli.main", "run", "ui", "--config",
                                 str(config)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env)
    _wait_ready(proc, log, "ui")
    return proc, f"http://{HOST}:{port}"


def sign_in(ui: str) -> httpx.Cookies:
    with httpx.Client(base_url=ui, timeout=60, trust_env=False) as client:
        answer = client.post("/login", data={"email": ADMIN, "password": PASSWORD},
                             headers=SAME_ORIGIN)
        if answer.status_code != 303:
            raise SystemExit(f"sign-in failed: {answer.status_code} {answer.text[:500]}")
        return client.cookies


def page_latencies(ui: str, cookies: httpx.Cookies, pages: int) -> tuple[list[float], int]:
    took, size = [], 0
    with httpx.Client(base_url=ui, timeout=60, cookies=cookies, trust_env=False) as client:
        for _ in range(pages):
            began = time.perf_counter()
            answer = client.get("/jobs")
            took.append((time.perf_counter() - began) * 1000)
            if answer.status_code != 200:
                raise SystemExit(f"GET /jobs: {answer.status_code} {answer.text[:500]}")
            size = len(answer.content)
    return took, size


async def fan_out(ui: str, api: str, token: str, cookies: httpx.Cookies, subscribers: int,
                  changes: int) -> tuple[list[float], float]:
    """Open ``subscribers`` streams, then delete ``changes`` jobs one after another and
    time each status fragment's arrival at each stream."""
    seen: dict[str, list[float]] = {}
    arrived: defaultdict[str, trio.Event] = defaultdict(trio.Event)
    snapshots = trio.Semaphore(0)
    latencies: list[float] = []

    async def subscriber(client: httpx.AsyncClient) -> None:
        async with client.stream("GET", "/ui/stream", params={"topic": "jobs"}) as response:
            if response.status_code != 200:
                raise SystemExit(f"/ui/stream: {response.status_code} "
                                 f"{(await response.aread())[:300]!r}")
            reader = SseReader()
            async for line in response.aiter_lines():
                got = reader.line(line)
                if got is None or not got[0]:
                    continue
                data = got[1].removeprefix("jobs\n")  # the topic, then the fragment
                if data.startswith('<tbody id="jobs-body"'):
                    snapshots.release()
                elif 'id="job-' in data:  # its status, or its row removed
                    job = data.split('id="job-', 1)[1].split('"', 1)[0].removesuffix("-status")
                    seen.setdefault(job, []).append(time.perf_counter())
                    if len(seen[job]) == subscribers:
                        arrived[job].set()

    limits = httpx.Limits(max_connections=subscribers + 10)
    async with httpx.AsyncClient(base_url=ui, cookies=cookies, limits=limits, timeout=120,
                                 trust_env=False) as client, \
            httpx.AsyncClient(base_url=api, timeout=60, trust_env=False) as api_client, \
            trio.open_nursery() as nursery:
        began = time.perf_counter()
        for _ in range(subscribers):
            nursery.start_soon(subscriber, client)
        with trio.fail_after(120):
            for _ in range(subscribers):
                await snapshots.acquire()
        connected = time.perf_counter() - began
        headers = {"authorization": f"Bearer {token}"}
        listed = (await api_client.get("/jobs", headers=headers)).json()["jobs"]
        for job in [j["id"] for j in listed][:changes]:
            sent = time.perf_counter()
            answer = await api_client.delete(f"/jobs/{job}", headers=headers)
            if answer.status_code not in (200, 202):
                raise SystemExit(f"DELETE /jobs/{job}: {answer.status_code} {answer.text}")
            with trio.fail_after(60):
                await arrived[job].wait()
            latencies += [(at - sent) * 1000 for at in seen[job]]
        nursery.cancel_scope.cancel()
    return latencies, connected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--changes", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        workdir = Path(tmp)
        seeded = seed(workdir, users=2, jobs=args.jobs, teams=1)
        with start_daemons(workdir, seeded) as daemons:
            ui_proc, ui = start_ui(workdir, daemons.api.removesuffix("/api"))
            try:
                cookies = sign_in(ui)
                took, size = page_latencies(ui, cookies, args.pages)
                latencies, connected = trio.run(fan_out, ui, daemons.api, seeded.tokens[0],
                                                cookies, args.subscribers, args.changes)
            finally:
                ui_proc.terminate()
                ui_proc.wait(timeout=15)
    extra = {"jobs": args.jobs, "machine": machine()}
    emit(BENCH, "jobs_page_p50", statistics.median(took), "ms", **extra)
    emit(BENCH, "jobs_page_p99", percentile(took, 0.99), "ms")
    emit(BENCH, "jobs_page_bytes", size, "bytes")
    emit(BENCH, "stream_connect_s", connected, "s", subscribers=args.subscribers)
    emit(BENCH, "stream_status_p50", statistics.median(latencies), "ms",
         subscribers=args.subscribers, changes=args.changes)
    emit(BENCH, "stream_status_p99", percentile(latencies, 0.99), "ms")
    emit(BENCH, "stream_status_max", max(latencies), "ms")
    print(f"jobs page ({args.jobs} jobs in the team): p50 {statistics.median(took):.1f} ms, "
          f"p99 {percentile(took, 0.99):.1f} ms, {size} bytes; {args.subscribers} streams "
          f"connected in {connected:.2f} s; status to every stream: p50 "
          f"{statistics.median(latencies):.1f} ms, p99 {percentile(latencies, 0.99):.1f} ms, "
          f"max {max(latencies):.1f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
