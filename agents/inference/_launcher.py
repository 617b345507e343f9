"""The model server forked pre-imported: a fork server of the agent's own.

Our ``local`` runtime's model server is a Python program of ours (``python -m
agents.inference.server``), and half a second of its start is its imports,
which the agent has mostly done already. So, before its trio loop starts (one
thread, nothing running), an inference agent whose plan runs such a module
forks a small zygote from itself (:func:`runtime.forkserver.fork_server_process`):
it imports the server's module once (nothing, when the agent was itself forked
from the ``local`` backend's fork server, which preloads it) and then forks the
model server on each (re)start, as the supervisor asks (:meth:`StepLauncher.start`).

What a forked model server keeps of a spawned one: its command line, its
environment (the step's, laid over the agent's), stdout and stderr as pipes to
the supervisor, the agent's session and process group (so whoever stops the
agent's group stops it, as the supervisor's docstring promises), and an exit
status (the zygote reports it). What it shares: the agent's memory at the
moment of the fork (its config among it: the same job, the same user, which
could read the agent's memory anyway). When the zygote is gone, or the step is
not one of our modules (vLLM, Ray, Parakeet's NeMo), the step is spawned as
before.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import trio

from contracts.agent_config import AgentConfig
from contracts.model import JobType, Runtime
from runtime.forkserver import ForkedProcess, ForkServer, ForkServerError, fork_server_process

if TYPE_CHECKING:
    from .runtimes import Step

__all__ = ["FORKABLE", "WARM", "StepLauncher", "prefork"]

log = logging.getLogger("cosmicac.agent.system")

#: The model server module of each runtime whose server is a Python program of ours
#: that loads nothing heavy at import (Parakeet's imports NeMo when it loads).
FORKABLE: Mapping[Runtime, str] = {Runtime.LOCAL: "agents.inference.server"}
#: What a forked server calls: the module's ``main(argv)`` (running the module
#: again as ``__main__`` would rebuild its request models, 15 ms).
ENTRY = "main"
#: What the server imports on its way to listening (the demo engine, the lean HTTP
#: server), imported once in the zygote too.
WARM: tuple[str, ...] = ("agents.inference.engines._demo", "p2p.httpserver")


class StepLauncher:
    """Starts a plan's steps that run one of :attr:`modules` from the zygote
    forked before trio (see the module doc); None from :meth:`start` means spawn it."""

    def __init__(self, sock, pid: int, modules: frozenset[str]) -> None:
        self.modules = modules
        self.server = ForkServer(sys.executable, tuple(modules), {})
        self._sock = sock
        self._pid = pid
        self._said = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve the zygote until cancelled (then it is killed)."""
        await self.server.adopt(self._sock, self._pid, task_status=task_status)

    def module_of(self, step: Step) -> str | None:
        """The module ``step`` runs (``python -m M``, this interpreter), if one of ours."""
        argv = step.argv
        if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and (
                argv[2] in self.modules):
            return argv[2]
        return None

    async def start(self, step: Step, env: Mapping[str, str]) -> ForkedProcess | None:
        """``step`` forked, its stdout and stderr pipes to us; None when it cannot be
        (not one of ours, or the zygote gone: said once)."""
        module = self.module_of(step)
        if module is None:
            return None
        try:
            if not await self.server.wait_ready(30.0):
                raise ForkServerError(self.server.problem or "not ready after 30 s")
            out_read, out_write = os.pipe()
            err_read, err_write = os.pipe()
            try:
                process = await self.server.spawn(
                    module, step.argv[3:], fds=[out_write, err_write], stdio=(-1, 0, 1),
                    env=env, session=False, function=ENTRY)
            except BaseException:
                os.close(out_read)
                os.close(err_read)
                raise
            finally:
                os.close(out_write)
                os.close(err_write)
        except ForkServerError as exc:
            if not self._said:
                self._said = True
                log.warning("model_server.fork_unusable step=%s reason=%r: spawned instead",
                            step.name, str(exc))
            return None
        process.stdout = trio.lowlevel.FdStream(out_read)
        process.stderr = trio.lowlevel.FdStream(err_read)
        return process


def prefork(config: AgentConfig) -> StepLauncher | None:
    """The launcher for ``config``'s model server, forked now (call before trio
    starts), or None: not an inference agent whose runtime's server is forkable,
    or the fork failed (said; the server is spawned then)."""
    if config.job_type is not JobType.INFERENCE or config.runtime not in FORKABLE:
        return None
    modules = frozenset({FORKABLE[config.runtime]})
    try:
        sock, pid = fork_server_process([*sorted(modules), *WARM])
    except ForkServerError as exc:
        log.warning("model_server.fork_unusable reason=%r: spawned instead", str(exc))
        return None
    return StepLauncher(sock, pid, modules)
