"""Run a :class:`~agents.inference.runtimes.RuntimePlan` and keep it healthy.

The supervisor owns every process of the plan (the model server, and for a
multi-node vLLM replica Ray's head or worker) and every clock around them. It
follows the rules in ``runtimes/_plan.py``: steps in order, ``RUN_TO_EXIT``
steps bounded, any ``KEEP_RUNNING`` step's exit fails the whole plan, stop in
reverse order with SIGTERM then SIGKILL. The steps stay in the agent's
process group, so whoever stops the agent's group (the ``local`` backend
stopping a VMI, a terminal's Ctrl-C) stops the model server and its workers
with it, even when the agent is killed without a chance to clean up.

Health, for a plan that listens: ``GET health_path`` until 200 (bounded by
``startup_timeout_s``; the first tries 10 ms apart, the wait doubling up to
``startup_probe_interval_s``: our own server answers within tens of
milliseconds, a vLLM one loads for minutes), then the deep check (one
generated token) once; then ``/health`` every ``probe_interval_s``.
``unhealthy_after`` failed probes in a row make the server unhealthy (the
agent leaves the job's DHT topic and tells the worker it is not ready); a
server still unhealthy after ``restart_unhealthy_s`` is restarted. A plan that
does not listen is healthy while its kept steps live.

Crashes: a plan that fails (a step exits, start-up times out, the deep check
fails) is stopped and started again after a doubling wait, from
``backoff_min_s`` up to ``backoff_max_s``. ``max_crashes`` failures in a row
without a healthy stretch of ``stable_after_s`` between them end the
supervisor with :class:`ModelServerFailed`: the agent then reports the
replica failed.

A step that runs one of our own Python model servers is forked from the
agent's pre-imported zygote when the agent has one (``_launcher.py``), else
spawned.

Every line a process writes to stdout or stderr becomes an Application log
line (logger ``cosmicac.agent.application``, with the job id, the step and
the stream in ``extra``); what the supervisor does is System log
(``cosmicac.agent.system``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import trio

from runtime.forkserver import ForkedProcess
from runtime.process import describe_exit, spawn, stop

from .runtimes import Lifetime, RuntimePlan, Step

if TYPE_CHECKING:
    from ._launcher import StepLauncher

__all__ = [
    "APPLICATION_LOG",
    "SYSTEM_LOG",
    "ModelServerFailed",
    "ModelSupervisor",
    "SupervisorPolicy",
]

APPLICATION_LOG = "cosmicac.agent.application"
SYSTEM_LOG = "cosmicac.agent.system"
app_log = logging.getLogger(APPLICATION_LOG)
sys_log = logging.getLogger(SYSTEM_LOG)

#: Longest Application log line kept; a process printing megabytes without a
#: newline is cut, not buffered without end.
MAX_LINE_BYTES = 8 << 10


class ModelServerFailed(Exception):
    """The model server crashed ``max_crashes`` times in a row: the replica failed."""


class _PlanFailed(Exception):
    """One start of the plan failed (the supervisor may try again)."""


@dataclass(frozen=True)
class SupervisorPolicy:
    """Timing of supervision (tests shorten it)."""

    probe_interval_s: float = 2.0
    #: Probes while starting (a model loads in seconds to minutes): the first
    #: wait, doubling up to the second.
    startup_probe_first_s: float = 0.01
    startup_probe_interval_s: float = 0.2
    probe_timeout_s: float = 5.0
    unhealthy_after: int = 3
    restart_unhealthy_s: float = 30.0
    backoff_min_s: float = 1.0
    backoff_max_s: float = 30.0
    max_crashes: int = 5
    #: Healthy this long, and the crash count starts afresh.
    stable_after_s: float = 60.0


HealthHook = Callable[[bool, str], None]


class ModelSupervisor:
    """Runs one plan until cancelled; calls ``on_health(healthy, why)`` on every change.

    Args:
        plan: what to run (from ``adapter_for(runtime).plan(launch)``).
        on_health: told when the plan becomes healthy or stops being so.
        job_id: for the log lines.
        policy: timing.
        env: the environment the steps' ``env`` is laid over (default: ours).
        launcher: forks the steps that run our own model server (None: all spawned).
    """

    def __init__(self, plan: RuntimePlan, *, on_health: HealthHook, job_id: str = "",
                 policy: SupervisorPolicy | None = None,
                 env: Mapping[str, str] | None = None,
                 launcher: StepLauncher | None = None) -> None:
        self.plan = plan
        self.launcher = launcher
        self.on_health = on_health
        self.job_id = job_id
        self.policy = policy or SupervisorPolicy()
        self._env = dict(os.environ if env is None else env)
        self.healthy = False
        #: Starts of the plan so far, and failures in a row.
        self.starts = 0
        self.crashes = 0
        #: Health checks failed in a row (startup probes included), and how long
        #: the last one took (milliseconds; None before the first): figures of
        #: the agent's heartbeat.
        self.probe_failures = 0
        self.last_probe_ms: float | None = None
        #: pids of the running steps (tests kill them to prove restarts).
        self.pids: dict[str, int] = {}
        #: Each step's last line on stderr: why it exited, usually.
        self.last_error: dict[str, str] = {}

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Start, watch, restart; returns never, raises :class:`ModelServerFailed`."""
        policy = self.policy
        while True:
            self.starts += 1
            healthy_at: list[float] = []
            try:
                await self._run_once(healthy_at)
            except _PlanFailed as exc:
                reason = str(exc)
            self._set_health(False, reason)
            if healthy_at and trio.current_time() - healthy_at[0] >= policy.stable_after_s:
                self.crashes = 0
            self.crashes += 1
            if self.crashes >= policy.max_crashes:
                sys_log.error("model_server.gave_up job=%s crashes=%d reason=%s", self.job_id,
                              self.crashes, reason, extra=self._extra())
                raise ModelServerFailed(f"the model server failed {self.crashes} times in a "
                                        f"row; last: {reason}")
            wait = min(policy.backoff_max_s, policy.backoff_min_s * 2 ** (self.crashes - 1))
            sys_log.warning("model_server.restarting job=%s reason=%s crashes=%d in_s=%.1f",
                            self.job_id, reason, self.crashes, wait, extra=self._extra())
            await trio.sleep(wait)

    async def _run_once(self, healthy_at: list[float]) -> None:
        """One life of the plan; ends only by raising :class:`_PlanFailed` (or
        cancellation). ``healthy_at`` gets the time it became healthy."""
        try:
            async with trio.open_nursery() as nursery:
                for step in self.plan.steps:
                    await self._start_step(nursery, step)
                await self._watch_health(healthy_at)
        except BaseExceptionGroup as group:
            failed, rest = group.split(_PlanFailed)
            if failed is None or (rest is not None and rest.subgroup(
                    lambda exc: not isinstance(exc, trio.Cancelled)) is not None):
                raise
            raise _first(failed) from None

    # -- steps ---------------------------------------------------------------------------

    async def _start_step(self, nursery: trio.Nursery, step: Step) -> None:
        env = {**self._env, **step.env}
        try:
            # In the agent's own group (the module's docstring says why), forked or not.
            process = (await self.launcher.start(step, env)
                       if self.launcher is not None else None)
            if process is None:
                process = await spawn(step.argv, new_session=False, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        except OSError as exc:
            raise _PlanFailed(f"cannot start {step.name} ({step.argv[0]}): "
                              f"{exc.strerror or exc}") from None
        self.pids[step.name] = process.pid
        sys_log.info("model_server.step_started job=%s step=%s pid=%d argv=%s", self.job_id,
                     step.name, process.pid, " ".join(step.argv)[:500], extra=self._extra())
        stderr_done = trio.Event()
        nursery.start_soon(self._pump, process.stdout, step.name, "stdout", None)
        nursery.start_soon(self._pump, process.stderr, step.name, "stderr", stderr_done)
        if step.lifetime is Lifetime.RUN_TO_EXIT:
            try:
                with trio.fail_after(step.timeout_s or math.inf):
                    code = await process.wait()
            except trio.TooSlowError:
                await stop(process, step.stop_timeout_s, group=False)
                raise _PlanFailed(f"{step.name} did not finish within {step.timeout_s:g} s"
                                  ) from None
            if code != 0:
                raise _PlanFailed(self._exited(step, code))
            return
        nursery.start_soon(self._keep, process, step, stderr_done)

    async def _keep(self, process: trio.Process | ForkedProcess, step: Step,
                    stderr_done: trio.Event) -> None:
        try:
            code = await process.wait()
        finally:
            with trio.CancelScope(shield=True):
                # vLLM and Ray stop their own workers on SIGTERM.
                await stop(process, step.stop_timeout_s, group=False)
            self.pids.pop(step.name, None)
        with trio.move_on_after(1.0):
            await stderr_done.wait()  # its last words say why, usually
        raise _PlanFailed(self._exited(step, code))

    def _exited(self, step: Step, code: int) -> str:
        last = self.last_error.get(step.name)
        return f"{step.name} {describe_exit(code)}" + (f": {last}" if last else "")

    async def _pump(self, stream: trio.abc.ReceiveStream | None, step: str, name: str,
                    done: trio.Event | None) -> None:
        try:
            await self._read_lines(stream, step, name)
        finally:
            if done is not None:
                done.set()

    async def _read_lines(self, stream: trio.abc.ReceiveStream | None, step: str,
                          name: str) -> None:
        if stream is None:
            return
        extra = {**self._extra(), "source": "Application", "step": step, "stream": name}
        pending = b""
        async with stream:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data:
                    break
                pending += data
                *lines, pending = pending.split(b"\n")
                if len(pending) > MAX_LINE_BYTES:
                    lines.append(pending)
                    pending = b""
                for line in lines:
                    text = line[:MAX_LINE_BYTES].decode("utf-8", "replace").rstrip("\r")
                    if text:
                        app_log.info("%s", text, extra=extra)
                        if name == "stderr":
                            self.last_error[step] = text[:300]
        if pending.strip():
            app_log.info("%s", pending[:MAX_LINE_BYTES].decode("utf-8", "replace"), extra=extra)

    # -- health --------------------------------------------------------------------------

    async def _watch_health(self, healthy_at: list[float]) -> None:
        plan, policy = self.plan, self.policy
        if not plan.listens:
            # A Ray worker: healthy while its kept steps live (their exit ends us).
            healthy_at.append(trio.current_time())
            self._set_health(True, "ray worker joined")
            await trio.sleep_forever()
        assert plan.base_url is not None and plan.health_path is not None
        limits = httpx.Limits(max_connections=2, max_keepalive_connections=1)
        # Plain HTTP to the server beside us: no TLS context to build (loading the CA
        # bundle took 25 ms of the start; the first client 180 ms with its imports).
        plain = plan.base_url.startswith("http://")
        async with httpx.AsyncClient(base_url=plan.base_url, limits=limits,
                                     timeout=policy.probe_timeout_s, trust_env=False,
                                     **({"verify": False} if plain else {})) as http:
            started = trio.current_time()
            wait = min(policy.startup_probe_first_s, policy.startup_probe_interval_s)
            while not await self._probe(http):
                if trio.current_time() - started > plan.startup_timeout_s:
                    raise _PlanFailed(f"the model server did not answer {plan.health_path} "
                                      f"within {plan.startup_timeout_s:g} s")
                await trio.sleep(wait)
                wait = min(wait * 2, policy.startup_probe_interval_s)
            await self._deep_check(http)
            healthy_at.append(trio.current_time())
            self._set_health(True, "model server healthy")
            failures = 0
            unhealthy_since: float | None = None
            while True:
                await trio.sleep(policy.probe_interval_s)
                if await self._probe(http):
                    failures, unhealthy_since = 0, None
                    self._set_health(True, "model server healthy again")
                    continue
                failures += 1
                if failures >= policy.unhealthy_after:
                    now = trio.current_time()
                    if unhealthy_since is None:
                        unhealthy_since = now
                        self._set_health(False, f"{failures} health checks failed")
                    elif now - unhealthy_since >= policy.restart_unhealthy_s:
                        raise _PlanFailed(f"unhealthy for {now - unhealthy_since:.0f} s")

    async def _probe(self, http: httpx.AsyncClient) -> bool:
        started = time.perf_counter()
        try:
            response = await http.get(self.plan.health_path or "/health")
            ok = response.status_code == 200
        except httpx.HTTPError:
            ok = False
        self.last_probe_ms = (time.perf_counter() - started) * 1000
        self.probe_failures = 0 if ok else self.probe_failures + 1
        return ok

    async def _deep_check(self, http: httpx.AsyncClient) -> None:
        check = self.plan.deep_check
        if check is None:
            return
        try:
            response = await http.request(check.method, check.path, timeout=check.timeout_s,
                                          json=dict(check.body) if check.body else None)
        except httpx.HTTPError as exc:
            raise _PlanFailed(f"the deep check {check.path} failed: {exc}") from None
        try:
            payload = response.json()
        except (ValueError, UnicodeDecodeError):
            payload = None
        if not check.passed(response.status_code, payload):
            raise _PlanFailed(f"the deep check {check.path} answered {response.status_code}: "
                              f"{json.dumps(payload)[:300] if payload else response.text[:300]}")

    def _set_health(self, healthy: bool, why: str) -> None:
        if healthy == self.healthy:
            return
        self.healthy = healthy
        sys_log.info("model_server.%s job=%s why=%s", "healthy" if healthy else "unhealthy",
                     self.job_id, why, extra=self._extra())
        self.on_health(healthy, why)

    def _extra(self) -> dict[str, str]:
        return {"job_id": self.job_id, "source": "System"}


def _first(group: BaseExceptionGroup) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc

