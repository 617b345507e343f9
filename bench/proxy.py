"""Inference proxy benchmark: what a proxy adds in front of a model server, ours
against LiteLLM's, side by side in one run, against the same model server.

The model server is ours (``python -m agents.inference.server --model demo``,
one process, p2p.httpserver on trio); a chat with ``max_tokens: 1`` answers at once,
so what is measured is the HTTP path and the proxies, not a model. Legs:

* ``direct``: clients -> the model server.
* ``litellm``: clients -> LiteLLM's proxy (PyPI ``litellm[proxy]``) -> the model
  server. It lives in its own venv, ``bench/.venv-litellm`` (made with
  ``litellm[proxy]`` and ``httptools`` by this script when missing, once, a
  few minutes; ``--litellm-venv`` to move it; never in the project's venv:
  it pins many packages). Run as ``litellm --config C --host 127.0.0.1 --port
  M --num_workers 1`` (one process, like ours; uvicorn with uvloop and
  httptools), config: ``openai/demo`` at ``http://127.0.0.1:N/v1`` with
  ``api_key: dummy``, a fixed ``master_key`` (ours checks an API key too;
  without a database the master key is LiteLLM's cheapest authenticated
  path), no database, no callbacks, no spend logs, ``LITELLM_LOG=ERROR``,
  ``LITELLM_MODE=PRODUCTION``. Nothing leaves 127.0.0.1: the bundled
  catalogues instead of fetched ones (``LITELLM_OFFLINE_MODE=true`` and the
  per-catalogue ``LITELLM_LOCAL_*=true``), usage telemetry off (its
  ``LITELLM_TELEMETRY_*`` variables unset; ``LITELLM_TELEMETRY=False`` for
  older versions), no HTTP proxy variables.
* ``ours``: clients -> proxy-inference -> (swarm, RPC) -> agent-inference ->
  its model server; see :func:`start_ours`. Printed as ``{"leg": "ours",
  "skipped": reason}`` while a piece is missing or does not come up.

Figures, each a JSON line ``{"bench": "proxy", "leg": ..., "metric": ...}``;
every measurement is repeated ``--reps`` times, the legs taking turns within
a rep (the machine is noisy), and the median of the reps is printed:

1. ``latency_p50_1`` / ``latency_p99_1`` (ms): a non-streaming chat,
   ``max_tokens: 1``, one client, one request at a time (``wrk -c1``);
   ``added_p50_1`` / ``added_p99_1``: the same minus ``direct``'s.
   ``cpu_ms_per_req_1``: user + system CPU of every process of the leg (the
   model server's included; ``/proc``) per request in that run, and
   ``added_cpu_ms_per_req_1`` the same minus ``direct``'s: what the proxy
   costs, the figure that other load on the machine moves least;
   ``cpu_ms_per_req_1_<process>`` splits it (``proxy``, ``agent``,
   ``litellm``, ``model_server``).
2. ``rps_64`` (req/s), ``latency_p50_64`` / ``latency_p99_64`` (ms): the same
   request from 64 kept-alive connections (``wrk -t1 -c64``, closed loop);
   ``errors_64``: non-2xx, timeouts and socket errors. ``wrk`` in C is the
   load generator so that it is not the bottleneck: ``loadgen_cpu_64`` is
   its own CPU over the run in cores (well below 1: not the limit), and
   ``direct``'s rate is the ceiling the model server leaves.
3. ``stream_chunks_per_s_1`` / ``stream_chunks_per_s_N`` (SSE events/s, all
   streams together, over the batch's wall time) with 1 and
   ``--stream-clients`` streams at once, streams started for ``--duration``
   seconds (at most ``--streams``), and ``ttfc_p50_1`` / ``ttfc_p99_1``
   (ms, request sent -> first ``data:`` event, 1 stream at a time). The demo
   engine's answers are short (at most 32 tokens whatever ``max_tokens``), so
   the prompt is the one with the longest answer among 400 tried;
   ``stream_chunks`` says how many events a stream carried;
   ``cpu_us_per_chunk_1`` / ``_N``: user + system CPU of every process of the
   leg per event (the figure the machine's other load moves least).

A short table follows on stderr. Targets (issue 26), printed beside ``ours``:
p50 added latency <= 1.0 ms; req/s at 64 clients >= 0.8 of ``direct``'s (the
model server alone, same run); SSE chunks/s at 1 and N streams >= 0.7 of
``direct``'s; ahead of LiteLLM's proxy on each. ``<metric>_of_direct`` is
ours (and LiteLLM's) over ``direct``'s, rep by rep, then the median.

usage: python bench/proxy.py [--quick] [--reps 3] [--duration 5] [--warm-up 2]
                             [--legs direct litellm ours] [--stream-clients 8]
                             [--streams 1000] [--litellm-venv bench/.venv-litellm]
                             [--requests N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from _common import emit, machine
from _load import (
    LoadError,
    children,
    cpu_seconds,
    http_get_status,
    post_status,
    run_streams,
    run_wrk,
)

BENCH = "proxy"
HOST = "127.0.0.1"
MODEL = "demo"
#: LiteLLM's key for the bench (a fixed master key; see the module doc).
LITELLM_KEY = "sk-bench-litellm"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_LITELLM_VENV = HERE / ".venv-litellm"
#: What we install into that venv: the proxy, and httptools, the HTTP parser
#: uvicorn picks when present (its ``standard`` extra; faster than h11).
LITELLM_REQUIREMENTS = ("litellm[proxy]", "httptools")


class LegUnavailable(Exception):
    """A leg cannot be started here; its reason is printed and the run goes on."""


@dataclass
class Leg:
    """Where the clients of one leg send their requests."""

    name: str
    port: int
    api_key: str | None = None
    model: str = MODEL
    info: dict[str, Any] = field(default_factory=dict)
    #: Every process the leg's requests go through (the model server's too):
    #: their CPU per request is the figure the machine's noise moves least.
    #: Named (``proxy``, ``agent``, ``model_server``...) for the breakdown.
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/v1/chat/completions"


# --- processes ---


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, port: int, path: str, timeout_s: float,
                log: Path, api_key: str | None = None) -> None:
    """Poll ``GET path`` until 200 (bounded); raise with the log's tail otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if trio.run(http_get_status, HOST, port, path, api_key) == 200:
            return
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise LegUnavailable(f"not ready on port {port} within {timeout_s:.0f} s: {tail}")


@contextlib.contextmanager
def _process(argv: list[str], log: Path, env: dict[str, str] | None = None,
             ) -> Iterator[subprocess.Popen]:
    """A child process in its own session, output to ``log``; SIGTERM, then
    SIGKILL after 10 s, on the way out (only this child's own process group)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=ROOT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(timeout=10)


def _project_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@contextlib.contextmanager
def start_model_server(workdir: Path) -> Iterator[tuple[int, int]]:
    """Our model server with the demo engine, in a subprocess; yields (port, pid)."""
    port = _free_port()
    log = workdir / "model-server.log"
    argv = [sys.executable, "-m", "agents.inference.server", "--model", MODEL,
            "--served-name", MODEL, "--host", HOST, "--port", str(port)]
    with _process(argv, log, _project_env()) as proc:
        _wait_ready(proc, port, "/health", 60, log)
        yield port, proc.pid


# --- legs ---


@contextlib.contextmanager
def start_direct(workdir: Path, model_port: int, model_pid: int) -> Iterator[Leg]:
    yield Leg("direct", model_port, info={"how": "clients -> model server"},
              pids={"model_server": model_pid})


def ensure_litellm(venv: Path) -> Path:
    """The ``litellm`` executable of ``venv``, made and filled with
    :data:`LITELLM_REQUIREMENTS` from PyPI (pip, minutes) when missing."""
    exe = venv / "bin" / "litellm"
    if exe.exists():
        return exe
    print(f"# installing {' '.join(LITELLM_REQUIREMENTS)} into {venv} (once; minutes)",
          file=sys.stderr, flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    steps = [[base, "-m", "venv", str(venv)],
             [str(venv / "bin" / "pip"), "install", "-q", *LITELLM_REQUIREMENTS]]
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
        if done.returncode != 0:
            raise LegUnavailable(f"{' '.join(argv[:3])} failed: {done.stderr.strip()[-500:]}")
    (venv / ".gitignore").write_text("*\n")  # keep the venv out of git status
    if not exe.exists():
        raise LegUnavailable(f"{exe} missing after installing {LITELLM_REQUIREMENTS}")
    return exe


def litellm_env() -> dict[str, str]:
    """LiteLLM at its fastest and silent: no telemetry, no fetches, errors only."""
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
           and not k.startswith(("LITELLM_", "OPENAI_", "DATABASE_URL", "REDIS_"))}
    env.update(
        LITELLM_LOG="ERROR",
        LITELLM_MODE="PRODUCTION",  # no .env loading
        # No fetches of catalogues at start or later: the bundled copies.
        # OFFLINE_MODE covers them all in versions that have it; the per-file
        # switches do in those that do not (1.108).
        LITELLM_OFFLINE_MODE="true",
        LITELLM_LOCAL_MODEL_COST_MAP="true",
        LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS="true",
        LITELLM_LOCAL_AUTOROUTER_PRESETS="true",
        LITELLM_LOCAL_POLICY_TEMPLATES="true",
        LITELLM_LOCAL_BLOG_POSTS="true",
        # Usage telemetry is off unless LITELLM_TELEMETRY_GROUPS/_DESTINATION
        # are set (dropped above); the old switch, for older versions:
        LITELLM_TELEMETRY="False",
        NO_PROXY="*",
        no_proxy="*",
        PYTHONUNBUFFERED="1",
    )
    return env


def litellm_config(model_port: int) -> dict[str, Any]:
    return {
        "model_list": [{
            "model_name": MODEL,
            "litellm_params": {
                "model": f"openai/{MODEL}",
                "api_base": f"http://{HOST}:{model_port}/v1",
                "api_key": "dummy",
            },
        }],
        "litellm_settings": {"telemetry": False, "set_verbose": False,
                             "drop_params": True, "callbacks": []},
        "general_settings": {"master_key": LITELLM_KEY, "disable_spend_logs": True},
    }


@contextlib.contextmanager
def start_litellm(workdir: Path, model_port: int, model_pid: int, venv: Path
                  ) -> Iterator[Leg]:
    exe = ensure_litellm(venv)
    config = workdir / "litellm.yaml"
    # JSON is YAML: no yaml writer needed.
    config.write_text(json.dumps(litellm_config(model_port), indent=1))
    port = _free_port()
    log = workdir / "litellm.log"
    argv = [str(exe), "--config", str(config), "--host", HOST, "--port", str(port),
            "--num_workers", "1"]
    with _process(argv, log, litellm_env()) as proc:
        _wait_ready(proc, port, "/health/liveliness", 180, log)
        version = subprocess.run(
            [str(venv / "bin" / "python"), "-c",
             "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True, text=True, check=False).stdout.strip()
        yield Leg("litellm", port, api_key=LITELLM_KEY,
                  info={"how": "clients -> litellm proxy (1 worker) -> model server",
                        "litellm_version": version},
                  pids={"litellm": proc.pid, "model_server": model_pid})


# --- ours: everything of this leg is in these two functions ---

#: The ours leg's API key (a secret; only its hash goes into the database).
OURS_SECRET = "sk-bench-ours-0123456789abcdef"
OURS_TEAM = "t1"  # tests/nodes/control_path.py's inference jobs are team t1's


@contextlib.contextmanager
def start_ours(workdir: Path) -> Iterator[Leg]:
    """clients -> proxy-inference -> (swarm, RPC) -> agent-inference -> model server.

    The whole deployment runs in a spawned child (:func:`_ours_world`), which
    supervises the daemons as processes, as production runs them: wrk-ork, a
    worker (``local`` backend) whose agent-inference runs the job's own model
    server (the same program and engine as ``direct``'s, its own process), and
    ``cosmicac run proxy-inference``; the child itself is the DHT bootstrap and
    holds the shared database with the bench's API key. Everything it needs is
    imported there, so the other legs run while a piece is missing: the child
    reports the reason and this raises :class:`LegUnavailable`.
    """
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    answers = context.Queue()
    child = context.Process(target=_ours_world, args=(answers, str(workdir / "ours")),
                            daemon=False)
    child.start()
    try:
        try:
            answer = answers.get(timeout=240)
        except Exception:  # queue.Empty: the deployment never came up
            raise LegUnavailable("the ours deployment was not up within 240 s") from None
        if "error" in answer:
            raise LegUnavailable(answer["error"])
        yield Leg("ours", answer["port"], api_key=OURS_SECRET, info=answer["info"],
                  pids=answer["pids"])
    finally:
        child.terminate()  # SIGTERM: the child stops its daemons and agents first
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join(timeout=10)


def _ours_world(answers: Any, root: str) -> None:
    """The ours deployment (child process): put ``{"port", "pids", "info"}``
    (the proxy's HTTP port; the proxy, agent and model server processes) or
    ``{"error"}`` on ``answers``, then hold everything up until SIGTERM, and
    stop every process it started on the way out."""
    import signal
    import traceback

    os.chdir(ROOT)
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    try:
        from contracts.ork import REGISTER_RACK, RegisterRack
        from crdt import FsyncPolicy, PutApiKey, run_database_service
        from p2p.keys import KeyPair, load_or_create_keypair
        from p2p.swarm import Swarm, SwarmConfig
        from tests.nodes.control_path import ControlPath
        from tests.nodes.ork_driver import inference, status
        from tests.ports import free_port
    except ImportError as exc:
        answers.put({"error": f"{type(exc).__name__}: {exc}"})
        return
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)

    async def main() -> None:
        proxy_storage = base / "proxy"
        proxy_key = load_or_create_keypair(proxy_storage)  # the daemon loads the same
        node_key = load_or_create_keypair(base / "node")
        path: ControlPath | None = None

        async def stop_on_signal(scope: trio.CancelScope) -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    scope.cancel()
                    return

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stop_on_signal, nursery.cancel_scope)
                # 1. The DHT bootstrap and the shared database, with the API key.
                swarm = Swarm(node_key, config=SwarmConfig(host=HOST, port=0,
                                                           dht_persistent=True))
                _, node_port = await nursery.start(swarm.run)
                database = await nursery.start(functools.partial(
                    run_database_service, base / "node" / "db", swarm=swarm,
                    allow=frozenset({proxy_key.public_key}), fsync=FsyncPolicy.NEVER))
                await database.db.append([PutApiKey.with_secret(
                    "bench", OURS_TEAM, "bench", OURS_SECRET, (), int(time.time() * 1000))])
                bootstrap = f"{HOST}:{node_port}"
                # 2. wrk-ork and a local worker whose agents know the DHT and the proxy.
                # The proxy is one of wrk-ork's clients (proxy_keys); the agents
                # announce on the DHT whose bootstrap is the node above.
                path = ControlPath(base, nursery, KeyPair.generate(), free_port(), free_port(),
                                   proxy_keys=(proxy_key.hex,))
                await path.start_ork()
                await path.start_worker(interconnect={"bootstrap": [bootstrap],
                                                      "proxies": [proxy_key.hex]})
                await path.call(REGISTER_RACK, RegisterRack(rack=path.worker_key,
                                                            location="default"))
                await path.wait_rack_reported()
                job = await path.create(inference(name=MODEL))
                await path.wait_job(job.id, status("active"), limit_s=120)
                # 3. proxy-inference, one process.
                http_port = free_port()
                config = base / "proxy.json"
                config.write_text(json.dumps({
                    "storage": str(proxy_storage), "database": database.db.bootstrap.hex(),
                    "host": HOST, "port": free_port(), "bootstrap": [bootstrap],
                    "ork": path.ork_key, "ork_addresses": [path.ork_address],
                    "http": {"host": HOST, "port": http_port}, "fsync": False,
                    "log_format": "json"}))
                with (base / "proxy.log").open("wb") as log:
                    proxy = await trio.lowlevel.open_process(
                        [sys.executable, "-m", "cli.main", "run", "proxy-inference",
                         "--config", str(config)], stdout=log, stderr=log)
                path.processes.append(proxy)
                with trio.fail_after(120):
                    while await post_status(HOST, http_port, "/v1/chat/completions",
                                            chat_body(max_tokens=1), OURS_SECRET, 5) != 200:
                        if proxy.returncode is not None:
                            raise LegUnavailable(
                                f"proxy-inference exited {proxy.returncode}: "
                                + (base / "proxy.log").read_text(errors="replace")[-1500:])
                        await trio.sleep(0.5)
                agent = path.agent_pid(path.vmi_folders()[0])
                pids = {"proxy": proxy.pid, "agent": agent}
                for pid in _descendants(agent, "agents.inference.server")[:1]:
                    pids["model_server"] = pid
                answers.put({"port": http_port, "pids": pids,
                             "info": {
                    "how": "clients -> proxy-inference -> swarm RPC -> agent-inference -> "
                           "its model server (demo engine, own process)",
                    "job": job.id}})
                await trio.sleep_forever()  # until SIGTERM
        finally:
            if path is not None:
                path.stop_agents()
                for proc in path.processes:
                    if proc.returncode is None:
                        proc.kill()
                        with trio.move_on_after(10):
                            await proc.wait()

    try:
        trio.run(main)
    except BaseException as exc:  # report whatever stopped it, then leave
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        reason = (str(exc) if isinstance(exc, LegUnavailable)
                  else "".join(traceback.format_exception_only(type(exc), exc)).strip())
        with contextlib.suppress(Exception):
            answers.put({"error": f"the ours deployment failed: {reason[-1500:]}"})


def _descendants(pid: int, argv_contains: str, depth: int = 3) -> list[int]:
    """Processes below ``pid`` (``depth`` levels) whose command line holds
    ``argv_contains``: the agent may start its model server through a forked
    helper of its own, a grandchild."""
    found, level = [], [pid]
    for _ in range(depth):
        level = [child for parent in level for child in children(parent)]
        found += [child for child in level if argv_contains in _argv(child)]
    return found


def _argv(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


# --- measuring ---


def chat_body(*, max_tokens: int, stream: bool = False, prompt: str = "hi") -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0,
                            "messages": [{"role": "user", "content": prompt}]}
    if stream:
        body["stream"] = True
    return body


def longest_demo_prompt(tries: int = 400) -> tuple[str, int]:
    """A prompt whose demo answer is as long as the engine's answers get (40 tokens)."""
    from agents.inference.engines import ChatMessage, load_engine

    engine = load_engine(MODEL)
    best = ("hi", 0)
    for index in range(tries):
        prompt = f"tell me a story {index}"
        ids = engine.answer_ids(
            engine.tokenize(engine.chat_prompt([ChatMessage("user", prompt)])), temperature=0)
        if len(ids) > best[1]:
            best = (prompt, len(ids))
    return best


@dataclass
class Samples:
    """Per leg, per metric: one value per rep."""

    values: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    def add(self, leg: str, metric: str, value: float) -> None:
        self.values.setdefault((leg, metric), []).append(value)

    def median(self, leg: str, metric: str) -> float | None:
        got = self.values.get((leg, metric))
        return statistics.median(got) if got else None


def settle(leg: Leg) -> None:
    """Wait until one request answers: a load run's queued leftovers are done
    (a slow server still works through 64 requests after wrk stopped)."""
    trio.run(post_status, HOST, leg.port, "/v1/chat/completions", chat_body(max_tokens=1),
             leg.api_key, 60.0)


def load(leg: Leg, connections: int, duration_s: float, samples: Samples,
         max_requests: int | None = None) -> None:
    settle(leg)
    cpu_before = {name: cpu_seconds([pid]) for name, pid in leg.pids.items()}
    got = run_wrk(leg.url, chat_body(max_tokens=1), api_key=leg.api_key,
                  connections=connections, duration_s=duration_s, max_requests=max_requests)
    cpu = {name: cpu_seconds([pid]) - cpu_before[name] for name, pid in leg.pids.items()}
    c = connections
    if c == 1 and got.requests and cpu:  # 1 client: at most 1 request left unfinished
        samples.add(leg.name, "cpu_ms_per_req_1", sum(cpu.values()) * 1000 / got.requests)
        for name, seconds in cpu.items():
            samples.add(leg.name, f"cpu_ms_per_req_1_{name}", seconds * 1000 / got.requests)
    samples.add(leg.name, f"errors_{c}", got.errors)
    samples.add(leg.name, f"rps_{c}", got.rate)
    samples.add(leg.name, f"loadgen_cpu_{c}", got.cpu_cores)
    if got.requests:  # no answer at all within the run: no latency to speak of
        samples.add(leg.name, f"latency_p50_{c}", got.p50_ms)
        samples.add(leg.name, f"latency_p99_{c}", got.p99_ms)


def stream(leg: Leg, clients: int, streams: int, seconds: float, prompt: str,
           samples: Samples) -> None:
    settle(leg)
    body = chat_body(max_tokens=512, stream=True, prompt=prompt)
    cpu_before = cpu_seconds(list(leg.pids.values()))
    got = trio.run(lambda: run_streams(HOST, leg.port, "/v1/chat/completions", body,
                                       api_key=leg.api_key, clients=clients, streams=streams,
                                       time_limit_s=seconds))
    if got.chunks and leg.pids:  # every process of the leg, per event: the steadiest figure
        samples.add(leg.name, f"cpu_us_per_chunk_{clients}",
                    (cpu_seconds(list(leg.pids.values())) - cpu_before) * 1e6 / got.chunks)
    samples.add(leg.name, f"stream_chunks_per_s_{clients}", got.chunks_per_s)
    samples.add(leg.name, f"stream_errors_{clients}", got.errors)
    if got.streams:
        samples.add(leg.name, "stream_chunks", got.chunks / got.streams)
    if clients == 1 and got.ttfc_ms:
        ordered = sorted(got.ttfc_ms)
        samples.add(leg.name, "ttfc_p50_1", statistics.median(ordered))
        samples.add(leg.name, "ttfc_p99_1",
                    ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))])


def measure_rep(legs: list[Leg], args: argparse.Namespace, samples: Samples,
                stream_prompt: str) -> None:
    """One rep: each measurement taken on every leg in turn."""
    for leg in legs:
        load(leg, 1, args.duration, samples, args.requests)
    for leg in legs:
        load(leg, 64, args.duration, samples, args.requests)
    for leg in legs:
        for clients in (1, args.stream_clients):
            stream(leg, clients, args.streams, args.duration, stream_prompt, samples)


def warm_up(legs: list[Leg], seconds: float) -> None:
    for leg in legs:
        run_wrk(leg.url, chat_body(max_tokens=1), api_key=leg.api_key, connections=64,
                duration_s=seconds)


UNITS = {"latency": "ms", "added": "ms", "cpu_ms": "ms", "cpu_us": "us", "ttfc": "ms",
         "rps": "req/s",
         "loadgen_cpu": "cores", "stream_chunks_per_s": "chunks/s", "stream_chunks": "chunks",
         "errors": "count", "stream_errors": "count"}


def _unit(metric: str) -> str:
    if metric.endswith("_of_direct"):
        return "ratio"
    for prefix in sorted(UNITS, key=len, reverse=True):
        if metric.startswith(prefix):
            return UNITS[prefix]
    return ""


#: metric -> (what is aimed at, check(value, litellm's value or None)); the ratios
#: to direct are computed per rep in :func:`report`.
TARGETS: dict[str, tuple[str, Callable[[float, float | None], bool]]] = {
    "added_p50_1": ("<= 1.0 ms, below litellm's",
                    lambda v, lit: v <= 1.0 and (lit is None or v < lit)),
    "rps_64_of_direct": (">= 0.8 of direct's, above litellm's",
                         lambda v, lit: v >= 0.8 and (lit is None or v > lit)),
    "stream_chunks_per_s_1_of_direct": (">= 0.7 of direct's, above litellm's",
                                        lambda v, lit: v >= 0.7 and (lit is None or v > lit)),
    "stream_chunks_per_s_N_of_direct": (">= 0.7 of direct's, above litellm's",
                                        lambda v, lit: v >= 0.7 and (lit is None or v > lit)),
}


def report(legs: list[Leg], samples: Samples, args: argparse.Namespace) -> None:
    names = [leg.name for leg in legs]
    # Added latency per rep (the legs ran back to back in it), then the median.
    for leg in legs:
        for m in ("latency_p50_1", "latency_p99_1", "cpu_ms_per_req_1"):
            mine, ref = samples.values.get((leg.name, m)), samples.values.get(("direct", m))
            if leg.name != "direct" and mine and ref and len(mine) == len(ref):
                added = m.replace("latency", "added") if "latency" in m else "added_" + m
                samples.values[(leg.name, added)] = [
                    a - b for a, b in zip(mine, ref, strict=True)]
    # Ours and litellm's over direct's, rep by rep (the legs took turns within a rep).
    n = args.stream_clients
    for leg in legs:
        for m in ("rps_64", "stream_chunks_per_s_1", f"stream_chunks_per_s_{n}"):
            mine, ref = samples.values.get((leg.name, m)), samples.values.get(("direct", m))
            if leg.name != "direct" and mine and ref and len(mine) == len(ref):
                samples.values[(leg.name, f"{m}_of_direct")] = [
                    a / b if b else 0.0 for a, b in zip(mine, ref, strict=True)]
    targets = {metric.replace("_N_", f"_{n}_"): aim for metric, aim in TARGETS.items()}
    metrics = sorted({metric for (_, metric) in samples.values})
    litellm = {m: samples.median("litellm", m) for m in targets}
    verdicts: list[str] = []
    for leg in legs:
        first = True
        for metric in metrics:
            value = samples.median(leg.name, metric)
            if value is None:
                continue
            extra: dict[str, Any] = {"leg": leg.name,
                                     "reps": sorted(samples.values[(leg.name, metric)])}
            if first:
                first = False
                extra.update(leg.info, machine=machine(), load_average=args.load_average,
                             duration_s=args.duration,
                             stream_clients=args.stream_clients, streams=args.streams)
            if leg.name == "ours" and metric in targets:
                target, check = targets[metric]
                met = check(value, litellm[metric])
                extra.update(target=target, met=met)
                verdicts.append(f"{metric} {value:.2f} {'met' if met else 'NOT met'}")
            emit(BENCH, metric, value, _unit(metric), **extra)
    columns = [("p50 1c", "latency_p50_1"), ("p99 1c", "latency_p99_1"),
               ("+p50", "added_p50_1"), ("+p99", "added_p99_1"), ("req/s 64c", "rps_64"),
               ("p50 64c", "latency_p50_64"), ("p99 64c", "latency_p99_64"),
               ("chunks/s 1", "stream_chunks_per_s_1"),
               (f"chunks/s {args.stream_clients}", f"stream_chunks_per_s_{args.stream_clients}"),
               ("ttfc p50", "ttfc_p50_1"), ("+cpu ms/req", "added_cpu_ms_per_req_1"),
               ("req/s÷direct", "rps_64_of_direct"),
               ("ch/s 1÷dir", "stream_chunks_per_s_1_of_direct"),
               (f"ch/s {args.stream_clients}÷dir",
                f"stream_chunks_per_s_{args.stream_clients}_of_direct")]
    out = sys.stderr
    print(f"{'leg':<8}" + "".join(f"{title:>12}" for title, _ in columns), file=out)
    for name in names:
        cells = []
        for _, metric in columns:
            value = samples.median(name, metric)
            cells.append(f"{'-' if value is None else f'{value:.2f}':>12}")
        print(f"{name:<8}" + "".join(cells), file=out)
    print("targets for ours: +p50 <= 1.0 ms; req/s at 64 clients >= 0.8 and chunks/s >= 0.7 "
          "of direct's; ahead of litellm on each (ms; chunks/s = SSE events/s of all "
          "streams together)"
          + (": " + "; ".join(verdicts) if verdicts else ""), file=out, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 rep, 2 s runs, 40 streams (a smoke run, figures rough)")
    parser.add_argument("--reps", type=int, default=None, help="(default 3; 1 quick)")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per wrk run (default 5; 2 quick)")
    parser.add_argument("--requests", type=int, default=None, metavar="N",
                        help="a smoke run: each wrk run stops after N answers (the "
                        "figures print; rates and CPU per request mean nothing)")
    parser.add_argument("--legs", nargs="+", default=["direct", "litellm", "ours"],
                        choices=["direct", "litellm", "ours"])
    parser.add_argument("--stream-clients", type=int, default=8)
    parser.add_argument("--streams", type=int, default=None,
                        help="most streams per measurement, which also stops after "
                             "--duration (default 1000; 40 quick)")
    parser.add_argument("--warm-up", type=float, default=None, metavar="SECONDS",
                        help="64-client load on each leg before measuring (default 2; 1 quick)")
    parser.add_argument("--litellm-venv", type=Path, default=DEFAULT_LITELLM_VENV)
    args = parser.parse_args(argv)
    # Flags left out take their --quick or full-run value; flags given win.
    for name, quick, full in (("reps", 1, 3), ("duration", 2.0, 5.0), ("streams", 40, 1000),
                              ("warm_up", 1.0, 2.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if "direct" not in args.legs:
        args.legs.insert(0, "direct")  # the reference for every "added" figure
    args.load_average = [round(x, 2) for x in os.getloadavg()]  # the noise to expect
    stream_prompt, stream_tokens = longest_demo_prompt()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp, \
            contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        model_port, model_pid = stack.enter_context(start_model_server(workdir))
        starters = {
            "direct": lambda: start_direct(workdir, model_port, model_pid),
            "litellm": lambda: start_litellm(workdir, model_port, model_pid, args.litellm_venv),
            "ours": lambda: start_ours(workdir),
        }
        legs: list[Leg] = []
        for name in args.legs:
            try:
                legs.append(stack.enter_context(starters[name]()))
            except (LegUnavailable, ImportError, OSError, LoadError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
                print(json.dumps({"bench": BENCH, "leg": name, "skipped": reason[:2000]}),
                      flush=True)
        if args.warm_up > 0:
            warm_up(legs, args.warm_up)
        samples = Samples()
        for _ in range(args.reps):
            measure_rep(legs, args, samples, stream_prompt)
        for leg in legs:
            leg.info.setdefault("stream_answer_tokens", stream_tokens)
        report(legs, samples, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
