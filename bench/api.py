"""app-node's HTTP API under load: job listing and API-key creation, with 100
users and 1,000 jobs.

The system under test is real and runs as its own processes, as in a
deployment: app-node (``cosmicac run app-node --config F``, its API on the
lean HTTP server ``p2p.httpserver``) wired to wrk-ork
(``cosmicac run wrk-ork --config F``) over the swarm on 127.0.0.1, both with
fsync on (their defaults). The clients are ``wrk`` (C, one thread; see
``_load.py``): a Python load generator on the same two cores would take as
much CPU per request as app-node and cap the figures.

Seeding, before the daemons start, straight into their store files through
the same classes the daemons use (:class:`nodes.app_node.store.Store`,
:class:`nodes.ork.orchestrator.Orchestrator`): ``--users`` users (the first is
the sign-up admin and owns the team, the others are members) with one session
token each, ``--jobs`` jobs in wrk-ork and their records in app-node's store.
Through the API it would cost a scrypt hash per user and a round trip per
job and measure nothing asked for here. ``GET /api/jobs`` reads a page from
app-node's store (the session's token, user and role and the first page: kept
answers read on the event loop while the store is unchanged, else one trip to
a worker thread; ``nodes/app_node/store/_read_cache.py``) and the page's live
statuses from app-node's copy of wrk-ork's jobs
(``nodes/app_node/job_projection.py``, kept from the ``jobs.watch`` it
follows): wrk-ork does nothing per listing (its ``cpu_ms_per_req_*_ork``
stays near 0). The runs start once app-node's ``/metrics`` says the copy is
synced (``app_node_jobs_copy_synced 1``); before that the listing asks wrk-ork
per request, as it did before the copy. The jobs wait as Pending: wrk-ork
knows one rack (the bench's, registered in the seed) that never reports, so
nothing is placed and no worker is needed. One job in four is an inference
job (runtime local, model demo), the others containers, 1 to 8 GPUs.

Users and jobs are spread over ``--teams`` teams, 10 by default (10 users and
100 jobs a team; the admin owns them all); ``--teams 1`` puts all 1,000 jobs
in one team (the issue's "a page of 50 of 1,000 jobs"). A listing's cost no
longer grows with the team (it once asked wrk-ork for all of the team's jobs,
and a 1,000-job answer was over the mux's 512 KiB message limit).

Figures (JSON lines ``{"bench": "api", "route": ..., "metric": ...}``), per
route, the median of ``--reps`` runs of ``--duration`` s, each at 1 and at
``--connections`` kept-alive connections (closed loop), every request with
the next user's bearer token in turn:

* ``GET /api/jobs`` (its default page: ``limit=50``, newest first);
* ``POST /api/apikeys`` ``{"name": ...}``: a key written to the shared
  database (app-node's replica, an fsync'd log) and recorded in app-node's
  SQLite (``synchronous=FULL``).

``rps_C`` (req/s), ``latency_p50_C`` / ``latency_p99_C`` (ms), ``errors_C``
(non-2xx, socket errors, timeouts), ``cpu_ms_per_req_C_app`` /
``_ork`` (CPU of each daemon per request, ``/proc``), ``loadgen_cpu_C`` (wrk's
own CPU in cores). The rate limits are raised in app-node's config (they
would answer 429 past 10 req/s per token); the limiter still runs on every
request. A table follows on stderr.

``--profile DIR`` samples both daemons with py-spy during the first rep's
loaded runs and prints where their time went (``_profile.py``).

usage: python bench/api.py [--quick] [--users 100] [--jobs 1000] [--teams 1]
                           [--reps 3] [--duration 5] [--warm-up 1] [--connections 32]
                           [--profile DIR] [--requests N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import emit, machine
from _load import LoadError, cpu_seconds, run_wrk
from _profile import record, summarize

BENCH = "api"
HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent
#: The page ``GET /api/jobs`` returns without ``limit`` (nodes/app_node/api/_jobs.py).
DEFAULT_PAGE = 50
START_TIMEOUT_S = 60.0
IMAGE = "docker://registry.local/bench:latest"


# --- seeding -----------------------------------------------------------------------


@dataclass
class Seeded:
    """What the seed made: the bearer tokens and the daemons' keys."""

    tokens: list[str]
    app_key: str
    ork_key: str
    teams: list[str]
    jobs: int


def _spec(index: int, team: str) -> Any:
    from contracts.model import JobSpec

    gpus = 1 + index % 8
    if index % 4 == 0:
        return JobSpec(name=f"bench-inference-{index}", team=team, type="inference",
                       image=IMAGE, gpus=gpus, runtime="local", model="demo",
                       served_name=f"bench-{index}")
    return JobSpec(name=f"bench-container-{index}", team=team, type="container",
                   image=IMAGE, gpus=gpus)


def seed(workdir: Path, *, users: int, jobs: int, teams: int) -> Seeded:
    """Write users, teams, tokens and job records into app-node's store and the
    jobs into wrk-ork's, before either starts (see the module doc)."""
    from nodes.app_node.auth import hash_password, new_token
    from nodes.app_node.store import Store
    from nodes.ork.orchestrator import Orchestrator
    from p2p.keys import KeyPair, load_or_create_keypair

    app_dir, ork_dir = workdir / "app-node", workdir / "wrk-ork"
    app_dir.mkdir()
    ork_dir.mkdir()
    app_key = load_or_create_keypair(app_dir).hex
    ork_key = load_or_create_keypair(ork_dir).hex
    now = time.time()
    password = hash_password("bench-password-not-used")  # one scrypt hash, shared
    store = Store.open(app_dir / "app-node.sqlite")
    orch = Orchestrator.open(ork_dir / "ork.sqlite")
    try:
        admin, first = store.users.create_first_admin(email="user0@bench.local", name="user 0",
                                                      password_hash=password, team_name="bench-0",
                                                      now=now)
        team_ids = [first.id]
        for t in range(1, teams):
            team_ids.append(store.teams.create(name=f"bench-{t}", owner=admin.id, now=now).id)
        user_ids, tokens = [admin.id], []
        for u in range(1, users):
            user = store.users.create(email=f"user{u}@bench.local", name=f"user {u}",
                                      password_hash=password, now=now)
            team = team_ids[u % teams]
            store.teams.add_member(team, user.id, "member")
            store.users.set_active_team(user.id, team)
            user_ids.append(user.id)
        for user_id in user_ids:
            token, token_hash = new_token()
            store.tokens.add(token_hash=token_hash, user=user_id, kind="session", now=now,
                             expires_at=now + 86400)
            tokens.append(token)
        # A rack that never reports: every job waits Pending for its capacity.
        orch.register_rack(KeyPair.generate().hex, "default", now, name="bench")
        for index in range(jobs):
            team = team_ids[index % teams]
            view = orch.create_job(_spec(index, team), now + index * 1e-3)
            store.jobs.add(id=view.id, team=team, created_by=user_ids[index % users],
                           spec=view.spec, now=now + index * 1e-3)
    finally:
        orch.close()
        store.close()
    return Seeded(tokens=tokens, app_key=app_key, ork_key=ork_key, teams=team_ids, jobs=jobs)


# --- the daemons -------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: each probe is held open until all are chosen
    (one probe at a time could be given the same port twice: the daemons then
    failed to start, "Address already in use")."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind((HOST, 0))
        return [probe.getsockname()[1] for probe in probes]


@dataclass
class Daemons:
    api: str
    pids: dict[str, int]
    logs: dict[str, Path] = field(default_factory=dict)


def _wait_ready(proc: subprocess.Popen, log: Path, daemon: str) -> None:
    from nodes.kit.ready import find_ready

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if find_ready(text.splitlines()[:text.count("\n")], daemon) is not None:
            return
        if proc.poll() is not None:
            raise LoadError(f"{log.stem} exited {proc.returncode}: "
                            + log.read_text(errors="replace")[-1500:])
        time.sleep(0.1)
    raise LoadError(f"{log.stem} did not print its ready line within {START_TIMEOUT_S:.0f} s")


@contextlib.contextmanager
def start_daemons(workdir: Path, seeded: Seeded) -> Iterator[Daemons]:
    """wrk-ork, then app-node, each ``cosmicac run`` in its own process."""
    ork_port, app_port, http_port, metrics_port = free_ports(4)
    unlimited = {"per_second": 1e6, "burst": 1_000_000}
    configs = {
        "wrk-ork": {"storage": str(workdir / "wrk-ork"), "host": HOST, "port": ork_port,
                    "app_nodes": [seeded.app_key]},
        "app-node": {"storage": str(workdir / "app-node"), "host": HOST, "port": app_port,
                     "ork": seeded.ork_key, "ork_addresses": [f"{HOST}:{ork_port}"],
                     "http": {"host": HOST, "port": http_port},
                     "metrics": {"host": HOST, "port": metrics_port},
                     "limits": {"per_token": unlimited, "per_ip": unlimited}},
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COSMICAC_LOG_LEVEL": "warning"}
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    try:
        for name in ("wrk-ork", "app-node"):
            config = workdir / f"{name}.json"
            config.write_text(json.dumps(configs[name]))
            logs[name] = workdir / f"{name}.log"
            with logs[name].open("wb") as out:
                procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "cli.main", "run", name, "--config", str(config)],
                    stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            _wait_ready(procs[name], logs[name], name)
        api = f"http://{HOST}:{http_port}/api"
        _wait_ork(api, seeded)
        _wait_synced(f"http://{HOST}:{metrics_port}/metrics")
        yield Daemons(api=api, pids={"app": procs["app-node"].pid, "ork": procs["wrk-ork"].pid},
                      logs=logs)
    finally:
        for proc in reversed(list(procs.values())):
            proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def _get(url: str, token: str) -> tuple[int, Any]:
    import httpx

    answer = httpx.get(url, headers={"authorization": f"Bearer {token}"}, timeout=15)
    return answer.status_code, answer.json()


def _wait_ork(api: str, seeded: Seeded) -> None:
    """Until app-node reaches wrk-ork (the listing answers 200 with a full page)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    status, body = 0, None
    while time.monotonic() < deadline:
        status, body = _get(f"{api}/jobs", seeded.tokens[0])
        if status == 200:
            expected = min(DEFAULT_PAGE, seeded.jobs // len(seeded.teams))
            if len(body["jobs"]) != expected:
                raise LoadError(f"GET /api/jobs gave {len(body['jobs'])} jobs, not {expected}")
            return
        time.sleep(0.2)
    raise LoadError(f"app-node never listed the jobs: {status} {body} (with --teams 1 "
                    "and 1,000 jobs, wrk-ork's jobs.list answer is over the mux's 512 KiB "
                    "message limit: see the module doc)")


def _wait_synced(metrics_url: str) -> None:
    """Until app-node's copy of wrk-ork's jobs answers reads (its ``/metrics``)."""
    import httpx

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        text = httpx.get(metrics_url, timeout=15).text
        if "app_node_jobs_copy_synced 1.0" in text:
            return
        time.sleep(0.1)
    raise LoadError("app-node's copy of wrk-ork's jobs never synced (app_node_jobs_copy_synced "
                    f"at {metrics_url}); the listing would measure calls to wrk-ork")


# --- measuring ---------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    path: str
    body: dict[str, Any] | None


ROUTES = (Route("GET /api/jobs", "GET", "/jobs", None),
          Route("POST /api/apikeys", "POST", "/apikeys", {"name": "bench"}))


@dataclass
class Samples:
    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, route: str, metric: str, value: float) -> None:
        self.values.setdefault((route, metric), []).append(value)

    def median(self, route: str, metric: str) -> float | None:
        got = self.values.get((route, metric))
        return statistics.median(got) if got else None


def load(daemons: Daemons, route: Route, tokens: list[str], connections: int,
         duration_s: float, samples: Samples, profile: Path | None = None,
         max_requests: int | None = None) -> None:
    spies = []
    if profile is not None:  # sample both daemons through the run (see _profile.py)
        slug = route.name.split()[1].strip("/").replace("/", "_")
        for name, pid in daemons.pids.items():
            out = profile / f"{slug}-{connections}c-{name}.txt"
            spy = record(pid, duration_s, out)
            if spy is not None:
                spies.append((name, out, spy))
    before = {name: cpu_seconds([pid]) for name, pid in daemons.pids.items()}
    got = run_wrk(daemons.api + route.path, route.body, api_key=None, method=route.method,
                  bearers=tokens, connections=connections, duration_s=duration_s,
                  max_requests=max_requests)
    c = connections
    samples.add(route.name, f"rps_{c}", got.rate)
    samples.add(route.name, f"errors_{c}", got.errors)
    samples.add(route.name, f"loadgen_cpu_{c}", got.cpu_cores)
    if got.requests:
        samples.add(route.name, f"latency_p50_{c}", got.p50_ms)
        samples.add(route.name, f"latency_p99_{c}", got.p99_ms)
        for name, pid in daemons.pids.items():
            used = cpu_seconds([pid]) - before[name]
            samples.add(route.name, f"cpu_ms_per_req_{c}_{name}", used * 1000 / got.requests)
    for name, out, spy in spies:
        spy.wait(timeout=60)
        print(f"# py-spy {name} during {route.name} at {c} connections "
              "(% of samples with the function on the stack):", file=sys.stderr)
        for share, function in summarize(out, top=30) if out.exists() else []:
            print(f"#  {share:5.1f}%  {function}", file=sys.stderr)


UNITS = {"rps": "req/s", "latency": "ms", "errors": "count", "loadgen_cpu": "cores",
         "cpu_ms": "ms"}


def _unit(metric: str) -> str:
    return next((unit for prefix, unit in UNITS.items() if metric.startswith(prefix)), "")


#: Issue 26's targets: (route, metric) -> (what is aimed at, check), at 32 connections.
TARGETS: dict[tuple[str, str], tuple[str, Any]] = {
    ("GET /api/jobs", "rps_32"): (">= 1000 req/s", lambda v: v >= 1000),
    ("GET /api/jobs", "latency_p99_32"): ("<= 50 ms", lambda v: v <= 50),
}


def report(samples: Samples, args: argparse.Namespace, seeded: Seeded) -> None:
    first = True
    verdicts: list[str] = []
    for route in ROUTES:
        for metric in sorted({m for (r, m) in samples.values if r == route.name}):
            value = samples.median(route.name, metric)
            assert value is not None
            extra: dict[str, Any] = {"route": route.name,
                                     "reps": sorted(samples.values[(route.name, metric)])}
            if first:
                first = False
                extra.update(machine=machine(), users=args.users, jobs=args.jobs,
                             teams=args.teams, page=DEFAULT_PAGE, duration_s=args.duration,
                             load_average=args.load_average)
            if (route.name, metric) in TARGETS:
                target, check = TARGETS[(route.name, metric)]
                met = bool(check(value))
                extra.update(target=target, met=met)
                verdicts.append(f"{route.name} {metric} {value:.2f} (target {target}): "
                                f"{'met' if met else 'NOT met'}")
            emit(BENCH, metric, value, _unit(metric), **extra)
    c = args.connections
    columns = [("req/s 1c", "rps_1"), ("p50 1c", "latency_p50_1"), ("p99 1c", "latency_p99_1"),
               (f"req/s {c}c", f"rps_{c}"), (f"p50 {c}c", f"latency_p50_{c}"),
               (f"p99 {c}c", f"latency_p99_{c}"), ("app ms/req", "cpu_ms_per_req_1_app"),
               ("ork ms/req", "cpu_ms_per_req_1_ork")]
    out = sys.stderr
    print(f"{'route':<18}" + "".join(f"{title:>12}" for title, _ in columns), file=out)
    for route in ROUTES:
        cells = []
        for _, metric in columns:
            value = samples.median(route.name, metric)
            cells.append(f"{'-' if value is None else f'{value:.2f}':>12}")
        print(f"{route.name:<18}" + "".join(cells), file=out)
    print(f"({args.users} users, {seeded.jobs} jobs in {args.teams} team(s), page "
          f"{DEFAULT_PAGE}; ms; ms/req = the daemon's CPU per request at 1 client)",
          file=out)
    for verdict in verdicts:
        print(f"issue 26: {verdict}", file=out)
    print(f"load average {args.load_average} on {os.cpu_count()} cores", file=out, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 rep of 2 s runs")
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--teams", type=int, default=10,
                        help="users and jobs are spread evenly over this many teams "
                             "(default 10: 100 jobs a team; see the module doc for 1)")
    parser.add_argument("--reps", type=int, default=None, help="(default 3; 1 quick)")
    parser.add_argument("--warm-up", type=float, default=1.0,
                        help="seconds of load per route before the runs (caches, connections; "
                             "wrk runs whole seconds; 0: none)")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per wrk run (default 5; 2 quick)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--requests", type=int, default=None, metavar="N",
                        help="a smoke run: each wrk run stops after N answers (the "
                        "figures print; rates and CPU per request mean nothing)")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="py-spy both daemons during the first rep's runs at "
                             "--connections; stacks in DIR, a summary on stderr")
    args = parser.parse_args(argv)
    for name, quick, full in (("reps", 1, 3), ("duration", 2.0, 5.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if not (1 <= args.teams <= args.users):
        parser.error("--teams must be between 1 and --users")
    args.load_average = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        workdir = Path(tmp)
        began = time.perf_counter()
        seeded = seed(workdir, users=args.users, jobs=args.jobs, teams=args.teams)
        print(f"seeded {args.users} users and {args.jobs} jobs in "
              f"{time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
        with start_daemons(workdir, seeded) as daemons:
            samples = Samples()
            for route in ROUTES if args.warm_up > 0 else ():
                # warm-up: connections opened, caches and the OS page cache filled
                run_wrk(daemons.api + route.path, route.body, api_key=None,
                        method=route.method, bearers=seeded.tokens, connections=4,
                        duration_s=args.warm_up)
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
            for rep in range(args.reps):
                for route in ROUTES:
                    for connections in (1, args.connections):
                        spy = args.profile if rep == 0 and connections > 1 else None
                        load(daemons, route, seeded.tokens, connections, args.duration,
                             samples, spy, max_requests=args.requests)
            report(samples, args, seeded)
    return 0


if __name__ == "__main__":
    sys.exit(main())
