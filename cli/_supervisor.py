"""Run several daemons as child processes under one parent: what ``cosmicac up`` needs.

``cosmicac up`` runs the embedded deployment (a DHT bootstrap, a relay,
app-node, wrk-ork, a local worker, proxy-inference, the entry point) as one
foreground program. Each daemon is its own process (``cosmicac run SERVICE``),
as in a multi-host deployment, so a crash stays in its process; this module
is the parent that keeps them:

- **start in order**: a service starts once every service it depends on is
  *ready*, which means its stdout printed the ready line of the daemon its
  ``ready`` names (``<name> ready key=… swarm=HOST:PORT``, :mod:`nodes.kit.ready`),
  within ``start_timeout_s``;
- **restart with backoff**: a service that exits is started again after 1 s,
  2 s, 4 s … up to ``backoff_max_s``; one that stayed up for
  ``stable_after_s`` starts its backoff afresh. Its dependants keep running
  (they reconnect on their own over the swarm);
- **status**: :meth:`Supervisor.rows` is what the live table shows (state, pid,
  restarts, uptime, the last line it logged);
- **stop**: :meth:`Supervisor.stop` sends SIGTERM to every service at once,
  except those marked ``outlives_dependants`` (the DHT, the relay), which get it
  once every service depending on them has exited: the others unannounce through
  them on their way out, and a DHT already gone makes each of them wait out its
  requests' timeouts. After ``stop_timeout_s`` it SIGKILLs the process group of
  what is left, so nothing outlives ``up``. Every child runs in a process
  group of its own (a terminal's Ctrl-C reaches only ``up``, which then stops
  the children in order).

Each service's stdout and stderr go to ``<log_dir>/<name>.log`` (appended
across restarts); its last line is kept for the status table.
"""

from __future__ import annotations

import enum
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from nodes.kit.ready import ReadyLine, parse_ready
from p2p.files import private_file, private_folder
from runtime.process import describe_exit, spawn
from runtime.process import stop as stop_process

__all__ = ["ServiceSpec", "ServiceState", "StartFailed", "Supervisor"]

#: Longest line kept for the status table.
_LAST_LINE_CHARS = 200

#: A service that waited for its dependants until the stop deadline still gets this
#: long between SIGTERM and SIGKILL.
_LAST_GRACE_S = 1.0


class StartFailed(Exception):
    """A service never became ready; ``up`` cannot go on without it."""


class ServiceState(enum.StrEnum):
    WAITING = "waiting"  # for its dependencies
    STARTING = "starting"  # started, its ready line not seen yet
    RUNNING = "running"
    RESTARTING = "restarting"  # exited; waiting out its backoff
    STOPPED = "stopped"


@dataclass(frozen=True)
class ServiceSpec:
    """One daemon: how to start it and how to know it is ready."""

    name: str
    argv: tuple[str, ...]
    #: The daemon whose ready line its stdout prints once it serves; None: ready
    #: once started.
    ready: str | None = None
    depends_on: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    #: Stopped only once every service that depends on it has exited.
    outlives_dependants: bool = False


@dataclass
class _Service:
    spec: ServiceSpec
    state: ServiceState = ServiceState.WAITING
    process: trio.Process | None = None
    pid: int | None = None
    restarts: int = 0
    started_at: float | None = None
    last_line: str = ""
    #: Its ready line (the daemon's key and addresses).
    ready_line: ReadyLine | None = None
    ready_event: trio.Event = field(default_factory=trio.Event)
    #: Its stdout is being read (by :meth:`Supervisor._read_stdout`).
    reading: bool = False


class Supervisor:
    """Runs ``specs`` until :meth:`stop` (or cancellation, which stops them too).

    Args:
        specs: the services, in any order (``depends_on`` decides the order).
        log_dir: where each service's output goes.
        start_timeout_s: bound on a service's first readiness.
        backoff_min_s, backoff_max_s, stable_after_s: restart timing.
        stop_timeout_s: SIGTERM to SIGKILL.
    """

    def __init__(self, specs: Sequence[ServiceSpec], *, log_dir: Path,
                 start_timeout_s: float = 60.0, backoff_min_s: float = 1.0,
                 backoff_max_s: float = 30.0, stable_after_s: float = 60.0,
                 stop_timeout_s: float = 5.0) -> None:
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError("service names must be unique")
        for spec in specs:
            missing = [dep for dep in spec.depends_on if dep not in names]
            if missing:
                raise ValueError(f"{spec.name} depends on unknown {', '.join(missing)}")
        self.services = {spec.name: _Service(spec) for spec in specs}
        self.order = _start_order(specs)
        self.log_dir = log_dir
        self.start_timeout_s = start_timeout_s
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self.stop_timeout_s = stop_timeout_s
        self._stopping = False
        self._nursery: trio.Nursery | None = None

    # -- running -------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Start every service in order; ``started`` once all are ready; keep them.

        Raises:
            StartFailed: a service did not become ready within ``start_timeout_s``
                (everything started is stopped first).
        """
        private_folder(self.log_dir)  # logs name jobs, users and their shell commands
        failure: StartFailed | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for name in self.order:
                    nursery.start_soon(self._keep, self.services[name])
                for name in self.order:
                    service = self.services[name]
                    with trio.move_on_after(self.start_timeout_s):
                        await service.ready_event.wait()
                    if not service.ready_event.is_set():
                        failure = StartFailed(
                            f"{name} was not ready within {self.start_timeout_s:g} s; "
                            f"its log: {self.log_dir / (name + '.log')}"
                            + (f" (last line: {service.last_line})" if service.last_line
                               else ""))
                        nursery.cancel_scope.cancel()
                        break
                else:
                    task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self.stop()
        if failure is not None:  # raised outside the nursery, which would wrap it
            raise failure

    async def _keep(self, service: _Service) -> None:
        spec = service.spec
        for dep in spec.depends_on:
            await self.services[dep].ready_event.wait()
        failures = 0
        while not self._stopping:
            started = trio.current_time()
            await self._run_once(service)
            if self._stopping:
                return
            if trio.current_time() - started >= self.stable_after_s:
                failures = 0
            failures += 1
            service.restarts += 1
            service.state = ServiceState.RESTARTING
            wait = min(self.backoff_max_s, self.backoff_min_s * 2 ** (failures - 1))
            await trio.sleep(wait)

    async def _run_once(self, service: _Service) -> None:
        spec = service.spec
        log_path = self.log_dir / f"{spec.name}.log"
        private_file(log_path)
        with log_path.open("ab") as log_file:
            try:
                process = await spawn(
                    spec.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=log_file, env={**os.environ, **spec.env}, cwd=spec.cwd)
            except OSError as exc:
                service.last_line = f"cannot start: {exc.strerror or exc}"
                return
            service.process, service.pid = process, process.pid
            service.state = ServiceState.STARTING if spec.ready else ServiceState.RUNNING
            service.started_at = trio.current_time()
            if spec.ready is None:
                service.ready_event.set()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._read_stdout, service, process, log_file)
                    await process.wait()
                    nursery.cancel_scope.deadline = trio.current_time() + 1.0
            finally:
                if process.returncode is not None:
                    service.process = None  # else cancelled: stop() still owns it
                    _close_quietly(process)
                if not self._stopping and process.returncode is not None:
                    service.last_line = (describe_exit(process.returncode)
                                         + (f": {service.last_line}" if service.last_line
                                            else ""))[:_LAST_LINE_CHARS]

    async def _read_stdout(self, service: _Service, process: trio.Process, log_file) -> None:
        # The pipe stays open when this is cancelled (``up`` stopping): a daemon
        # that logs on stdout while it stops would otherwise die of EPIPE with its
        # last lines lost; stop() drains and closes it once the daemon exited.
        assert process.stdout is not None
        pending = b""
        service.reading = True
        try:
            while True:
                try:
                    data = await process.stdout.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                log_file.write(data)
                log_file.flush()
                pending += data
                *lines, pending = pending.split(b"\n")
                pending = pending[-4096:]
                for raw in lines:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line:
                        continue
                    service.last_line = line[:_LAST_LINE_CHARS]
                    daemon = service.spec.ready
                    if daemon is not None and service.state is ServiceState.STARTING:
                        ready = parse_ready(line)
                        if ready is not None and ready.daemon == daemon:
                            service.ready_line = ready
                            service.state = ServiceState.RUNNING
                            service.ready_event.set()
        finally:
            service.reading = False

    # -- stopping ------------------------------------------------------------------------

    async def stop(self) -> None:
        """SIGTERM every service, those that outlive their dependants once these
        have exited; SIGKILL what is left after ``stop_timeout_s`` (one that waited
        for its dependants that long still gets ``_LAST_GRACE_S``); returns once
        every process has exited."""
        self._stopping = True
        deadline = trio.current_time() + self.stop_timeout_s
        exited = {name: trio.Event() for name in self.services}
        dependants = {name: [other.spec.name for other in self.services.values()
                             if name in other.spec.depends_on]
                      for name in self.services}

        async def stop_one(service: _Service) -> None:
            name = service.spec.name
            try:
                if service.spec.outlives_dependants:
                    with trio.move_on_at(deadline):
                        for other in dependants[name]:
                            await exited[other].wait()
                process = service.process
                if process is None:
                    return
                grace = max(_LAST_GRACE_S, deadline - trio.current_time())
                await stop_process(process, grace)
                self._drain(service, process)
            finally:
                exited[name].set()

        async with trio.open_nursery() as nursery:
            for service in self.services.values():
                nursery.start_soon(stop_one, service)
        for service in self.services.values():
            service.state = ServiceState.STOPPED
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _drain(self, service: _Service, process: trio.Process) -> None:
        """What an exited daemon still wrote on stdout, to its log; the pipe closed.
        Only when its reader was cancelled (``up`` stopping): a reader still running
        (a direct :meth:`stop`) reads to the end itself."""
        if process.stdout is None or service.reading:
            return
        # Only what is already in the pipe: the daemon has exited, and a grandchild
        # that inherited its stdout (a fork server) may keep the pipe open for long.
        try:
            with (self.log_dir / f"{service.spec.name}.log").open("ab") as log_file:
                for _ in range(64):  # a pipe holds 64 KiB to 1 MiB
                    data = os.read(process.stdout.fileno(), 65536)
                    if not data:
                        break
                    log_file.write(data)
        except (OSError, trio.ClosedResourceError):  # EAGAIN: nothing more buffered
            pass
        finally:
            _close_quietly(process)

    # -- status --------------------------------------------------------------------------

    def rows(self) -> list[dict[str, object]]:
        """One row per service, in start order, for the status table."""
        now = trio.current_time()
        rows = []
        for name in self.order:
            service = self.services[name]
            up_s = (now - service.started_at if service.started_at is not None
                    and service.state is ServiceState.RUNNING else None)
            rows.append({"service": name, "state": service.state.value, "pid": service.pid,
                         "restarts": service.restarts,
                         "uptime_s": None if up_s is None else round(up_s, 1),
                         "last": service.last_line})
        return rows

    def ready_line(self, name: str) -> ReadyLine | None:
        """What service ``name``'s ready line said (its key, its addresses...)."""
        return self.services[name].ready_line


def _close_quietly(process: trio.Process) -> None:
    if process.stdout is not None:
        try:
            process.stdout.close()
        except (OSError, trio.ClosedResourceError):
            pass


def _start_order(specs: Sequence[ServiceSpec]) -> list[str]:
    """Dependencies first; a cycle is refused."""
    by_name = {spec.name: spec for spec in specs}
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ValueError(f"services depend on each other in a cycle through {name}")
        visiting.add(name)
        for dep in by_name[name].depends_on:
            visit(dep)
        visiting.discard(name)
        order.append(name)

    for spec in specs:
        visit(spec.name)
    return order

