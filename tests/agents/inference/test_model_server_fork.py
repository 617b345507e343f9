"""An inference agent forks its own model server pre-imported (``_launcher.py``):
in the agent's process group, with an exit status the supervisor reads; and
spawns it again when its zygote is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path

import trio

from agents.inference._launcher import StepLauncher
from agents.inference.runtimes import Lifetime, Step, StepRole
from contracts.model import JobType, Runtime
from nodes.k8s_worker.agents import AgentEventKind
from tests.agents.helpers import agent_config, running_worker, start_agent, stop, vmi_of


def _stat(pid: int) -> tuple[str, int, int]:
    """(state, parent pid, process group) of ``pid``; ("X", 0, 0) once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return "X", 0, 0
    return fields[0], int(fields[1]), int(fields[2])


def _step_pids(log: Path) -> list[int]:
    return [int(pid) for pid in re.findall(r"model_server\.step_started .*?pid=(\d+)",
                                           log.read_text())]


async def _next_step(log: Path, seen: int) -> int:
    with trio.fail_after(30):
        while len(_step_pids(log)) <= seen:  # noqa: ASYNC110 - a real process writes it
            await trio.sleep(0.02)
    return _step_pids(log)[seen]


async def _until(worker, kind: AgentEventKind):
    while True:
        event = await worker.next_event(30)
        if event.kind is kind:
            return event


async def test_the_model_server_is_forked_in_the_agents_group_and_spawned_without_its_zygote(
        nursery, tmp_path):
    async with running_worker(nursery) as worker:
        config = agent_config(worker.keypair.public_key, address=worker.address,
                              storage=str(tmp_path / "storage")).model_copy(update={
            "job_type": JobType.INFERENCE, "runtime": Runtime.LOCAL, "model": "demo"})
        worker.registry.expect(vmi_of(config))
        (tmp_path / "agent.json").write_text(config.to_json())
        log = tmp_path / "agent.log"
        agent = await start_agent(tmp_path / "agent.json", log)
        try:
            await _until(worker, AgentEventKind.READY)
            first = await _next_step(log, 0)
            state, launcher, group = _stat(first)
            # Forked by the agent's zygote, not spawned by the agent; in its group.
            assert launcher != agent.pid and _stat(launcher)[1] == agent.pid
            agent_group = _stat(agent.pid)[2]
            assert group == agent_group and state not in "ZX"

            os.kill(first, signal.SIGKILL)  # its status comes from the zygote
            second = await _next_step(log, 1)
            assert "killed by SIGKILL" in log.read_text()
            assert _stat(second)[1] == launcher
            await _until(worker, AgentEventKind.READY)

            os.kill(launcher, signal.SIGKILL)  # the zygote gone: the next start is spawned
            os.kill(second, signal.SIGKILL)
            third = await _next_step(log, 2)
            assert _stat(third)[1] == agent.pid and _stat(third)[2] == agent_group
            assert "model_server.fork_unusable" in log.read_text()
            await _until(worker, AgentEventKind.READY)
        finally:
            code = await stop(agent)
        assert code == 0, log.read_text()[-3000:]
        records = [json.loads(line) for line in log.read_text().splitlines()
                   if line.startswith("{")]
        assert any("model_server.healthy" in r.get("message", "") for r in records)
        assert _stat(third)[0] in "ZX"  # the agent stopped its model server


def test_only_our_own_model_servers_on_our_interpreter_are_forked():
    launcher = StepLauncher(None, 0, frozenset({"agents.inference.server"}))

    def step(*argv: str) -> Step:
        return Step(name="s", argv=argv, role=StepRole.SERVER, lifetime=Lifetime.KEEP_RUNNING)

    assert launcher.module_of(step(sys.executable, "-m", "agents.inference.server",
                                   "--model", "demo")) == "agents.inference.server"
    assert launcher.module_of(step("/usr/bin/python3", "-m", "agents.inference.server")) is None
    assert launcher.module_of(step(sys.executable, "-m", "vllm.entrypoints")) is None
    assert launcher.module_of(step("vllm", "serve", "m")) is None
