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
- **stop**: :meth:`Supervisor.stop` sends SIGTERM to every service in reverse
  order of start, waits ``stop_timeout_s``, then SIGKILLs the process group of
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
from runtime.process import describe_exit, spawn, stop_all

__all__ = ["ServiceSpec", "ServiceState", "StartFailed", "Supervisor"]

#: Longest line kept for the status table.
_LAST_LINE_CHARS = 200


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
                if not self._stopping and process.returncode is not None:
                    service.last_line = (describe_exit(process.returncode)
                                         + (f": {service.last_line}" if service.last_line
                                            else ""))[:_LAST_LINE_CHARS]

    async def _read_stdout(self, service: _Service, process: trio.Process, log_file) -> None:
        assert process.stdout is not None
        pending = b""
        async with process.stdout:
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

    # -- stopping ------------------------------------------------------------------------

    async def stop(self) -> None:
        """SIGTERM every service (reverse start order), SIGKILL what is left after
        ``stop_timeout_s``; returns once every process has exited."""
        self._stopping = True
        running = [self.services[name].process for name in reversed(self.order)]
        await stop_all([process for process in running if process is not None],
                       self.stop_timeout_s)
        for service in self.services.values():
            service.state = ServiceState.STOPPED
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

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

