"""Job create -> ``running`` on the ``local`` backend with the ``demo`` model, step
by step.

The whole embedded system runs as users run it: ``cosmicac up --storage
<temp> --base-port <free> --no-table`` as a subprocess (DHT, relay, app-node,
wrk-ork, the local GPU worker, proxy-inference, the entry point; each its own
process). The bench logs in as the admin ``up`` created, then, ``--jobs``
times one after the other (after ``--warm-up`` jobs not counted): POST
``/api/jobs`` ``{type: inference, runtime: local, model: demo, gpus: 1}``,
polls ``GET /api/jobs/{id}`` every ``--poll-ms`` until ``running``, deletes
the job and waits until it is gone (so each job starts on a quiet machine).

Where the step times come from: what the system already writes, read after
the run, all on this machine's wall clock (milliseconds in the logs):

==================  ===========================================================
post sent / 201     the bench's own clock around the POST
creating, placed,   ``ork.job_status`` lines of ``logs/wrk-ork.log`` (the one
active              line this bench added to wrk-ork, nodes/ork/service.py:
                    the orchestrator's own timestamp of each status change)
op published        ``ork.published`` (wrk-ork: the op is durably on the rack's
                    queue)
op received         ``worker.create job=`` (``logs/wrk-server-k8s-nvidia.log``)
process launched    ``local.started vmi=`` (the local backend spawned the agent)
agent started       ``agent.started`` in the VMI's ``agent.log`` (interpreter,
                    imports, identity, swarm up)
agent hello         ``agent.hello vmi=`` (the worker heard the agent)
model server        ``model_server.step_started``, the server's ``listening
                    http://`` and ``model_server.healthy`` in ``agent.log``
                    (the demo server is a process of its own)
agent ready         ``agent.ready vmi=`` (the worker's side)
running             the first poll that answers ``running``
==================  ===========================================================

Steps (consecutive, so they add up to the total; medians over the jobs):
``ork`` post sent -> placed in wrk-ork (app-node's auth and validation, the
RPC, placement); ``queue`` placed -> the worker received the op (wrk-ork's
durable publish, replication to the worker); ``worker`` received -> agent
process launched; ``agent_start`` launched -> agent hello; ``health`` hello
-> Active in wrk-ork (the model server's boot and first health check, agent
ready, the worker's report applied); ``api_poll`` Active -> the API shows
running (at most one poll interval plus a GET). ``api`` (the POST's answer
time) overlaps ``ork`` and ``queue``. Sub-marks are printed as ``at_<mark>``
(ms after the POST was sent). jobs.watch (``nodes/kit/ork_client.py``) would give
the status times too, but wrk-ork serves it to app-node's key only.

app-node's per-token rate limit (10/s) would throttle the polls: the bench
raises it for this ``up`` through ``COSMICAC_APP_NODE__LIMITS__PER_TOKEN__*``.
On the way out: SIGINT to ``up``, wait for it, and check that no process of
the deployment is left (``leftover_processes``, which must be 0).

``--attach STORAGE`` measures an ``up`` that already runs (its ``--storage``
folder: the admin's ``credentials.json`` and the logs) and leaves it running:
the API is reached through the entry point (``url`` in the credentials), a
poll answered 429 waits its ``Retry-After`` (keep ``--poll-ms`` at 100 or more
under the default limit), and no ``leftover_processes`` is printed.

The reference, in the same run (``--reference spawn``, the default on the
``local`` backend): a second ``up`` whose worker spawns each agent
(``K8S_COMMON_CONFIG__LOCAL__FORK_SERVER=false``: every agent imports itself,
about a second, as before the fork server), measured the same way after ours;
``reference_total`` is its median and ``ratio`` reference / ours (> 1: the fork
server is ahead). Either way the inference agent forks its own model server
from itself (agents/inference/_launcher.py). ``forked_agents`` counts the
agents of our run the worker forked (``local.started ... via=fork``): all of
them, unless the fork server was unusable (its WARNING is in the worker's log).

``--backend qemu`` runs the same on the qemu backend (``up --backend qemu
--image IMAGE``, the image ``make image`` built): each job a VM booted from the
guest image. There ``process launched`` is ``qemu.started vmi=`` and
``agent_start`` is the VM's boot until the agent's hello; the agent's own marks
(``agent started``, the model server's) are left out: they are written on the
guest's clock.

usage: python bench/job_start.py [--quick] [--jobs 5] [--warm-up 1] [--poll-ms 20]
                                 [--attach STORAGE] [--backend local|qemu [--image IMAGE]]
                                 [--reference spawn|none]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import emit, machine

BENCH = "job_start"
HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
WORKER_LOG = "wrk-server-k8s-nvidia"
UP_TIMEOUT_S = 180.0
JOB_TIMEOUT_S = 120.0
IMAGE = "docker://registry.local/demo:latest"

#: (step, from mark, to mark, what it covers), in order; they add up to ``total``.
STEPS = (
    ("ork", "post_sent", "placed", "app-node + RPC + placement in wrk-ork"),
    ("queue", "placed", "op_received", "durable publish + replication to the worker"),
    ("worker", "op_received", "process_launched", "worker: folders (disk, seed), spawn"),
    ("agent_start", "process_launched", "agent_hello", "agent (or VM) boot until hello"),
    ("health", "agent_hello", "active", "model server up and healthy, reported Active"),
    ("api_poll", "active", "running", "Active -> a GET shows running"),
)
#: Marks printed as offsets from the POST (ms), beside the steps.
MARKS = ("api_answered", "creating", "placed", "op_published", "op_received",
         "process_launched", "agent_started", "agent_hello", "model_server_started",
         "model_server_listening", "model_server_healthy", "agent_ready", "active", "running")


class BenchError(RuntimeError):
    """The deployment did not come up, or a job did not start."""


# --- the deployment ----------------------------------------------------------------


def _port_free(port: int) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                return False
    return True


def free_base_port() -> int:
    """A base with the 21 ports ``up`` uses (base .. base+20) free, TCP and UDP."""
    for base in range(23000 + os.getpid() % 500 * 20, 60000, 97):
        if all(_port_free(base + i) for i in range(21)):
            return base
    raise BenchError("no 21 free ports in a row on 127.0.0.1")


@dataclass
class Up:
    storage: Path
    api: str
    #: None when attached to an ``up`` the bench did not start.
    process: subprocess.Popen | None = None
    output: Path | None = None
    token: str = ""
    backend: str = "local"
    job_timeout_s: float = JOB_TIMEOUT_S
    #: How many measured agents the worker forked (read before the logs go).
    forked: int | None = None

    def output_tail(self, size: int) -> str:
        if self.output is None:
            return f"(see the logs in {self.storage / 'logs'})"
        return self.output.read_text(errors="replace")[-size:]


#: The marks read from the agent's own log (the local backend's agent.log only).
AGENT_MARKS = ("agent_started", "model_server_started", "model_server_listening",
               "model_server_healthy")


def start_up(storage: Path, base: int, options: tuple[str, ...] = (),
             extra_env: dict[str, str] | None = None) -> Up:
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "COSMICAC_APP_NODE__LIMITS__PER_TOKEN__PER_SECOND": "1000",
           "COSMICAC_APP_NODE__LIMITS__PER_TOKEN__BURST": "1000", **(extra_env or {})}
    output = storage.parent / "up.out"
    with output.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "up", "--storage", str(storage),
             "--base-port", str(base), "--no-table", *options],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
    up = Up(storage, api=f"http://{HOST}:{base + 14}/api", process=process, output=output)
    deadline = time.monotonic() + UP_TIMEOUT_S
    while "cosmicac is up at" not in output.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_up(up)
            raise BenchError("cosmicac up did not come up: " + up.output_tail(2000))
        time.sleep(0.2)
    return up


def attach(storage: Path) -> Up:
    """The ``up`` running on ``storage``, reached through its entry point."""
    credentials = storage / "credentials.json"
    try:
        url = json.loads(credentials.read_text())["url"]
    except (OSError, ValueError, KeyError) as exc:
        raise BenchError(f"--attach {storage}: no running up's credentials there "
                         f"({credentials}: {exc})") from None
    return Up(storage, api=f"{url.rstrip('/')}/api")


def _ours(storage: Path) -> list[int]:
    """Processes whose command line or working folder is under ``storage``."""
    found = []
    needle = str(storage)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if needle in argv or cwd.startswith(needle):
            found.append(int(entry.name))
    return found


def stop_up(up: Up) -> int:
    """SIGINT ``up`` and wait; returns how many of its processes were left after it."""
    assert up.process is not None, "an attached up is not ours to stop"
    if up.process.poll() is None:
        up.process.send_signal(signal.SIGINT)
        try:
            up.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.process.pid, signal.SIGKILL)  # its own session: ours to end
            up.process.wait(timeout=10)
    time.sleep(0.5)  # let the reaped children vanish from /proc
    left = _ours(up.storage)
    for pid in left:  # report them, then leave nothing behind
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(left)


# --- one job -----------------------------------------------------------------------


@dataclass
class Run:
    job_id: str
    post_sent: float
    api_answered: float
    running: float
    marks: dict[str, float] = field(default_factory=dict)
    #: The agent's log, read before the delete removes its VMI folder.
    agent_log: list[tuple[float, str]] = field(default_factory=list)


def login(client: Any, up: Up) -> None:
    creds = json.loads((up.storage / "credentials.json").read_text())
    answer = client.post(f"{up.api}/auth/login",
                         json={"email": creds["email"], "password": creds["password"]})
    answer.raise_for_status()
    up.token = answer.json()["token"]
    client.headers["authorization"] = f"Bearer {up.token}"


def start_job(client: Any, up: Up, index: int, poll_s: float) -> Run:
    body = {"name": f"bench-start-{index}", "type": "inference", "image": IMAGE, "gpus": 1,
            "runtime": "local", "model": "demo", "served_name": f"bench-start-{index}"}
    sent = time.time()
    answer = client.post(f"{up.api}/jobs", json=body)
    answered = time.time()
    if answer.status_code != 201:
        raise BenchError(f"POST /api/jobs answered {answer.status_code}: {answer.text}")
    job_id = answer.json()["id"]
    deadline = time.monotonic() + up.job_timeout_s
    while time.monotonic() < deadline:
        got = client.get(f"{up.api}/jobs/{job_id}")
        seen = time.time()
        if got.status_code == 429:  # an attached up keeps its rate limits
            time.sleep(min(float(got.headers.get("retry-after", 1)), 5.0))
            continue
        if got.status_code == 200:
            status = got.json()["status"]
            if status == "running":
                return Run(job_id, sent, answered, seen)
            if status in ("failed", "unknown"):
                raise BenchError(f"job {job_id} is {status}: {got.json().get('reason')}")
        time.sleep(poll_s)
    raise BenchError(f"job {job_id} not running after {up.job_timeout_s:.0f} s")


def delete_job(client: Any, up: Up, job_id: str) -> None:
    client.delete(f"{up.api}/jobs/{job_id}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if client.get(f"{up.api}/jobs/{job_id}").status_code == 404:
            return
        time.sleep(0.2)
    raise BenchError(f"job {job_id} was not gone 60 s after its delete")


# --- the logs ----------------------------------------------------------------------


def _lines(path: Path) -> list[tuple[float, str]]:
    """(POSIX seconds, message) of a daemon's JSON-lines log."""
    out = []
    if not path.exists():
        return out
    for raw in path.read_text(errors="replace").splitlines():
        if not raw.startswith("{"):
            continue
        try:
            record = json.loads(raw)
            when = datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError):
            continue
        out.append((when, str(record.get("message", ""))))
    return out


def _first(lines: list[tuple[float, str]], *needles: str, after: float = 0.0) -> float | None:
    for when, message in lines:
        if when >= after and all(n in message for n in needles):
            return when
    return None


def _status_at(lines: list[tuple[float, str]], job_id: str, status: str) -> float | None:
    for _, message in lines:
        if f"ork.job_status job={job_id} status={status} " in message:
            return float(message.rpartition("at=")[2])
    return None


def _vmi(job_id: str) -> str:
    return "cac-" + job_id.removeprefix("j-") + "-r0-n0"


def agent_log(up: Up, job_id: str) -> Path:
    return up.storage / WORKER_LOG / "vmis" / f"{_vmi(job_id)}-root" / "agent.log"


def read_marks(up: Up, run: Run) -> None:
    logs = up.storage / "logs"
    ork, worker = _lines(logs / "wrk-ork.log"), _lines(logs / f"{WORKER_LOG}.log")
    vmi, agent = _vmi(run.job_id), run.agent_log
    marks: dict[str, float | None] = {
        "post_sent": run.post_sent, "api_answered": run.api_answered, "running": run.running,
        "creating": _status_at(ork, run.job_id, "creating"),
        "placed": _status_at(ork, run.job_id, "starting"),
        "active": _status_at(ork, run.job_id, "active"),
        "op_received": _first(worker, f"worker.create job={run.job_id} "),
        "process_launched": _first(worker, f"{up.backend}.started vmi={vmi} "),
        "agent_hello": _first(worker, f"agent.hello vmi={vmi} "),
        "agent_ready": _first(worker, f"agent.ready vmi={vmi} "),
        "agent_started": _first(agent, f"agent.started job={run.job_id} "),
        "model_server_started": _first(agent, "model_server.step_started", run.job_id),
        "model_server_listening": _first(agent, "listening http://"),
        "model_server_healthy": _first(agent, "model_server.healthy", run.job_id),
    }
    if up.backend != "local":
        for mark in AGENT_MARKS:
            del marks[mark]
    placed = marks["placed"]
    if placed is not None:  # one job at a time: the first publish after its placement
        marks["op_published"] = _first(ork, "ork.published", after=placed - 0.002)
    missing = [name for name, value in marks.items() if value is None]
    if missing:
        raise BenchError(f"job {run.job_id}: no log line for {', '.join(missing)} "
                         f"(see {logs})")
    run.marks = {name: value for name, value in marks.items() if value is not None}


# --- the run -----------------------------------------------------------------------


def forked_agents(up: Up, runs: list[Run]) -> int:
    """How many of ``runs``' agents the worker forked from its fork server."""
    worker = _lines(up.storage / "logs" / f"{WORKER_LOG}.log")
    return sum(1 for run in runs if any(
        f"local.started vmi={_vmi(run.job_id)} " in message and "via=fork" in message
        for _, message in worker))


def report(runs: list[Run], leftover: int | None, args: argparse.Namespace,
           reference: list[Run] | None = None, forked: int | None = None) -> None:
    values: dict[str, list[float]] = {}
    for run in runs:
        m = run.marks
        for step, start, end, _ in STEPS:
            values.setdefault(f"step_{step}", []).append((m[end] - m[start]) * 1000)
        values.setdefault("step_api", []).append((m["api_answered"] - m["post_sent"]) * 1000)
        values.setdefault("total", []).append((m["running"] - m["post_sent"]) * 1000)
        for mark in MARKS:
            if mark in m:
                values.setdefault(f"at_{mark}", []).append((m[mark] - m["post_sent"]) * 1000)
    first = True
    for metric, got in values.items():
        extra: dict[str, Any] = {"reps": [round(v, 1) for v in got]}
        if first:
            first = False
            extra.update(machine=machine(), jobs=len(runs), poll_ms=args.poll_ms,
                         backend=args.backend, model="demo", load_average=args.load_average)
        emit(BENCH, metric, statistics.median(got), "ms", **extra)
    if forked is not None:
        emit(BENCH, "forked_agents", forked, "count", of=len(runs))
    ours = statistics.median(values["total"])
    if reference:
        totals = [(r.marks["running"] - r.marks["post_sent"]) * 1000 for r in reference]
        theirs = statistics.median(totals)
        emit(BENCH, "reference_total", theirs, "ms", reps=[round(v, 1) for v in totals],
             reference="agents spawned (local.fork_server=false), same run")
        emit(BENCH, "ratio", theirs / ours, "x", note="reference_total / total (>1: ahead)")
    if leftover is not None:
        emit(BENCH, "leftover_processes", leftover, "count")
    out = sys.stderr
    print(f"{'step':<12}{'median ms':>10}{'min':>9}{'max':>9}  covers", file=out)
    rows = [(s, d) for s, _, _, d in STEPS] + [("api", "POST answered (overlaps ork, queue)"),
                                                ("total", "POST sent -> running seen")]
    for step, covers in rows:
        got = values["total" if step == "total" else f"step_{step}"]
        print(f"{step:<12}{statistics.median(got):>10.1f}{min(got):>9.1f}{max(got):>9.1f}  "
              f"{covers}", file=out)
    print("marks, ms after the POST (median): " + ", ".join(
        f"{mark} {statistics.median(values[f'at_{mark}']):.0f}" for mark in MARKS
        if f"at_{mark}" in values), file=out)
    ended = ("up left running (attached)" if leftover is None
             else f"leftover processes after up stopped: {leftover}")
    print(f"({len(runs)} jobs, one at a time; {ended})", file=out, flush=True)
    if reference:
        print(f"reference (agents spawned, same run): total {theirs:.1f} ms median, "
              f"{theirs / ours:.2f}x ours", file=out, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 job, no warm-up")
    parser.add_argument("--jobs", type=int, default=None, help="(default 5; 1 quick)")
    parser.add_argument("--warm-up", type=int, default=None,
                        help="jobs started first and not counted (default 1; 0 quick)")
    parser.add_argument("--poll-ms", type=float, default=20.0)
    parser.add_argument("--attach", type=Path, metavar="STORAGE", default=None,
                        help="measure the cosmicac up running on STORAGE (left running)")
    parser.add_argument("--backend", choices=("local", "qemu"), default="local",
                        help="qemu: every job a VM booted from the guest image")
    parser.add_argument("--image", type=Path, default=None,
                        help="--backend qemu: the guest image (default: build/image's)")
    parser.add_argument("--reference", choices=("spawn", "none"), default=None,
                        help="spawn (the default on local): also measure an up whose "
                        "worker spawns every agent")
    args = parser.parse_args(argv)
    if args.reference is None:
        args.reference = "spawn" if args.backend == "local" and args.attach is None else "none"
    for name, quick, full in (("jobs", 1, 5), ("warm_up", 0, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.load_average = [round(x, 2) for x in os.getloadavg()]

    if args.attach is not None:
        up = attach(args.attach)
        up.backend = args.backend
        runs = measure(up, args)
        for run in runs:
            read_marks(up, run)
        report(runs, None, args)
        return 0
    options: tuple[str, ...] = ()
    if args.backend == "qemu":
        options = ("--backend", "qemu", *(("--image", str(args.image.absolute()))
                                          if args.image else ()))
    runs, leftover, up = run_up(args, options)
    forked = up.forked
    reference = None
    if args.reference == "spawn":
        reference, left, _ = run_up(args, options, {
            "K8S_COMMON_CONFIG__LOCAL__FORK_SERVER": "false"})
        leftover += left
    report(runs, leftover, args, reference, forked)
    return 0 if leftover == 0 else 1


def run_up(args: argparse.Namespace, options: tuple[str, ...],
           extra_env: dict[str, str] | None = None) -> tuple[list[Run], int, Up]:
    """Start an ``up``, measure its jobs, stop it: (runs with their marks, processes
    left behind, the up, whose logs are gone by then)."""
    with tempfile.TemporaryDirectory(prefix="bench-job-start-") as tmp:
        up = start_up(Path(tmp) / "storage", free_base_port(), options, extra_env)
        up.backend = args.backend
        if args.backend == "qemu":
            up.job_timeout_s = 600.0  # a guest under software emulation boots in ~1 min
        try:
            runs = measure(up, args)
        finally:
            leftover = stop_up(up)
        for run in runs:  # the logs are complete once up has stopped
            read_marks(up, run)
        up.forked = forked_agents(up, runs) if args.backend == "local" else None
    return runs, leftover, up


def measure(up: Up, args: argparse.Namespace) -> list[Run]:
    """Log in, then start, time and delete ``warm_up + jobs`` jobs one at a time."""
    import httpx

    runs: list[Run] = []
    try:
        with httpx.Client(timeout=30.0) as client:
            login(client, up)
            for index in range(args.warm_up + args.jobs):
                run = start_job(client, up, index, args.poll_ms / 1000)
                if up.backend == "local":
                    run.agent_log = _lines(agent_log(up, run.job_id))
                delete_job(client, up, run.job_id)
                if index >= args.warm_up:
                    runs.append(run)
    except (BenchError, httpx.HTTPError) as exc:
        raise BenchError(f"{exc}; up's output: {up.output_tail(1500)}") from exc
    return runs

if __name__ == "__main__":
    sys.exit(main())
