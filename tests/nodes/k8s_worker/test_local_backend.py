"""The local backend with real processes: a stand-in agent, and once the real one."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import trio

from contracts.model import JobSpec
from nodes.k8s_worker.agents import AgentEventKind
from nodes.k8s_worker.backend import BackendError, ReplicaUnit, VmiEvent, VmiPhase
from nodes.k8s_worker.local import LocalBackend, LocalClusterSettings, LocalNode
from tests.agents.helpers import agent_config, running_worker, vmi_of

FAKE_AGENT = [sys.executable, str(Path(__file__).with_name("fake_agent.py"))]
SPEC = JobSpec(name="t", team="team", type="container", image="docker://registry.local/img:1",
               gpus=1)
WORKER_KEY = b"\x01" * 32
FAST = LocalClusterSettings(stop_grace_s=0.5, poll_interval_s=0.05)


def unit_of(*configs, node: str = "local-node-1") -> ReplicaUnit:
    first = configs[0]
    return ReplicaUnit(job_id=first.job_id, replica=first.replica, generation=first.generation,
                       spec=SPEC, vmis=tuple(vmi_of(c, node) for c in configs))


def fake_backend(state_dir, mode: str = "sleep", settings=FAST) -> LocalBackend:
    return LocalBackend(settings, state_dir, FAKE_AGENT, env={**os.environ, "FAKE_AGENT": mode})


class Running:
    """A backend whose run() is going, and the events it sent."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.send, self.events = trio.open_memory_channel[VmiEvent](64)
        self.scope = trio.CancelScope()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            await self.backend.run(self.send, task_status=task_status)

    async def until(self, phase: VmiPhase, timeout_s: float = 10) -> VmiEvent:
        with trio.fail_after(timeout_s):
            async for event in self.events:
                if event.phase is phase:
                    return event
        raise AssertionError("events ended")

    def drain(self) -> list[VmiEvent]:
        seen = []
        while True:
            try:
                seen.append(self.events.receive_nowait())
            except trio.WouldBlock:
                return seen


async def started(nursery, backend: LocalBackend) -> Running:
    running = Running(backend)
    await nursery.start(running.run)
    return running


async def test_capacity_is_the_configured_cluster(tmp_path):
    backend = LocalBackend(LocalClusterSettings(), tmp_path)
    report = await backend.capacity()
    assert [(n.name, n.gpus) for n in report.nodes] == [("local-node-1", 8), ("local-node-2", 8)]
    assert report.overlay_network and all(n.infiniband for n in report.nodes)
    small = LocalBackend(LocalClusterSettings(nodes=[LocalNode(name="a", gpus=2)],
                                              overlay_network=False, infiniband=False), tmp_path)
    report = await small.capacity()
    assert [(n.name, n.gpus, n.infiniband) for n in report.nodes] == [("a", 2, False)]
    assert not report.overlay_network
    with pytest.raises(ValueError, match="unique"):
        LocalClusterSettings(nodes=[LocalNode(name="a", gpus=1), LocalNode(name="a", gpus=1)])


async def test_a_vmi_on_no_such_node_or_too_big_is_refused_for_good(nursery, tmp_path):
    running = await started(nursery, fake_backend(tmp_path))
    with pytest.raises(BackendError) as info:
        await running.backend.create(unit_of(agent_config(WORKER_KEY), node="gpu-node-9"))
    assert not info.value.retryable and "gpu-node-9" in str(info.value)
    big = agent_config(WORKER_KEY).model_copy(update={"gpus": 9})
    with pytest.raises(BackendError) as info:
        await running.backend.create(unit_of(big))
    assert not info.value.retryable
    running.scope.cancel()


async def test_create_runs_a_process_and_kill_9_is_a_failed_vmi(nursery, tmp_path):
    running = await started(nursery, fake_backend(tmp_path))
    config = agent_config(WORKER_KEY)
    unit = unit_of(config)
    name = unit.vmis[0].name
    await running.backend.create(unit)
    phases = [e.phase for e in running.drain()]
    assert phases == [VmiPhase.PROVISIONING, VmiPhase.BOOTING, VmiPhase.RUNNING]
    pid = running.backend.pid(name)
    folder = running.backend.folder(unit.vmis[0])
    home = running.backend.agent_folder(unit.vmis[0])
    written = json.loads((home / "agent.json").read_text())
    assert written["storage"] == str(home / "storage")  # the VMI's path, made local
    assert json.loads((folder / "process.json").read_text())["pid"] == pid
    await running.backend.create(unit)  # again: kept, same process, its phase said again
    assert running.backend.pid(name) == pid
    assert [e.phase for e in running.drain()] == [VmiPhase.RUNNING]
    os.kill(pid, signal.SIGKILL)
    failed = await running.until(VmiPhase.FAILED)
    assert failed.name == name and "killed by SIGKILL" in failed.message
    assert running.backend.pid(name) is None
    await running.backend.delete(unit)
    running.scope.cancel()


@pytest.mark.parametrize(("mode", "phase", "words"), [
    ("fail", VmiPhase.FAILED, ["exited with status 3", "the model does not load"]),
    ("exit0", VmiPhase.SUCCEEDED, ["exited with status 0"]),
])
async def test_a_process_that_exits_is_failed_or_succeeded_by_its_status(
        nursery, tmp_path, mode, phase, words):
    running = await started(nursery, fake_backend(tmp_path, mode))
    unit = unit_of(agent_config(WORKER_KEY))
    await running.backend.create(unit)
    event = await running.until(phase)
    assert all(word in event.message for word in words), event.message
    running.scope.cancel()


async def test_restart_keeps_the_disk_and_starts_the_new_generation(nursery, tmp_path):
    running = await started(nursery, fake_backend(tmp_path))
    config = agent_config(WORKER_KEY)
    unit = unit_of(config)
    await running.backend.create(unit)
    folder = running.backend.folder(unit.vmis[0])
    old_pid = running.backend.pid(unit.vmis[0].name)
    home = running.backend.agent_folder(unit.vmis[0])
    marker = home / "storage" / "first-boot"
    with trio.fail_after(10):
        while not marker.exists():  # noqa: ASYNC110 - another process writes it
            await trio.sleep(0.02)
    first_boot = marker.read_text()
    running.drain()
    again = unit_of(config.model_copy(update={"generation": 1}))
    await running.backend.restart(again)
    phases = [e.phase for e in running.drain()]
    assert phases == [VmiPhase.GONE, VmiPhase.PROVISIONING, VmiPhase.BOOTING, VmiPhase.RUNNING]
    new_pid = running.backend.pid(unit.vmis[0].name)
    assert new_pid != old_pid and _gone(old_pid)
    assert marker.read_text() == first_boot  # the disk was kept
    assert json.loads((home / "agent.json").read_text())["generation"] == 1
    await running.backend.delete(again)
    assert not folder.exists()
    assert running.drain()[-1].phase is VmiPhase.GONE
    await running.backend.delete(again)  # gone already: fine
    assert running.drain()[-1].phase is VmiPhase.GONE
    running.scope.cancel()


async def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace_period(
        nursery, tmp_path):
    running = await started(nursery, fake_backend(tmp_path, "stubborn"))
    unit = unit_of(agent_config(WORKER_KEY))
    await running.backend.create(unit)
    pid = running.backend.pid(unit.vmis[0].name)
    with trio.fail_after(10):  # until it has set SIGTERM aside (a real process)
        while not _ignores_sigterm(pid):  # noqa: ASYNC110 - another process's state
            await trio.sleep(0.02)
    with trio.fail_after(10):
        await running.backend.delete(unit)
    assert _gone(pid)
    assert [e.phase for e in running.drain()][-1] is VmiPhase.GONE  # not FAILED
    running.scope.cancel()


def _ignores_sigterm(pid: int) -> bool:
    """Whether ``pid``'s ignored signals (``SigIgn`` in its status) hold SIGTERM."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


async def test_a_new_backend_adopts_live_agents_and_reports_the_dead_and_the_missing(
        nursery, tmp_path):
    first = await started(nursery, fake_backend(tmp_path))
    live, dead, missing = (unit_of(agent_config(WORKER_KEY, replica=r)) for r in range(3))
    await first.backend.create(live)
    await first.backend.create(dead)
    dead_pid = first.backend.pid(dead.vmis[0].name)
    first.scope.cancel()  # the worker goes away; its agents do not
    await trio.lowlevel.checkpoint()
    live_pid = first.backend.pid(live.vmis[0].name)
    assert not _gone(live_pid)
    os.kill(dead_pid, signal.SIGKILL)  # dies while nobody watches
    with trio.fail_after(5):
        while not _gone(dead_pid):  # noqa: ASYNC110 - a real process ends
            await trio.sleep(0.02)

    backend = fake_backend(tmp_path)
    backend.adopt([live, dead, missing])
    second = await started(nursery, backend)
    by_name = {e.name: e for e in second.drain()}
    assert by_name[live.vmis[0].name].phase is VmiPhase.RUNNING
    assert "adopted" in by_name[live.vmis[0].name].message
    assert by_name[dead.vmis[0].name].phase is VmiPhase.FAILED
    assert by_name[missing.vmis[0].name].phase is VmiPhase.GONE
    assert backend.pid(live.vmis[0].name) == live_pid
    await backend.create(live)  # redelivered: kept
    assert backend.pid(live.vmis[0].name) == live_pid

    os.kill(live_pid, signal.SIGKILL)  # not our child: seen through its pidfd
    failed = await second.until(VmiPhase.FAILED)
    assert failed.name == live.vmis[0].name and "exit status unknown" in failed.message
    await backend.create(live)  # redelivered after it failed: kept as failed
    assert (await second.until(VmiPhase.FAILED)).message == failed.message
    await backend.restart(live)  # and it comes back on its disk
    assert backend.pid(live.vmis[0].name) not in (None, live_pid)
    assert await backend.stop_all() == 1
    second.scope.cancel()


async def test_stop_all_stops_agents_a_previous_backend_started(nursery, tmp_path):
    first = await started(nursery, fake_backend(tmp_path))
    unit = unit_of(agent_config(WORKER_KEY))
    await first.backend.create(unit)
    pid = first.backend.pid(unit.vmis[0].name)
    first.scope.cancel()
    with trio.fail_after(10):
        assert await fake_backend(tmp_path).stop_all() == 1
    assert _gone(pid)
    assert (tmp_path / unit.vmis[0].disk / "agent" / "storage").is_dir()  # disks are kept


async def test_a_real_agent_started_by_the_backend_reports_to_the_worker(nursery, tmp_path):
    async with running_worker(nursery) as worker:
        config = agent_config(worker.keypair.public_key, address=worker.address)
        unit = unit_of(config)
        worker.registry.expect(unit.vmis[0])
        running = await started(nursery, LocalBackend(FAST, tmp_path / "vmis"))
        await running.backend.create(unit)
        await running.until(VmiPhase.RUNNING)
        hello = await worker.next_event()
        assert (hello.vmi_name, hello.kind) == (unit.vmis[0].name, AgentEventKind.HELLO)
        assert (await worker.next_event()).kind is AgentEventKind.READY
        pid = running.backend.pid(unit.vmis[0].name)
        os.kill(pid, signal.SIGKILL)  # the E2E's "killing an agent"
        assert "SIGKILL" in (await running.until(VmiPhase.FAILED)).message
        assert (await worker.next_event()).kind is AgentEventKind.SILENT
        await running.backend.delete(unit)
        running.scope.cancel()


async def test_an_agent_the_worker_died_before_recording_is_found_not_doubled(
        nursery, tmp_path):
    first = await started(nursery, fake_backend(tmp_path))
    unit = unit_of(agent_config(WORKER_KEY))
    await first.backend.create(unit)
    pid = first.backend.pid(unit.vmis[0].name)
    first.scope.cancel()
    (tmp_path / unit.vmis[0].disk / "process.json").unlink()  # as if killed mid-create

    second = await started(nursery, fake_backend(tmp_path))
    await second.backend.create(unit)  # the redelivered create
    assert second.backend.pid(unit.vmis[0].name) == pid
    assert [e.phase for e in second.drain()] == [VmiPhase.RUNNING]
    await second.backend.delete(unit)
    assert _gone(pid)
    second.scope.cancel()


async def test_an_inference_agent_gets_its_own_copy_of_the_hub_token_and_the_shared_cache(
    nursery, tmp_path, caplog
):
    import dataclasses

    from contracts.model import JobType, Runtime

    secrets_dir, cache = tmp_path / "secrets", tmp_path / "cache"
    (secrets_dir / "hf-token").mkdir(parents=True)
    (secrets_dir / "hf-token" / "token").write_text("hf_first\n")
    settings = FAST.model_copy(update={"model_cache_dir": cache})
    backend = LocalBackend(settings, tmp_path / "vmis", FAKE_AGENT, secrets_dir=secrets_dir,
                           env={**os.environ, "FAKE_AGENT": "sleep"})
    running = await started(nursery, backend)
    config = agent_config(WORKER_KEY).model_copy(update={
        "job_type": JobType.INFERENCE, "runtime": Runtime.LOCAL, "model": "demo"})
    vmi = dataclasses.replace(vmi_of(config), hub_token_secret="hf-token")
    unit = ReplicaUnit(job_id=config.job_id, replica=0, generation=0, spec=SPEC, vmis=(vmi,))
    await backend.create(unit)
    home = backend.agent_folder(vmi)
    written = json.loads((home / "agent.json").read_text())
    copy = home / "hub-token"
    assert written["hub_token_file"] == str(copy) and copy.read_text() == "hf_first\n"
    assert "hf_first" not in (home / "agent.json").read_text()
    assert copy.stat().st_mode & 0o777 == 0o600
    assert copy.stat().st_uid == home.stat().st_uid  # the agent's (its own uid when isolated)
    assert written["model_cache_dir"] == str(cache)
    assert cache.stat().st_mode & 0o7777 == 0o1777  # agents of many users share it
    # The Secret removed: a restart leaves no stale copy, and says why in the log.
    (secrets_dir / "hf-token" / "token").unlink()
    await backend.restart(ReplicaUnit(job_id=config.job_id, replica=0, generation=1,
                                      spec=SPEC, vmis=(dataclasses.replace(
                                          vmi, agent=config.model_copy(
                                              update={"generation": 1})),)))
    assert not copy.exists()
    assert "local.hub_token_missing" in caplog.text and "hf-token" in caplog.text
    await backend.delete(unit)
    running.scope.cancel()
