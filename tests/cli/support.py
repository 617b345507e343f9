"""Running ``cosmicac`` in this process, and the in-process servers it talks to.

:func:`cosmicac` runs a command through typer's ``CliRunner`` in a worker thread
(the CLI is synchronous and may ``trio.run`` a loop of its own), so the test's trio
run keeps serving app-node, wrk-ork... meanwhile. The result reads like a finished
process's: exit status, stdout and stderr apart, and an exception that escaped the
command is on stderr as its traceback, as the interpreter would print it. A real
process costs about a second of imports; a command here costs what it does.

``serve`` starts app-node on 127.0.0.1 (port 0) with the first admin signed up;
``serve_ork`` wires it to a real wrk-ork (and, if asked, wrk-monitor). The fixtures
over them (``served``, ``served_ork``, ``served_logs``) are in ``conftest.py``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import ssl
import subprocess
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
import typer
from typer.testing import CliRunner

from nodes.app_node.auth import ScryptParams
from nodes.app_node.daemon import RunningAppNode, serve_app_node
from nodes.app_node.settings import ApiHttpSettings, AppNodeSettings, PasswordHashSettings
from nodes.kit.tls import client_tls
from nodes.monitor._buffer import LogBuffer
from nodes.monitor.agent_metrics import AgentMetricsBook
from nodes.monitor.agent_metrics import install as install_agent_metrics
from nodes.monitor.service import MonitorService
from nodes.ork.service import OrkService
from p2p.dht import DhtNode, UdpTransport
from p2p.keys import KeyPair, load_or_create_keypair
from p2p.swarm import Swarm, SwarmConfig
from tests.nodes.ork.world import World
from tests.p2p.helpers import wait_until

from .helpers import COSMICAC

__all__ = ["CHEAP", "CHEAP_HASH", "EMAIL", "PASSWORD", "Ran", "Served", "ServedOrk", "cli_env",
           "cosmicac", "cosmicac_process", "dht_node", "emailed_token", "invoke",
           "one_error_line", "serve", "serve_ork", "shared_tls"]

EMAIL = "ada@example.com"
PASSWORD = "correct horse battery staple"
#: scrypt at 16 KiB: the same code path as OWASP's 128 MiB, a thousandth of the CPU.
CHEAP = ScryptParams(ln=4, r=8, p=1)
CHEAP_HASH = PasswordHashSettings(ln=CHEAP.ln, r=CHEAP.r, p=CHEAP.p)


def shared_tls() -> ssl.SSLContext:
    """One TLS context for every ``httpx`` client a test makes (``verify=shared_tls()``),
    the daemons' own: httpx's default builds one per client, loading certifi's CA bundle
    each time (about 45 ms of CPU, though the tests' servers speak plain HTTP)."""
    return client_tls()


# -- the CLI in this process ------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    """A finished command, shaped like ``subprocess.CompletedProcess``."""

    args: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes


#: CliRunner swaps sys.stdout, sys.stderr, sys.stdin and os.environ for the whole
#: process: two commands at once would write into each other's streams.
_RUNNING = threading.Lock()


@functools.cache
def _app_of(command: str | None) -> typer.Typer:
    from cli.main import build_app

    return build_app(command)


def _app_for(args: Sequence[str]) -> typer.Typer:
    """The app ``main`` would build for ``args`` (the one command it names alone),
    built once per command so the runner's click command is built once too."""
    from cli.main import command_of  # the CLI's own dispatch, as `main` does

    return _app_of(command_of(args))


def invoke(args: Sequence[str], *, env: Mapping[str, str] | None = None,
           stdin: bytes = b"") -> Ran:
    """Run ``cosmicac *args`` here (blocking) and return how it ended.

    ``env`` is the command's whole environment, as a process would get it: what
    it lacks of ``os.environ`` is unset while the command runs.
    """
    args = list(args)
    if not _RUNNING.acquire(blocking=False):
        raise AssertionError("one in-process cosmicac at a time (CliRunner's streams are "
                             "process-wide)")
    root = logging.getLogger()
    handlers, levels = root.handlers[:], _logger_levels()
    try:
        result = CliRunner().invoke(_app_for(args), args, input=stdin,
                                    env=_overrides(env))
    finally:
        # A daemon command points the root logger at CliRunner's streams and sets
        # levels (p2p.daemon.configure_logging): put them back.
        root.handlers[:] = handlers
        for name, logger in [("", root), *logging.root.manager.loggerDict.items()]:
            if isinstance(logger, logging.Logger):
                logger.setLevel(levels.get(name, logging.NOTSET))
        _RUNNING.release()
    stderr = result.stderr_bytes
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # What the interpreter prints for an uncaught exception (exit status 1).
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info)).encode()
    return Ran(args, result.exit_code, result.stdout_bytes, stderr)


async def cosmicac(*args: str, env: Mapping[str, str] | None = None,
                   stdin: bytes = b"") -> Ran:
    """:func:`invoke` in a worker thread: this trio run keeps serving meanwhile.

    A test's timeout abandons a command that hangs (as killing its process did):
    the test fails at once, and the command ends when the servers it waits on stop
    with the test.
    """
    return await trio.to_thread.run_sync(lambda: invoke(args, env=env, stdin=stdin),
                                         abandon_on_cancel=True)


async def cosmicac_process(*args: str, env: Mapping[str, str] | None = None,
                           stdin: bytes = b"") -> subprocess.CompletedProcess:
    """``cosmicac *args`` as a real process: a command group's smoke test, which
    proves the console script starts (imports, dispatch, exit status) as users run it."""
    return await trio.run_process([*COSMICAC, *args], stdin=stdin, capture_stdout=True,
                                  capture_stderr=True, check=False, env=env)


def _logger_levels() -> dict[str, int]:
    loggers = logging.root.manager.loggerDict.items()
    return {"": logging.getLogger().level,
            **{name: logger.level for name, logger in loggers
               if isinstance(logger, logging.Logger)}}


def _overrides(env: Mapping[str, str] | None) -> dict[str, str | None]:
    if env is None:
        return {}
    changes: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    changes.update({k: v for k, v in env.items() if os.environ.get(k) != v})
    return changes


def emailed_token(outbox: Path, to: str, link: str = "accept") -> str:
    """The token of the newest ``/<link>?token=`` link emailed to ``to`` through the
    outbox backend (app-node's ``<storage>/outbox``)."""
    import email
    import re
    from email import policy

    # A hidden ``.tmp-`` file is a message being written (renamed into place when
    # whole): readers skip it, as the outbox says, or it vanishes under them.
    sent = [(path.stat().st_mtime, path) for path in outbox.glob("*.eml")
            if not path.name.startswith(".")]
    for _, path in sorted(sent, reverse=True):
        message = email.message_from_bytes(path.read_bytes(), policy=policy.default)
        body = message.get_body(("plain",))
        if message["To"] != to or body is None:
            continue
        found = re.search(rf"/{link}\?token=([A-Za-z0-9_\-]+)", body.get_content())
        if found:
            return found[1]
    raise AssertionError(f"no {link} link emailed to {to} in {outbox}")


def one_error_line(result: Ran | subprocess.CompletedProcess) -> str:
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# -- servers here -----------------------------------------------------------------


async def dht_node(nursery: trio.Nursery, bootstrap: str | None = None) -> str:
    """A persistent DHT node here, built as `cosmicac dht bootstrap` (no ``bootstrap``)
    or `dht node` build theirs; its HOST:PORT once it runs."""
    transport = await UdpTransport.bind("127.0.0.1", 0)
    joined = [] if bootstrap is None else [(bootstrap.rsplit(":", 1)[0],
                                            int(bootstrap.rsplit(":", 1)[1]))]
    node = DhtNode(transport, bootstrap=joined, persistent=True, reachable=not joined)
    await nursery.start(node.run)
    host, port = transport.local_address
    return f"{host}:{port}"


# -- app-node, served here --------------------------------------------------------


def cli_env(config: Path, server: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSMICAC_")}
    env.update({"COSMICAC_CONFIG_DIR": str(config), "COSMICAC_SERVER": server,
                "NO_COLOR": "1", "COLUMNS": "200"})
    return env


@dataclass
class Served:
    node: RunningAppNode
    server: str  # http://H:P (the API is at <server>/api)
    env: dict[str, str]
    config: Path

    async def cli(self, *args: str, stdin: bytes = b"",
                  process: bool = False) -> Ran | subprocess.CompletedProcess:
        """``cosmicac *args`` with this app-node's environment: in this process, or
        as a real one with ``process`` (a command group's smoke test)."""
        run = cosmicac_process if process else cosmicac
        return await run(*args, env=self.env, stdin=stdin)

    async def login(self) -> None:
        result = await self.cli("login", "--email", EMAIL, "--password-stdin",
                                stdin=f"{PASSWORD}\n".encode())
        assert result.returncode == 0, result.stderr

    async def login_as(self, email: str, password: str, config: Path) -> dict[str, str]:
        """The CLI environment of a session of ``email`` kept in ``config`` (logged
        in over HTTP, without a process)."""
        async with httpx.AsyncClient(base_url=f"{self.server}/api", timeout=30,
                                     verify=shared_tls()) as api:
            r = await api.post("/auth/login", json={"email": email, "password": password})
        assert r.status_code == 200, r.text
        session = json.dumps({"server": self.server, "token": r.json()["token"],
                              "expires_at": time.time() + 3600, "email": email})
        await trio.Path(config).mkdir(parents=True, exist_ok=True)
        await trio.Path(config / "session.json").write_text(session)
        return cli_env(config, self.server)


async def serve(tmp_path: Path, nursery: trio.Nursery, **settings: Any) -> Served:
    """app-node on ``tmp_path / "app-node"`` (``settings`` added, e.g. ``ork``), with
    the first admin signed up; the CLI's config folder is ``tmp_path / "config"``."""
    node_settings = AppNodeSettings(storage=tmp_path / "app-node", host="127.0.0.1", port=0,
                                    http=ApiHttpSettings(host="127.0.0.1", port=0), fsync=False,
                                    password_hash=CHEAP_HASH, **settings)
    with trio.fail_after(60):
        node: RunningAppNode = await nursery.start(serve_app_node, node_settings)
    host, port = node.http_address
    server = f"http://{host}:{port}"
    async with httpx.AsyncClient(base_url=f"{server}/api", timeout=30,
                                 verify=shared_tls()) as api:
        signup = await api.post("/auth/signup", json={
            "email": EMAIL, "name": "Ada", "password": PASSWORD, "team_name": "core"})
    assert signup.status_code == 201, signup.text
    config = tmp_path / "config"
    return Served(node, server, cli_env(config, server), config)


# -- app-node with wrk-ork (and wrk-monitor) --------------------------------------


@dataclass
class ServedOrk(Served):
    """app-node wired to a real in-process wrk-ork: an ``OrkService`` over the
    orchestrator of ``tests/nodes/ork/world.World`` (rack ``rack-1``: two 8-GPU
    nodes, n0 and n1) on its own swarm on 127.0.0.1, trusting app-node's key only.

    Nothing runs the jobs: a test plays the worker with :meth:`drive` while the CLI
    waits (it also pumps the service, as wrk-ork's daemon does after each report,
    so app-node's watch sees the change and ``--wait`` follows the job's events).
    """

    world: World | None = None
    service: OrkService | None = None
    #: With wrk-monitor: its buffer (tests append records to it).
    log_buffer: LogBuffer | None = None
    #: With wrk-monitor: its service (its ``health`` book takes reports).
    monitor_service: MonitorService | None = None

    def job_ids(self) -> set[str]:
        assert self.world is not None
        return {job.id for job in self.world.orch.list_jobs(None)}

    async def new_job(self, known: set[str]) -> str:
        """Wait until wrk-ork has a job not in ``known`` (a command creates it)."""
        await wait_until(lambda: bool(self.job_ids() - known), limit_s=30)
        [job] = self.job_ids() - known
        return job

    def drive(self, job: str, state: str, replicas: Iterable[int] | None = None,
              message: str = "", gateway=None) -> None:
        """The worker reports ``state`` for the job's replicas (every one by default),
        with an isolated network's ``gateway``."""
        assert self.world is not None
        indexes = replicas if replicas is not None else \
            [r.index for r in self.world.orch.get_job(job).replicas]
        for index in indexes:
            self.world.say(index, state, job=job, message=message, gateway=gateway)
        if self.service is not None:
            self.service.pump()


async def serve_ork(tmp_path: Path, nursery: trio.Nursery, *, monitor: bool,
                    **settings: Any) -> ServedOrk:
    """:func:`serve` wired to wrk-ork; with ``monitor``, also to a real wrk-monitor (a
    ``MonitorService`` over a ``LogBuffer`` on a third swarm that lets app-node's key
    follow)."""
    world = World(nodes=(8, 8))
    # app-node's identity made first, so wrk-ork can trust exactly that key.
    app_key = await trio.to_thread.run_sync(load_or_create_keypair, tmp_path / "app-node")
    ork_key = KeyPair.generate()
    service = OrkService(world.orch, allow=lambda key: key == app_key.public_key,
                         clock=lambda: world.now)
    ork_swarm = Swarm(ork_key, config=SwarmConfig(host="127.0.0.1", port=0),
                      services=[service])
    with trio.fail_after(30):
        address = await nursery.start(ork_swarm.run)
    extra: dict = {}
    buffer = monitor_service = None
    if monitor:
        buffer = LogBuffer()
        monitor_service = MonitorService(buffer, followers={app_key.public_key})
        install_agent_metrics(monitor_service, AgentMetricsBook())  # as the daemon does
        monitor_swarm = Swarm(KeyPair.generate(), config=SwarmConfig(host="127.0.0.1", port=0),
                              services=[monitor_service])
        with trio.fail_after(30):
            monitor_address = await nursery.start(monitor_swarm.run)
        extra = {"monitor": monitor_swarm.keypair.public_key,
                 "monitor_addresses": (monitor_address,)}
    served = await serve(tmp_path, nursery, ork=ork_key.public_key, ork_addresses=(address,),
                         **extra, **settings)
    return ServedOrk(served.node, served.server, served.env, served.config, world, service,
                     buffer, monitor_service)
